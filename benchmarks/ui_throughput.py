"""How much telemetry the app absorbs while staying responsive, and how fast a key is acknowledged.

    .venv/bin/python benchmarks/ui_throughput.py

1. Absorption: the real app (headless, 120x40) against ``firehose_worker``, a synthetic trainer that
   speaks the real protocol through the real socket at a set rate. For each rate: records per second
   the app folds into its state, and the event loop's lag (a 20 ms timer's lateness: what a key press
   would wait), p50/p99/max. Goal: >= 50k records/s with lag <= 50 ms.
2. Key to acknowledgement: the real app against a real trainer on a tiny model; ``c`` toggles
   checkpointing ten times, each timed from the key to the acknowledgement on screen, beside the
   median step time. Goal: within one optimizer step + 100 ms.
3. Start-up and memory: import-to-first-frame of the app in a fresh process (goal <= 0.5 s): the
   first frame written to the (headless) terminal, and "settled" when every start-up message is
   handled; and the app's RSS after absorbing the firehose (goal <= 120 MB).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from torchlab.core.wire.protocol import OptionApplied
from torchlab.tui.app import TorchlabApp, tune_garbage_collection
from torchlab.tui.link import ProcessLink

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "tests" / "workloads" / "tiny.py")
SIZE = (120, 40)


async def wait_until(pilot, condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await pilot.pause(0.01)


async def absorb(rate: float, seconds: float = 6.0) -> dict[str, float]:
    run_dir = Path(tempfile.mkdtemp()) / "run"
    app = TorchlabApp(lambda: ProcessLink(run_dir, ["--rate", str(rate)], worker_module="benchmarks.firehose_worker"))
    lags: list[float] = []
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.run_state.step > 0)
        expected = time.perf_counter()

        def tick() -> None:
            nonlocal expected
            now = time.perf_counter()
            lags.append(max(0.0, now - expected - 0.02))
            expected = now

        app.set_interval(0.02, tick)
        first_step, started = app.run_state.step, time.perf_counter()
        await pilot.pause(seconds)
        absorbed = (app.run_state.step - first_step) / (time.perf_counter() - started)
        rss = psutil.Process().memory_info().rss
        app.exit()
    lags.sort()
    return {
        "rate": rate, "absorbed": absorbed, "lag_p50_ms": 1000 * lags[len(lags) // 2],
        "lag_p99_ms": 1000 * lags[int(len(lags) * 0.99)], "lag_max_ms": 1000 * lags[-1], "rss_mb": rss / 2**20,
    }


async def key_to_acknowledgement(presses: int = 10) -> dict[str, float]:
    """From a key event entering the app to the trainer's acknowledgement being in the app's state.

    The state change and the redraw happen in the same 10 Hz refresh. (Pilot's ``press`` is not used:
    it waits for the screen to go idle, which a screen fed at 300 steps/s never quite does.)
    """
    run_dir = Path(tempfile.mkdtemp()) / "run"
    app = TorchlabApp(lambda: ProcessLink(run_dir, [f"{TINY}:workload", "--steps", "1000000", "--checkpoint-every", "0"]))
    acknowledged: list[float] = []
    original_apply_all = app.run_state.apply_all

    def apply_all(events) -> None:
        events = list(events)
        original_apply_all(events)
        if any(isinstance(event, OptionApplied) for event in events):
            acknowledged.append(time.perf_counter())

    app.run_state.apply_all = apply_all
    latencies = []
    async with app.run_test(size=SIZE) as pilot:
        state = app.run_state
        await wait_until(pilot, lambda: state.step > 5)
        for _ in range(presses):
            seen = len(acknowledged)
            pressed = time.perf_counter()
            app.simulate_key("c")
            await wait_until(pilot, lambda: len(acknowledged) > seen)
            latencies.append(acknowledged[-1] - pressed)
            await pilot.pause(0.2)
        step_time = statistics.median(state.step_time.thinned(10_000)[1][-200:])
        app.exit()
    return {"median_ms": 1000 * statistics.median(latencies), "max_ms": 1000 * max(latencies), "step_ms": 1000 * step_time}


FIRST_FRAME = """
import time
started = time.perf_counter()
import gc
gc.disable()  # as the CLI does until the app is built
import asyncio
from torchlab.tui.app import TorchlabApp, tune_garbage_collection
imported = time.perf_counter()
displayed = []

class Idle:
    run_dir = None
    log_path = None
    def start(self): pass
    def drain(self): return []
    def send(self, command): pass
    def close(self, *, detach=False): pass
    def restart(self, resume=True, options=None): pass

async def main():
    app = TorchlabApp(Idle())
    tune_garbage_collection()
    app.post_display_hook = lambda: displayed.append(time.perf_counter())  # after each frame is written
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        settled = time.perf_counter()
        import sys, psutil
        print(f"{imported - started:.3f} {displayed[0] - started:.3f} {settled - started:.3f} "
              f"{psutil.Process().memory_info().rss / 2**20:.1f} {'torch' in sys.modules}")

asyncio.run(main())
"""


def first_frame() -> tuple[float, float, float, float, bool]:
    """Median of 7 fresh processes: import, first frame written, every start-up message handled.

    Bytecode caching is allowed, as it is for anyone who ran the app once (one warm-up run first);
    a shell with PYTHONDONTWRITEBYTECODE would otherwise recompile the app's modules every time.
    """
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    runs = []
    for attempt in range(8):
        done = subprocess.run([sys.executable, "-c", FIRST_FRAME], capture_output=True, text=True, env=environment)
        if done.returncode != 0:
            raise RuntimeError(f"the first-frame probe failed:\n{done.stderr}")
        if attempt == 0:
            continue
        out = done.stdout.split()
        runs.append((float(out[0]), float(out[1]), float(out[2]), float(out[3]), out[4] == "True"))
    runs.sort(key=lambda r: r[1])
    return runs[len(runs) // 2]


def main() -> None:
    tune_garbage_collection()  # as the CLI does for the app's process
    print(f"python {sys.version.split()[0]}, {psutil.cpu_count()} CPUs")
    imported, framed, settled, rss, torch_loaded = first_frame()
    print(f"\nstart-up (median of 7): import {imported:.3f} s, first frame {framed:.3f} s, settled {settled:.3f} s, "
          f"RSS {rss:.0f} MB, torch imported: {torch_loaded}")

    print(f"\n{'offered rec/s':>14} {'absorbed rec/s':>15} {'lag p50':>9} {'lag p99':>9} {'lag max':>9} {'app RSS':>9}")
    for rate in (10_000, 50_000, 100_000, 0):
        result = asyncio.run(absorb(rate))
        offered = "max" if rate == 0 else f"{rate:,.0f}"
        print(f"{offered:>14} {result['absorbed']:>15,.0f} {result['lag_p50_ms']:>7.1f}ms {result['lag_p99_ms']:>7.1f}ms "
              f"{result['lag_max_ms']:>7.1f}ms {result['rss_mb']:>7.0f}MB")

    ack = asyncio.run(key_to_acknowledgement())
    print(f"\nkey 'c' to the acknowledgement in the app (10 presses): median {ack['median_ms']:.0f} ms, max {ack['max_ms']:.0f} ms; "
          f"median step {ack['step_ms']:.1f} ms (goal: step + 100 ms = {ack['step_ms'] + 100:.0f} ms)")


if __name__ == "__main__":
    main()
