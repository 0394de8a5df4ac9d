"""What a controlled trial costs beyond its 2K steps: the state's copies and loads (the arms' own steps are
training steps like any). The goal (issue 14): at most a checkpoint's save and load.

    .venv/bin/python benchmarks/trial_cost.py                  # resnet_small and tiny_gpt, 20 repeats, K = 20

Timed directly, medians: ``Checkpointer.snapshot`` (a copy); putting a state back (``restore`` of the model,
optimizer, schedule, GradScaler, RNG, data position and options, and the data stream reopened there, up to its
first batch, less a batch's usual wait), with the copy ``restore`` makes of a state it will load again and
without it (``last_use``). A trial whose arms ran one after the other (before issue 29) copied the state once and
put it back twice, with copies. Interleaved (core/engine/trials.py), it copies the state once, then at each change
of arm (one per pair of blocks: K // BLOCK_STEPS) copies the arm it leaves and loads the other's (the first time
the trial's own snapshot, with a copy; after that without), and at the end loads the snapshot without a copy.
Against the trainer's checkpoint of the same state written, published and loaded back into the model, optimizer
and schedule. Timing the trial whole against 2K steps timed beside it does not resolve this on a VM whose speed
drifts by a third over seconds.
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


def measure(name: str, rounds: int, steps: int) -> None:
    from torchlab.core.engine.state.checkpoint import load_checkpoint, write_checkpoint
    from torchlab.core.engine.trials import BLOCK_STEPS
    from torchlab.core.engine.adapters.loading import load_workload
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
    copies = [checkpoints.snapshot() for _ in range(rounds)]
    load = timed(lambda: checkpoints.restore(copies.pop(), last_use=True))

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
    sequential = take + 2 * (restore + reopened)
    switches = max(1, steps // BLOCK_STEPS)
    interleaved = take + switches * take + restore + switches * load + (switches + 1) * reopened
    print(f"{name}: copy {1000 * take:.1f} ms, put back {1000 * restore:.1f} (without its copy {1000 * load:.1f}) + data "
          f"{1000 * reopened:.1f}; a trial's overhead, arms one after the other {1000 * sequential:.1f} ms, interleaved "
          f"(K = {steps}, {switches} changes of arm) {1000 * interleaved:.1f} ms; a checkpoint's save and load "
          f"{1000 * saved_and_loaded:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), action="append")
    parser.add_argument("--rounds", type=int, default=20, help="repeats of each timing")
    parser.add_argument("--steps", type=int, default=20, help="K, the steps an arm of the trial costed")
    args = parser.parse_args()
    for name in args.workload or sorted(WORKLOADS):
        measure(name, args.rounds, args.steps)


if __name__ == "__main__":
    main()
