"""What read-only viewers cost the run and the app that controls it (issue 16).

    .venv/bin/python benchmarks/viewer_cost.py [--presses 20] [--viewers 3]

The real app controls a real trainer on a tiny model (as ``ui_throughput.py``'s key-to-acknowledgement).
Viewers are clients of the trainer's socket that say a viewer's hello and read everything it sends, as the
app's link does, each on a thread of this process (a viewer's own drawing is its own process's cost, not the
run's). In alternating phases with 0 and with ``--viewers`` viewers connected:

1. key to acknowledgement: ``c`` pressed in the controlling app, timed until the trainer's acknowledgement
   is in its state (goal: unchanged within noise);
2. the trainer's pace: its median step time over the phase, from the metrics it reports (the overhead per
   viewer is the difference, divided by the viewers).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

from torchlab.core.wire.protocol import PROTOCOL_VERSION, Hello, OptionApplied
from torchlab.tui.app import TorchlabApp
from torchlab.tui.link import ProcessLink

ROOT = Path(__file__).resolve().parent.parent
TINY = f"{ROOT / 'tests' / 'workloads' / 'tiny.py'}:workload"
SIZE = (120, 40)


class Viewer:
    """A viewer's connection, read to the end on a thread of its own."""

    def __init__(self, link: ProcessLink) -> None:
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.socket.connect(str(link._endpoint.socket_path))
        self.socket.sendall(Hello(version=PROTOCOL_VERSION, token=link._endpoint.read_token(), view=True).encode())
        self.received = 0
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            while chunk := self.socket.recv(1 << 16):
                self.received += len(chunk)
        except OSError:  # closed under it by ``close``
            pass

    def close(self) -> None:
        self.socket.shutdown(socket.SHUT_RDWR)
        self._thread.join()
        self.socket.close()


async def wait_until(pilot, condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await pilot.pause(0.01)


async def measure(presses: int, viewer_count: int, phases: int) -> dict[int, dict[str, list[float]]]:
    run_dir = Path(tempfile.mkdtemp()) / "run"
    links: list[ProcessLink] = []
    app = TorchlabApp(lambda: links.append(ProcessLink(run_dir, [TINY, "--steps", "10000000", "--checkpoint-every", "0"])) or links[-1])
    acknowledged: list[float] = []
    original_apply_all = app.run_state.apply_all

    def apply_all(events) -> None:
        events = list(events)
        original_apply_all(events)
        if any(isinstance(event, OptionApplied) for event in events):
            acknowledged.append(time.perf_counter())

    app.run_state.apply_all = apply_all
    figures: dict[int, dict[str, list[float]]] = {0: {"ack_ms": [], "step_ms": []}, viewer_count: {"ack_ms": [], "step_ms": []}}
    async with app.run_test(size=SIZE) as pilot:
        state = app.run_state
        await wait_until(pilot, lambda: state.step > 20)
        for phase in range(phases):
            count = viewer_count if phase % 2 else 0
            viewers = [Viewer(links[-1]) for _ in range(count)]
            await pilot.pause(1.0)  # the viewers' history replayed, before timing
            first_step = state.step
            for _ in range(presses):
                seen = len(acknowledged)
                pressed = time.perf_counter()
                app.simulate_key("c")
                await wait_until(pilot, lambda: len(acknowledged) > seen)
                figures[count]["ack_ms"].append(1000 * (acknowledged[-1] - pressed))
                await pilot.pause(0.1)
            steps, times = state.step_time.thinned(100_000)
            figures[count]["step_ms"] += [1000 * t for s, t in zip(steps, times) if s > first_step]
            for viewer in viewers:
                assert viewer.received > 0, "a viewer got nothing"
                viewer.close()
        app.exit()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presses", type=int, default=10, help="key presses a phase (default 10)")
    parser.add_argument("--viewers", type=int, default=3, help="viewers in every other phase (default 3)")
    parser.add_argument("--phases", type=int, default=6, help="phases, alternating 0 and --viewers viewers (default 6)")
    args = parser.parse_args()
    figures = asyncio.run(measure(args.presses, args.viewers, args.phases))
    print(f"{'viewers':>8} {'key→ack median':>15} {'p90':>8} {'max':>8} {'step median':>12} {'steps':>7}")
    for count, measured in figures.items():
        ack, steps = sorted(measured["ack_ms"]), measured["step_ms"]
        print(f"{count:>8} {statistics.median(ack):>12.1f} ms {ack[int(0.9 * (len(ack) - 1))]:>5.1f} ms {ack[-1]:>5.1f} ms "
              f"{statistics.median(steps):>9.3f} ms {len(steps):>7}")
    base, viewed = (statistics.median(figures[count]["step_ms"]) for count in figures)
    print(f"per viewer: {(viewed - base) / args.viewers * 1000:+.1f} µs a step ({(viewed / base - 1) / args.viewers:+.2%} of a step)")


if __name__ == "__main__":
    main()
