"""What telemetry and profiler snapshots cost the training they observe.

    .venv/bin/python benchmarks/telemetry_cost.py                 # tiny_gpt

1. The telemetry sampler: its own cost per sample (wall and CPU time of one ``sample()``), and the
   training throughput with the sampler running at 10 Hz against none, interleaved in blocks in one
   process. 10 Hz is ten times the default rate, so the cost rises above the machine's noise; the cost
   at the default 1 Hz is a tenth of it. Goal (issue 4): <= 0.5 % at the default rate.
2. A profiler snapshot: per-step time of the profiled steps against plain steps, the time the
   training thread spends stopping the profiler, the table build's time in the background, and the
   step time of the steps that run while the tables build (they share the GIL with the builder).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from torchlab.core.engine.adapters.loading import load_workload
from torchlab.core.engine.measure.profiler import ProfilerSnapshot
from torchlab.core.engine.seeding import seed_everything
from torchlab.core.engine.measure.telemetry import TelemetrySampler
from torchlab.core.engine.trainer import Trainer
from torchlab.core.records.config import build_config


def make_trainer(spec: str) -> Trainer:
    seed_everything(0)
    config = build_config({}, {"workload": spec, "steps": 10**9, "schedule": "constant", "eval_every": 0,
                               "checkpoint_every": 0, "probe_every": 1, "options": {}, "at": []})
    return Trainer(config, load_workload(spec), observers=[])


def timed_steps(trainer: Trainer, steps: int) -> float:
    started = time.perf_counter()
    trainer.train_steps(steps)
    return (time.perf_counter() - started) / steps


def sampler_cost(trainer: Trainer, rounds: int, block: int) -> None:
    sampler = TelemetrySampler(trainer.device, on_sample=lambda s: None, current_step=lambda: trainer.step)
    walls, cpus = [], []
    for _ in range(100):
        wall, cpu = time.perf_counter(), time.thread_time()
        sampler.sample()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.thread_time() - cpu)
    sampler.stop()
    print(f"one sample: wall {1000 * statistics.median(walls):.2f} ms, CPU {1000 * statistics.median(cpus):.2f} ms "
          f"(median of 100); at 1 Hz that is {100 * statistics.median(cpus):.3f} % of one core")

    trainer.train_steps(3)
    on, off = [], []
    for _ in range(rounds):
        order = [True, False]
        random.shuffle(order)
        for sampling in order:
            sampler = TelemetrySampler(trainer.device, on_sample=lambda s: None, current_step=lambda: trainer.step,
                                       interval_s=0.1) if sampling else None
            if sampler:
                sampler.start()
            (on if sampling else off).append(timed_steps(trainer, block))
            if sampler:
                sampler.stop()
    ratios = [o / s for o, s in zip(off, on)]
    ratio = statistics.median(ratios)
    print(f"throughput with the sampler at 10 Hz vs none: {ratio:.4f} (median of {rounds} rounds, IQR "
          f"{statistics.quantiles(ratios, n=4)[0]:.3f}–{statistics.quantiles(ratios, n=4)[2]:.3f}); "
          f"at the default 1 Hz: {1 - (1 - ratio) / 10:.4f}")


def snapshot_cost(trainer: Trainer, steps: int) -> None:
    trainer.train_steps(3)
    plain = [timed_steps(trainer, 1) for _ in range(10)]
    reports = []
    snapshot = ProfilerSnapshot(trainer.device, Path(tempfile.mkdtemp()), trainer.step + 1, steps, on_ready=reports.append)
    profiled, stop_s = [], 0.0
    while True:
        started = time.perf_counter()
        trainer.train_steps(1)
        step_s = time.perf_counter() - started
        started = time.perf_counter()
        done = snapshot.after_step(trainer.step)
        if done:
            stop_s = time.perf_counter() - started
            break
        profiled.append(step_s)
    during_build = []
    while not reports:
        during_build.append(timed_steps(trainer, 1))
    report = reports[0]
    print(f"plain step {1000 * statistics.median(plain):.1f} ms; profiled step {1000 * statistics.median(profiled[1:]):.1f} ms "
          f"(x{statistics.median(profiled[1:]) / statistics.median(plain):.2f}); stopping the profiler on the training "
          f"thread {1000 * stop_s:.0f} ms; tables built in the background in {report['build_s']:.2f} s, during which "
          f"{len(during_build)} steps ran at {1000 * statistics.median(during_build or [0]):.1f} ms median")
    sort = report["sort"]
    top = ", ".join(f"{row['name']} {row[sort] / 1000:.1f} ms" for row in report["rows"][:4])
    print(f"top rows by {sort}: {top}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="tiny_gpt")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--profile-steps", type=int, default=5)
    args = parser.parse_args()
    trainer = make_trainer(args.workload)
    print(f"workload {args.workload}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    sampler_cost(trainer, args.rounds, args.block)
    snapshot_cost(trainer, args.profile_steps)


if __name__ == "__main__":
    main()
