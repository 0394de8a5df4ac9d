"""What ``compile`` (torch.compile, default mode) does to a step on a CPU, and what compiling costs.

    .venv/bin/python benchmarks/compile_cost.py                 # resnet_small and tiny_gpt, 20 rounds
    .venv/bin/python benchmarks/compile_cost.py --workload tiny_gpt --rounds 40

Two engines on the same workload in one process, one with ``compile`` on and one without, everything
else alike (probes, memory, periodic checkpoints and evaluation off), in alternating blocks of ``--block``
steps in a shuffled order each round, so the machine's drift hits both alike. Step times are the medians
of the blocks' per-step times; the speedup is the median over rounds of the uncompiled block's time over
the compiled one's, with its interquartile range.

The compile time is the trainer's own figure (the compile at the step boundary, ``option_applied``'s
detail): once on a cold cache (torch's caches go to a fresh directory, ``TORCHINDUCTOR_CACHE_DIR``, set
before torch is imported: the first compile of a model on a machine), and once more after
``torch._dynamo.reset()``, which drops the compiled graphs but keeps what inductor wrote to disk (the next
process, or a compile switched off and on after a reset). Also shown: the first compiled step's time,
which the impact table leaves out with the first steps after any change.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORKLOADS = {"resnet_small": f"{ROOT / 'benchmarks' / 'resnet_small.py'}:workload", "tiny_gpt": "tiny_gpt"}
_SECONDS = re.compile(r"compiled in (\d+(?:\.\d+)?) s")


def measure(name: str, rounds: int, block: int) -> None:
    import torch

    from torchlab.core.engine.adapters.loading import load_workload
    from torchlab.core.engine.seeding import seed_everything
    from torchlab.core.engine.trainer import Trainer
    from torchlab.core.wire import protocol as p
    from torchlab.core.records.config import build_config
    from torchlab.core.wire.observer import TrainerObserver

    class Answers(TrainerObserver):
        """The compile acknowledgements' seconds, and the refusals (a machine where it cannot compile)."""

        def __init__(self) -> None:
            self.compiled: list[float] = []

        def on_event(self, event: p.Message) -> None:
            if isinstance(event, p.OptionApplied) and (found := _SECONDS.search(event.detail)):
                self.compiled.append(float(found.group(1)))
            elif isinstance(event, p.OptionRefused):
                raise SystemExit(f"{name}: {event.option} refused: {event.reason}")

    spec = WORKLOADS[name]
    answers = Answers()
    trainers = {}
    for variant, compiled in (("compiled", True), ("uncompiled", False)):
        config = build_config({}, {"workload": spec, "steps": 10**9, "memory_every": 0, "probe_every": 0,
                                   "checkpoint_every": 0, "eval_every": 0, "options": {"compile": compiled}, "at": []})
        seed_everything(config.seed)
        trainers[variant] = Trainer(config, load_workload(spec), observers=[answers])
    trainers["uncompiled"].train_steps(5)
    trainers["compiled"].train_steps(1)  # compiles at its first boundary (timed by the trainer), then a step
    started = time.perf_counter()
    trainers["compiled"].train_steps(1)
    first_step = time.perf_counter() - started
    trainers["compiled"].train_steps(3)

    times: dict[str, list[float]] = {variant: [] for variant in trainers}
    order = list(trainers)
    for _ in range(rounds):
        random.shuffle(order)
        for variant in order:
            started = time.perf_counter()
            trainers[variant].train_steps(block)
            times[variant].append((time.perf_counter() - started) / block)

    torch._dynamo.reset()  # the graphs are gone, inductor's disk cache stays: compile again from it
    for value in ("off", "on"):
        trainers["compiled"].submit(p.SetCommand("compile", value, source="benchmark"))
        trainers["compiled"].train_steps(1)
    cold, warm = answers.compiled

    compiled, uncompiled = statistics.median(times["compiled"]), statistics.median(times["uncompiled"])
    ratios = sorted(u / c for u, c in zip(times["uncompiled"], times["compiled"]))
    low, _, high = statistics.quantiles(ratios, n=4)
    print(f"{name}: uncompiled {uncompiled * 1e3:.2f} ms a step, compiled {compiled * 1e3:.2f} ms: "
          f"{statistics.median(ratios):.2f}x (IQR {low:.2f}-{high:.2f}, {rounds} rounds of {block} steps each); "
          f"compile {cold:.1f} s on a cold cache, {warm:.1f} s from inductor's disk cache; "
          f"first compiled step {first_step * 1e3:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), action="append")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--block", type=int, default=5)
    args = parser.parse_args()
    # Before torch is imported: every cache torch.compile writes goes here, so the first compile is a cold one.
    caches = tempfile.mkdtemp(prefix="compile-cost-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = caches
    try:
        import torch

        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs")
        for name in args.workload or sorted(WORKLOADS):
            measure(name, args.rounds, args.block)
    finally:
        shutil.rmtree(caches, ignore_errors=True)


if __name__ == "__main__":
    main()
