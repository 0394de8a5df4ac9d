"""How much a trial's speed verdict can be trusted on a busy machine: its power, and how often noise alone names a
direction (issue 29).

    .venv/bin/python benchmarks/trial_power.py                        # the goals' tries, 40 A/A tries, K = 20
    .venv/bin/python benchmarks/trial_power.py --tries 6 --aa 60 --steps 20 --no-load
    python3 benchmarks/trial_power.py --device cuda --aa 20             # on a GPU (benchmarks/gpu_pass.sh trials)

Trials run in this process on a real trainer (``benchmarks/resnet_small.py``, the small residual CNN of
``loop_cost.py``), as ``--trial`` runs them, while a child process loads the machine with a drifting load: one
core busy in bursts of 0.4-2.5 s with idle gaps as long, drawn at random (``busy_bursts``). Reported:

  (a) ``checkpointing=on`` (truly ~1.5x slower here) and ``clip=1.0`` (a few per cent), ``--tries`` each.
      Goals: checkpointing judged slower with the whole interval above 1.03x, and clip "no clear difference"
      with the interval inside 0.9-1.1x, each in at least 5 of 6. What clip truly costs moves with the machine
      (3-8 % of a step here: ~40 small kernels on a ~10 ms step), so the run first measures it, and again at the
      end: a trial of K = 200 (the reference), and says how many clip intervals held it.
  (b) A/A trials (``lr_scale=1.0`` on a run at 1.0: both arms the same code on the same batches): how often one
      names a direction (the false-direction rate), with a one-sided 95 % upper bound (Clopper-Pearson).
  (c) The minimum detectable difference at K steps: the A/A trials' interval ends say how far from 1 noise alone
      takes the interval. A true ratio r moves the whole interval by r (the noise is a ratio too), so a trial
      calls it slower 9 times in 10 from r = 1.03 / (the 10th percentile of the A/A lows), faster from
      r = 0.97 / (the 90th percentile of the A/A highs). The medians give the ratio judged half the time.

Between tries the run trains 3 steps, so that each trial starts from another state.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SPEC = f"{ROOT / 'benchmarks' / 'resnet_small.py'}:workload"

#: The load's child: one core spinning in bursts of 0.4-2.5 s, idle as long between them, drawn from its seed.
LOAD = """
import random, sys, time
draw = random.Random(int(sys.argv[1]))
while True:
    until = time.monotonic() + draw.uniform(0.4, 2.5)
    while time.monotonic() < until:
        pass
    time.sleep(draw.uniform(0.4, 2.5))
"""


def busy_bursts(seed: int, pid_file: Path) -> int:
    """The drifting load (``LOAD``): started through a shell that exits at once, so that it is no descendant of this
    process and the trial's meter of other processes' CPU (``others_cpu_percent``) counts it, as a neighbour's job.
    Its pid, to stop it."""
    subprocess.run(["sh", "-c", '"$0" -c "$1" "$2" & echo $! > "$3"', sys.executable, LOAD, str(seed), str(pid_file)],
                   check=True)
    return int(pid_file.read_text())


class TrialRunner:
    """A trainer on ``spec`` (``resnet_small`` unless ``--workload`` says) that runs one trial at a time and hands
    back its result."""

    def __init__(self, seed: int, device: str, spec: str = SPEC) -> None:
        from torchlab.core.engine.adapters.loading import load_workload
        from torchlab.core.engine.seeding import seed_everything
        from torchlab.core.engine.trainer import Trainer
        from torchlab.core.records.config import build_config
        from torchlab.core.wire.observer import TrainerObserver
        from torchlab.core.wire.protocol import TrialResult

        results: list[TrialResult] = []

        class Results(TrainerObserver):
            def on_event(self, event) -> None:
                if isinstance(event, TrialResult):
                    results.append(event)

        config = build_config({}, {"workload": spec, "steps": 10**9, "seed": seed, "checkpoint_every": 0,
                                   "eval_every": 0, "memory_every": 0, "options": {}, "at": [], "device": device})
        seed_everything(config.seed)
        self.trainer = Trainer(config, load_workload(spec), observers=[Results()],
                               checkpoint_dir=Path(tempfile.mkdtemp(prefix="trial-power-")))
        self.results = results
        self.trainer.train_steps(10)  # warm: the first steps pay one-off costs

    def trial(self, option: str, value: str, steps: int):
        from torchlab.core.wire.protocol import TrialCommand

        self.trainer.submit(TrialCommand(option, value, steps, source="benchmark"))
        started = time.perf_counter()
        self.trainer.train_steps(1)  # the boundary runs the trial, then one step
        elapsed = time.perf_counter() - started
        self.trainer.train_steps(3)
        result = self.results.pop()
        assert result.error is None and result.speed is not None, result
        return result, elapsed


def clopper_pearson_upper(failures: int, tries: int, confidence: float = 0.95) -> float:
    """The one-sided upper bound of a binomial rate, exact (bisection on the binomial tail)."""
    if failures >= tries:
        return 1.0

    def tail(rate: float) -> float:  # P(X <= failures) at this rate
        return sum(math.comb(tries, k) * rate**k * (1 - rate) ** (tries - k) for k in range(failures + 1))

    low, high = failures / tries, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if tail(middle) > 1 - confidence else (low, middle)
    return high


def quantile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * (len(ordered) - 1))))]


def show(label: str, result, elapsed: float) -> str:
    from torchlab.core.analysis.trial_speed import speed_words

    speed, others = result.speed, result.arms[0].others_cpu_percent
    load = "?" if others is None else f"{others:.0f} %"
    return (f"  {label:18} {speed_words(speed):36} ratio {speed.ratio:.3f} [{speed.low:.3f}, {speed.high:.3f}] "
            f"{speed.pairs} pairs over {speed.steps} steps, others' CPU {load}, {elapsed:.2f} s")


def reference(runner: TrialRunner) -> float:
    """What clip=1.0 costs on this machine now: a trial of K = 200 (100 pairs, ten times a trial of K = 20's), the
    ratio printed and returned."""
    result, elapsed = runner.trial("clip", "1.0", 200)
    print(show("clip=1.0 reference", result, elapsed), flush=True)
    return result.speed.ratio


def trials_block() -> int:
    from torchlab.core.engine import trials

    return trials.BLOCK_STEPS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tries", type=int, default=6, help="tries of each goal's trial (a)")
    parser.add_argument("--aa", type=int, default=40, help="A/A trials (b, c)")
    parser.add_argument("--steps", type=int, default=20, help="K: steps an arm")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--block", type=int, help="steps in a block of an arm (the engine's BLOCK_STEPS if not said)")
    parser.add_argument("--width", type=float, help="how narrow an interval stops the timing (high / low; the engine's "
                        "PRECISE_WIDTH if not said)")
    parser.add_argument("--only-aa", action="store_true", help="the A/A trials alone")
    parser.add_argument("--no-load", action="store_true", help="no injected load (the machine as it is)")
    parser.add_argument("--device", default="cpu", help="where the trials train (cuda: the GPU pass)")
    parser.add_argument("--workload", default=SPEC, help="what the trials train: a built-in sample (mlp, convnet, "
                        "tiny_gpt) or file.py:factory (default: benchmarks/resnet_small.py)")
    args = parser.parse_args()

    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {Path(args.workload.split(':')[0]).stem} on {args.device}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f} before, "
          f"K = {args.steps}, {'no injected load' if args.no_load else 'one core busy in 0.4-2.5 s bursts'}")
    load = None if args.no_load else busy_bursts(args.seed, Path(tempfile.mkdtemp(prefix="trial-power-")) / "load.pid")
    try:
        if args.width is not None:
            from torchlab.core.analysis import trial_speed

            trial_speed.PRECISE_WIDTH = args.width
        if args.block is not None:
            from torchlab.core.engine import trials

            trials.BLOCK_STEPS = args.block
        runner = TrialRunner(args.seed, args.device, args.workload)
        references = [] if args.only_aa else [reference(runner)]
        schedule = [] if args.only_aa else [("checkpointing", "on"), ("clip", "1.0")] * args.tries
        random.Random(args.seed).shuffle(schedule)
        outcomes: dict[str, list] = {"checkpointing=on": [], "clip=1.0": []}
        for option, value in schedule:
            result, elapsed = runner.trial(option, value, args.steps)
            outcomes[f"{option}={value}"].append(result.speed)
            print(show(f"{option}={value}", result, elapsed), flush=True)
        if not args.only_aa:
            references.append(reference(runner))
        aa = []
        for _ in range(args.aa):
            result, elapsed = runner.trial("lr_scale", "1.0", args.steps)
            aa.append(result.speed)
            print(show("A/A lr_scale=1.0", result, elapsed), flush=True)
    finally:
        if load is not None:
            os.kill(load, signal.SIGKILL)

    from torchlab.core.analysis.trial_speed import PRECISE_WIDTH

    print(f"(block of {trials_block()} steps, timed on until the interval is within {PRECISE_WIDTH}x end to end)")
    if not args.only_aa:
        goals(args.tries, outcomes, references)
    if aa:
        aa_figures(aa, args.steps)


def goals(tries: int, outcomes: dict[str, list], references: list[float]) -> None:
    """(a): the goals' tries, and whether clip's intervals held its reference ratio."""
    slower = sum(speed.verdict == "slower" and speed.low > 1.03 for speed in outcomes["checkpointing=on"])
    clear = sum(speed.verdict == "no clear difference" and speed.low >= 0.9 and speed.high <= 1.1
                for speed in outcomes["clip=1.0"])
    print(f"(a) checkpointing=on judged slower, interval above 1.03x: {slower} of {tries} (goal >= 5 of 6); "
          f"ratios {', '.join(f'{s.ratio:.2f}' for s in outcomes['checkpointing=on'])}")
    print(f"    clip=1.0 no clear difference, interval inside 0.9-1.1x: {clear} of {tries} (goal >= 5 of 6); "
          f"intervals {', '.join(f'{s.low:.2f}-{s.high:.2f}' for s in outcomes['clip=1.0'])}")
    if references:
        low, high = min(references), max(references)
        held = sum(speed.low <= high and low <= speed.high for speed in outcomes["clip=1.0"])
        print(f"    clip=1.0's reference ratio (K = 200) {references[0]:.3f} before / after {references[-1]:.3f}: "
              f"held by {held} of {tries} intervals")


def aa_figures(aa: list, steps: int) -> None:
    """(b) and (c): the A/A trials' false directions and coverage, and the minimum detectable difference their
    intervals give (a true ratio r moves an interval of log ratios by r)."""
    wrong = sum(speed.verdict != "no clear difference" for speed in aa)
    covered = sum(speed.low <= 1 <= speed.high for speed in aa)
    print(f"(b) A/A: a direction named in {wrong} of {len(aa)} ({100 * wrong / len(aa):.1f} %; at most "
          f"{100 * clopper_pearson_upper(wrong, len(aa)):.1f} % at 95 % confidence); the interval held 1.00 in "
          f"{covered} of {len(aa)}")
    lows, highs = [speed.low for speed in aa], [speed.high for speed in aa]
    print(f"(c) A/A interval: low median {statistics.median(lows):.3f}, 10th percentile {quantile(lows, 0.1):.3f}; "
          f"high median {statistics.median(highs):.3f}, 90th percentile {quantile(highs, 0.9):.3f}")
    print(f"    minimum detectable difference at K = {steps}: slower from {1.03 / quantile(lows, 0.1):.3f}x "
          f"(9 in 10; half the time from {1.03 / statistics.median(lows):.3f}x), faster from "
          f"{1 / (0.97 / quantile(highs, 0.9)):.3f}x faster (9 in 10)")


if __name__ == "__main__":
    main()
