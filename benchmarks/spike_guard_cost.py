"""What the spike guard costs a step (core/engine/guards/spike_guard.py), and what rollback's host copies hold.

    .venv/bin/python benchmarks/spike_guard_cost.py            # resnet_small and tiny_gpt, 8 rounds of 30 steps

Each round runs 30 steps with the guard off, 30 with skip and 30 with rollback, in a rotating order, on one trainer
(the change applied at a step boundary, as a key would): a round's figure for a mode is the median of its steps'
times, and a mode's cost is the median over rounds of its ratio to off in the same round. Skip's cost is the total
norm measured every step (clipping's kernels) and the host-side judgement; rollback's adds a host copy of the model
and optimizer every 10 steps. On a noisy machine the rounds spread wider than those costs: each part is also
measured alone. The norm, by a controlled trial of spike_guard=skip (``--trial-steps`` K an arm, the product's own
instrument: its arms measure the norm every step as the guard does, and do not judge); the copies' bytes and one
copy's time (median of 10, taken every 10 steps); a step's judgement and its values joining the window (both
measures, the mean of 2000: the window's statistics are refreshed every 5 values, so a mean, not a median).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORKLOADS = {"resnet_small": f"{ROOT / 'benchmarks' / 'resnet_small.py'}:workload", "tiny_gpt": "tiny_gpt"}
MODES = ("off", "skip", "rollback")


def measure(name: str, rounds: int, steps: int, trial_steps: int) -> None:
    from torchlab.core.engine.adapters.loading import load_workload
    from torchlab.core.engine.seeding import seed_everything
    from torchlab.core.engine.trainer import Trainer
    from torchlab.core.records.config import build_config
    from torchlab.core.wire.protocol import SetCommand

    spec = WORKLOADS[name]
    config = build_config({}, {"workload": spec, "steps": 10**9, "seed": 0, "checkpoint_every": 0, "eval_every": 0,
                               "memory_every": 0, "probe_every": 0, "options": {}, "at": []})
    seed_everything(config.seed)
    trainer = Trainer(config, load_workload(spec), samples_telemetry=False)
    trainer.train_steps(5)
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    for round_ in range(rounds):
        for mode in MODES[round_ % 3:] + MODES[: round_ % 3]:
            trainer.submit(SetCommand("spike_guard", mode, source="benchmark"))
            trainer.train_steps(1)  # the change's boundary, and a step to settle
            step_times = []
            for _ in range(steps):
                started = time.perf_counter()
                trainer.train_steps(1)
                step_times.append(time.perf_counter() - started)
            times[mode].append(statistics.median(step_times))
    off = times["off"]
    figures = []
    for mode in MODES[1:]:
        ratios = sorted(on / base for on, base in zip(times[mode], off))
        figures.append(f"{mode} {statistics.median(ratios):.3f}x ({ratios[0]:.3f}-{ratios[-1]:.3f})")
    guard = trainer.guard
    trainer.submit(SetCommand("spike_guard", "rollback", source="benchmark"))
    trainer.train_steps(2)
    copy_times = []
    for _ in range(10):
        started = time.perf_counter()
        guard._capture(trainer.step)
        copy_times.append(time.perf_counter() - started)
    from torchlab.core.analysis.trial_speed import speed_words
    from torchlab.core.wire.observer import TrainerObserver
    from torchlab.core.wire.protocol import TrialCommand, TrialResult

    results: list[TrialResult] = []

    class Results(TrainerObserver):
        def on_event(self, event) -> None:
            if isinstance(event, TrialResult):
                results.append(event)

    copies_bytes = guard.copies_bytes
    trainer.submit(SetCommand("spike_guard", "off", source="benchmark"))
    trainer.observers.append(Results())
    trainer.submit(TrialCommand("spike_guard", "skip", trial_steps, source="benchmark"))
    trainer.train_steps(1)
    [trial] = results
    detector = guard.detector
    started = time.perf_counter()
    for _ in range(2000):  # a step's judgement and its values joining the window (which refreshes its statistics)
        detector.judge(2.0, 1.0, nonfinite_is_spike=True)
        detector.accept(2.0, 1.0)
    judge_time = (time.perf_counter() - started) / 2000
    print(f"{name:12} step {1000 * statistics.median(off):.2f} ms off; {'; '.join(figures)}; the norm's trial "
          f"{speed_words(trial.speed)} over {trial.speed.steps} steps; copies "
          f"{copies_bytes / 2**20:.1f} MiB, one {1000 * statistics.median(copy_times):.2f} ms; judgement "
          f"{1e6 * judge_time:.1f} us", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--trial-steps", type=int, default=100)
    args = parser.parse_args()
    for name in args.workloads:
        measure(name, args.rounds, args.steps, args.trial_steps)


if __name__ == "__main__":
    main()
