"""The real app on a real trainer on a GPU, driven by its keys, each screen saved (issue 17's screens stage).

What it does, in the app exactly as users get it (``TorchlabApp`` with a ``ProcessLink`` to a trainer process):
  1. waits for the gradient table, a telemetry sample and a memory breakdown: the main screen (NVML's GPU
     figures on its system line), then ``t``, the system panel at full size;
  2. amp: ``a`` to bf16, ``a`` to fp16, ``a`` to off, and ``a a`` to fp16 again, each waited for until
     the trainer acknowledges it (on a CPU, fp16 is refused, which is what it records there);
  3. back to amp off, a memory breakdown measured after that, ``M``; then ``c`` (activation checkpointing)
     and a breakdown measured after it, ``M`` again: the activation bytes and the allocator's peak, before
     and after;
  4. ``i``, the impact table; then ``q``, which stops the trainer after its final checkpoint.

Every screen is saved as SVG and as plain text under ``--out``, with ``summary.json``: the GPU as NVML
named it, its memory and utilisation, the steps each change took effect at, the memory figures before and
after checkpointing, and the run's directory (its ``events.jsonl``, ``metrics.jsonl``, ``impact.json``).

    python benchmarks/gpu_screens.py --device cuda --out /tmp/gpu-pass/screens
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import time
from pathlib import Path

from rich.console import Console

from torchlab.tui.app import TorchlabApp
from torchlab.tui.link import ProcessLink

SIZE = (160, 48)


class Session:
    """The app under a Pilot, and the screens it has saved."""

    def __init__(self, app, pilot, out: Path) -> None:
        self.app, self.pilot, self.out = app, pilot, out
        self.saved: list[str] = []

    @property
    def state(self):
        return self.app.run_state

    async def until(self, condition, what: str, timeout: float = 300.0) -> None:
        """Let the app run (its own timer drains the link) until ``condition()`` holds."""
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                await self.save("timed-out")
                raise SystemExit(f"gpu_screens.py: timed out after {timeout:.0f} s waiting for {what}")
            await self.pilot.pause(0.1)

    async def steps(self, count: int) -> None:
        target = self.state.step + count
        await self.until(lambda: self.state.step >= target, f"step {target}")

    async def save(self, name: str) -> None:
        """The screen as SVG and as text (the text through a recording console, as Textual's SVG export does)."""
        await self.pilot.pause()
        name = f"{len(self.saved) + 1:02d}-{name}"
        self.app.save_screenshot(filename=f"{name}.svg", path=str(self.out))
        console = Console(width=SIZE[0], height=SIZE[1], file=io.StringIO(), record=True, force_terminal=True)
        console.print(self.app.screen._compositor.render_update(full=True))  # what export_screenshot draws
        (self.out / f"{name}.txt").write_text(console.export_text())
        self.saved.append(name)
        print(f"  saved {name} (step {self.state.step})")

    async def set_amp(self, value: str) -> str:
        """Press ``a`` until amp is ``value`` or the trainer refuses a value; the outcome. A value refused
        earlier, or one the app knows this run cannot take, is not asked (the key skips it, as it does for a user)."""
        if self.state.was_refused("amp", value):
            return "not asked: refused earlier on this run"
        reason = self.state.would_refuse("amp", value)
        if reason is not None:  # the key skips a value the app knows this run cannot take (fp16 on a CPU)
            return f"skipped by the key: {reason}"
        for _ in range(3):
            before, refusals = self.state.options.get("amp"), len(self.state.refused)
            await self.pilot.press("a")
            # state.option() is the value asked for until the trainer answers; options, what it applied
            await self.until(lambda: "amp" not in self.state.pending, f"the trainer's answer to amp after {before}")
            if len(self.state.refused) > refusals:
                return f"refused: {sorted(self.state.refused)}"
            if self.state.options.get("amp") == value:
                return f"applied at step {self.state.step}"
        raise SystemExit(f"gpu_screens.py: amp never reached {value}")

    async def memory_after(self, step: int):
        await self.until(lambda: self.state.memory is not None and self.state.memory.step > step,
                         f"a memory breakdown measured after step {step}")
        return self.state.memory

    async def view(self, key: str, name: str) -> None:
        """Open a view by its key, save it, and close it."""
        screen = self.app.screen
        await self.pilot.press(key)
        await self.until(lambda: self.app.screen is not screen and self.app.screen.is_mounted, f"the {name} view")
        await self.pilot.pause(0.5)  # its first refresh
        await self.save(name)
        await self.pilot.press("escape")
        await self.until(lambda: self.app.screen is screen, f"the {name} view closed")


def breakdown(memory) -> dict:
    return {"step": memory.step, "activations_bytes": memory.activations_bytes,
            "allocator_peak_bytes": memory.allocator_peak_bytes, "parameters_bytes": memory.parameters_bytes,
            "optimizer_bytes": memory.optimizer_bytes, "top_modules": [[m.module, m.bytes] for m in memory.by_module[:5]]}


async def drive(args) -> dict:
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / "run"
    link = ProcessLink(run_dir, [args.workload, "--device", args.device, "--steps", "1000000",
                                 "--checkpoint-every", "0", "--memory-every", "5"])
    app = TorchlabApp(lambda: link, workload=args.workload)
    summary: dict = {"run_dir": str(run_dir), "workload": args.workload, "device": args.device}
    async with app.run_test(size=SIZE) as pilot:
        session = Session(app, pilot, out)
        state = session.state
        await session.until(lambda: state.step >= 10 and state.modules and state.telemetry is not None
                            and state.memory is not None, "the gradient table, telemetry and a memory breakdown")
        telemetry = state.telemetry
        summary["gpus"] = [vars(gpu) for gpu in telemetry.gpus]
        summary["gpu_status"] = telemetry.gpu_status
        summary["allocator"] = vars(telemetry.torch)
        print(f"telemetry: {telemetry.gpu_status or 'NVML'}; {summary['gpus']}")
        await session.save("main")
        await session.view("t", "system")

        amp = {}
        for value in ("bf16", "fp16"):
            amp[value] = await session.set_amp(value)
            await session.steps(20)
            await session.save(f"amp-{value}")
        amp["off"] = await session.set_amp("off")
        await session.steps(10)
        amp["fp16 again"] = await session.set_amp("fp16")
        await session.steps(20)
        await session.save("amp-fp16-again")
        if state.options.get("amp") != "off":
            amp["off before memory"] = await session.set_amp("off")
        summary["amp"] = amp
        print(f"amp: {amp}")

        before = await session.memory_after(state.step)
        await session.view("M", "memory-checkpointing-off")
        await pilot.press("c")
        await session.until(lambda: state.options.get("checkpointing") is True, "checkpointing acknowledged")
        after = await session.memory_after(state.step)
        await session.view("M", "memory-checkpointing-on")
        summary["memory"] = {"checkpointing off": breakdown(before), "checkpointing on": breakdown(after)}
        print(f"memory: {json.dumps(summary['memory'])}")

        await session.steps(30)
        await session.view("i", "impact")
        await pilot.press("q")
        await session.until(lambda: not app.is_running or state.state in ("stopped", "finished"), "the trainer stopped")
    summary["screens"] = session.saved
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="tiny_gpt")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=Path("/tmp/gpu-pass/screens"))
    args = parser.parse_args()
    summary = asyncio.run(drive(args))
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(f"gpu_screens.py: {len(summary['screens'])} screens and summary.json in {args.out}")


if __name__ == "__main__":
    main()
