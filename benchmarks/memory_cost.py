"""What measuring memory by kind costs: a measured step against one that is not, and so the share of
training at the default cadence (``--memory-every auto``: a step about once a second).

    .venv/bin/python benchmarks/memory_cost.py                 # resnet_small and tiny_gpt, 40 rounds
    .venv/bin/python benchmarks/memory_cost.py --rounds 80 --workload tiny_gpt

Two engines on the same workload in one process, one measuring memory on every step and one never,
in alternating blocks of ``--block`` steps (a shuffled order each round) so the machine's drift hits
both alike; probes and periodic checkpoints off in both. The extra time of a measured step is the
difference of their medians per step; at ``auto`` that is paid once a second, so its share of the
training is that difference over a second (and at most the difference over the step, for steps
longer than a second, when every step is measured).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORKLOADS = {"resnet_small": f"{ROOT / 'benchmarks' / 'resnet_small.py'}:workload", "tiny_gpt": "tiny_gpt"}


def measure(name: str, rounds: int, block: int) -> None:
    from torchlab.core.engine.adapters.loading import load_workload
    from torchlab.core.engine.measure.memory import AUTO_MEMORY_INTERVAL_S
    from torchlab.core.engine.seeding import seed_everything
    from torchlab.core.engine.trainer import Trainer
    from torchlab.core.records.config import build_config
    from torchlab.core.wire.metrics_row import MetricsRow
    from torchlab.core.wire.observer import TrainerObserver

    class Last(TrainerObserver):
        row: MetricsRow | None = None

        def on_metrics(self, row: MetricsRow) -> None:
            self.row = row

    spec = WORKLOADS[name]
    scratch = Path(tempfile.mkdtemp(prefix="memory-cost-"))
    trainers, last = {}, Last()
    for variant, every in (("measured", 1), ("not measured", 0)):
        config = build_config({}, {"workload": spec, "steps": 10**9, "memory_every": every, "probe_every": 0,
                                   "checkpoint_every": 0, "eval_every": 0, "options": {}, "at": []})
        seed_everything(config.seed)
        trainers[variant] = Trainer(config, load_workload(spec), observers=[last] if every else [],
                                    checkpoint_dir=scratch / variant)
        trainers[variant].train_steps(5)
    memory = last.row.memory
    times: dict[str, list[float]] = {variant: [] for variant in trainers}
    order = list(trainers)
    for _ in range(rounds):
        random.shuffle(order)
        for variant in order:
            started = time.perf_counter()
            trainers[variant].train_steps(block)
            times[variant].append((time.perf_counter() - started) / block)
    measured, plain = statistics.median(times["measured"]), statistics.median(times["not measured"])
    extra = measured - plain
    share = extra / max(AUTO_MEMORY_INTERVAL_S, plain)
    print(f"{name}: {plain * 1e3:.2f} ms a step, {measured * 1e3:.2f} ms measured: +{extra * 1e3:.3f} ms "
          f"({100 * extra / plain:+.1f} % of a measured step); at auto, {100 * share:.3f} % of training. "
          f"Activations {memory.activations_bytes / 2**20:.1f} MiB in {len(memory.by_module)} modules.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), action="append")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--block", type=int, default=5)
    args = parser.parse_args()
    for name in args.workload or sorted(WORKLOADS):
        measure(name, args.rounds, args.block)


if __name__ == "__main__":
    main()
