"""What a controlled trial costs beyond its 2K steps: the state's copy, and the two times it is put back
(the arms' own steps are training steps like any). The goal (issue 14): at most a checkpoint's save and load.

    .venv/bin/python benchmarks/trial_cost.py                  # resnet_small and tiny_gpt, 20 repeats

Timed directly, medians: ``Checkpointer.snapshot``; putting it back (``restore`` of the model, optimizer,
schedule, GradScaler, RNG, data position and options, and the data stream reopened there, up to its first
batch, less a batch's usual wait), twice; against the trainer's checkpoint of the same state written, published and loaded
back into the model, optimizer and schedule. Timing the trial whole against 2K steps timed beside it
does not resolve this on a VM whose speed drifts by a third over seconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORKLOADS = {"resnet_small": f"{ROOT / 'benchmarks' / 'resnet_small.py'}:workload", "tiny_gpt": "tiny_gpt"}


def measure(name: str, rounds: int) -> None:
    from torchlab.core.engine.checkpoint import load_checkpoint, write_checkpoint
    from torchlab.core.engine.loading import load_workload
    from torchlab.core.engine.seeding import seed_everything
    from torchlab.core.engine.trainer import Trainer
    from torchlab.core.records.config import build_config

    spec = WORKLOADS[name]
    scratch = Path(tempfile.mkdtemp(prefix="trial-cost-"))
    config = build_config({}, {"workload": spec, "steps": 10**9, "probe_every": 0, "memory_every": 0, "checkpoint_every": 0,
                               "eval_every": 0, "options": {}, "at": []})
    seed_everything(config.seed)
    trainer = Trainer(config, load_workload(spec), observers=[], checkpoint_dir=scratch)
    trainer.train_steps(5)
    parts, checkpoints = trainer.parts, trainer.checkpoints

    def timed(call, repeat: int = rounds) -> float:
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            call()
            times.append(time.perf_counter() - started)
        return statistics.median(times)

    snapshot = checkpoints.snapshot()
    take = timed(checkpoints.snapshot)
    restore = timed(lambda: checkpoints.restore(snapshot))  # its data position too: the loader reopens at the next batch

    def reopen() -> None:
        parts.data.load_state_dict(snapshot["data"])
        parts.data.next_batch()

    batch = timed(trainer.data.next_batch)
    reopened = timed(reopen) - batch

    def checkpoint() -> None:
        state = {"model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict(),
                 "scheduler": trainer.scheduler.state_dict()}
        loaded = load_checkpoint(write_checkpoint(scratch, trainer.step, state, keep=2).publish())
        trainer.model.load_state_dict(loaded["model"])
        trainer.optimizer.load_state_dict(loaded["optimizer"])
        trainer.scheduler.load_state_dict(loaded["scheduler"])

    saved_and_loaded = timed(checkpoint)
    overhead = take + 2 * (restore + reopened)
    print(f"{name}: a trial's overhead {1000 * overhead:.1f} ms (copy {1000 * take:.1f}, put back 2 x ({1000 * restore:.1f} "
          f"+ data {1000 * reopened:.1f})); a checkpoint's save and load {1000 * saved_and_loaded:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), action="append")
    parser.add_argument("--rounds", type=int, default=20, help="repeats of each timing")
    args = parser.parse_args()
    for name in args.workload or sorted(WORKLOADS):
        measure(name, args.rounds)


if __name__ == "__main__":
    main()
