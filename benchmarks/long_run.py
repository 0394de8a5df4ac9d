"""A long run with the app attached: does the app's memory stay bounded and its redraw time flat?

    .venv/bin/python benchmarks/long_run.py                 # the firehose to 1M steps
    .venv/bin/python benchmarks/long_run.py --real 100000   # plus 100k steps of the tiny test model

1. The real app (headless, 120x40) against ``firehose_worker`` at full speed: at each checkpoint of
   the history (10k, 50k, 100k, ... steps) the app's RSS, the points its series keep, and the median
   of 10 redraws (the three charts drawn from scratch, and a full compositor frame).
2. With ``--real N``: the app against a real trainer on the tiny test model (tests/workloads/tiny.py,
   a few ms a step) for N steps, the same figures at the end, and the trainer's own RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

from torchlab.tui.app import TorchlabApp, tune_garbage_collection
from torchlab.tui.link import ProcessLink
from torchlab.tui.widgets.line_chart import LineChart

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "tests" / "workloads" / "tiny.py")
SIZE = (120, 40)


def redraw_ms(app) -> tuple[float, float]:
    charts = list(app.query(LineChart))
    chart_times, frame_times = [], []
    for _ in range(10):
        started = time.perf_counter()
        for chart in charts:
            chart._strips = None
            chart._draw(chart.size.width, chart.size.height)
        chart_times.append(time.perf_counter() - started)
        started = time.perf_counter()
        app.screen._compositor.render_update(full=True)
        frame_times.append(time.perf_counter() - started)
    return 1000 * statistics.median(chart_times), 1000 * statistics.median(frame_times)


def figures(app, label: str) -> str:
    state = app.run_state
    charts, frame = redraw_ms(app)
    kept = sum(len(series) for series in (state.loss, state.lr, state.samples_per_s, state.step_time, state.val_loss))
    rss = psutil.Process().memory_info().rss / 2**20
    return f"{label:>12} {state.step:>10,} {rss:>8.0f}MB {kept:>12,} {charts:>9.1f}ms {frame:>9.1f}ms"


async def firehose(checkpoints: list[int]) -> None:
    run_dir = Path(tempfile.mkdtemp()) / "run"
    app = TorchlabApp(lambda: ProcessLink(run_dir, ["--rate", "0"], worker_module="benchmarks.firehose_worker"))
    async with app.run_test(size=SIZE) as pilot:
        for target in checkpoints:
            while app.run_state.step < target:
                await pilot.pause(0.05)
            print(figures(app, "firehose"), flush=True)
        app.exit()


async def real(steps: int) -> None:
    run_dir = Path(tempfile.mkdtemp()) / "run"
    app = TorchlabApp(lambda: ProcessLink(run_dir, [f"{TINY}:workload", "--steps", str(steps), "--checkpoint-every", "0",
                                                 "--eval-every", "0"]))
    async with app.run_test(size=SIZE) as pilot:
        started = time.monotonic()
        checkpoints = [steps // 10, steps // 2, steps]
        for target in checkpoints:
            while app.run_state.step < target and app.run_state.state not in ("failed", "stopped"):
                await pilot.pause(0.2)
            print(figures(app, "tiny model"), flush=True)
        trainer = psutil.Process(app.link.pid)
        print(f"{steps:,} steps in {time.monotonic() - started:.0f} s; trainer RSS {trainer.memory_info().rss / 2**20:.0f} MB")
        app.exit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1_000_000, help="firehose history to reach")
    parser.add_argument("--real", type=int, default=0, metavar="N", help="also N steps of the tiny model")
    args = parser.parse_args()
    tune_garbage_collection()  # as the CLI does for the app's process
    print(f"python {sys.version.split()[0]}, {psutil.cpu_count()} CPUs, app at {SIZE[0]}x{SIZE[1]}")
    print(f"{'source':>12} {'step':>10} {'app RSS':>10} {'points kept':>12} {'charts':>11} {'frame':>11}")
    checkpoints = [n for n in (10_000, 50_000, 100_000, 200_000, 500_000, 1_000_000, 2_000_000) if n <= args.steps]
    asyncio.run(firehose(checkpoints))
    if args.real:
        asyncio.run(real(args.real))


if __name__ == "__main__":
    main()
