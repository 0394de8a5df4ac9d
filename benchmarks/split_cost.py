"""What the live option ``split`` costs and saves: a controlled trial of split=2 and split=4 on the sample models,
the product's own instrument (interleaved arms on the same batches, timed until precise: docs/trials-and-impact.md).

    .venv/bin/python benchmarks/split_cost.py                 # resnet_small and tiny_gpt, K = 40, two tries each

Reported per trial: the speed ratio and its 90 % interval (the split arm's step time over the unsplit one's), and
the activations' and all tensors' bytes against the unsplit arm's (measured on one step of each arm). A split runs
the same samples as more, smaller kernels: its cost is their launch and dispatch overhead against a step's work.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORKLOADS = {"resnet_small": f"{ROOT / 'benchmarks' / 'resnet_small.py'}:workload", "tiny_gpt": "tiny_gpt"}


def tries(name: str, values: list[str], steps: int, repeats: int) -> None:
    from torchlab.core.analysis.trial_speed import speed_words
    from torchlab.core.engine.adapters.loading import load_workload
    from torchlab.core.engine.seeding import seed_everything
    from torchlab.core.engine.trainer import Trainer
    from torchlab.core.records.config import build_config
    from torchlab.core.wire.observer import TrainerObserver
    from torchlab.core.wire.protocol import TrialCommand, TrialResult

    results: list[TrialResult] = []

    class Results(TrainerObserver):
        def on_event(self, event) -> None:
            if isinstance(event, TrialResult):
                results.append(event)

    spec = WORKLOADS[name]
    config = build_config({}, {"workload": spec, "steps": 10**9, "seed": 0, "checkpoint_every": 0, "eval_every": 0,
                               "memory_every": 0, "options": {}, "at": []})
    seed_everything(config.seed)
    trainer = Trainer(config, load_workload(spec), observers=[Results()],
                      checkpoint_dir=Path(tempfile.mkdtemp(prefix="split-cost-")))
    trainer.train_steps(5)
    for value in values * repeats:
        started = time.perf_counter()
        trainer.submit(TrialCommand("split", value, steps, source="benchmark"))
        trainer.train_steps(1)
        result = results.pop()
        assert result.error is None, result.error
        split, whole = result.arms
        change = {kind: (getattr(split, kind) - getattr(whole, kind)) / getattr(whole, kind)
                  for kind in ("activations_bytes", "tensor_bytes")}
        speed = result.speed
        print(f"{name:12} split={value}: {speed_words(speed):36} over {speed.steps} steps, activations "
              f"{100 * change['activations_bytes']:+.0f} %, memory {100 * change['tensor_bytes']:+.0f} %, "
              f"{time.perf_counter() - started:.1f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--steps", type=int, default=40, help="K, the steps of each arm")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    for name in args.workloads:
        tries(name, ["2", "4"], args.steps, args.repeats)


if __name__ == "__main__":
    main()
