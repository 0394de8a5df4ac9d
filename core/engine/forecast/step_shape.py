"""The settings that decide a step's memory (``StepShape``: what a prediction is made for, and its key in the cache),
the step a run's options make, and the changes worth predicting beside it. No torch: the supervisor asks its
forecaster for these (forecaster.py) without importing what predicts them (fake tensors, the memory trackers)."""

from __future__ import annotations

import dataclasses
from typing import Any

from torchlab.core.options import LiveOptions

#: The amp modes a candidate may switch to, in the order listed.
_AMP_MODES = ("off", "bf16", "fp16")


@dataclasses.dataclass(frozen=True)
class StepShape:
    """The settings that decide a step's memory: what a prediction is made for, and its key in the cache.
    ``batch_size`` is all ranks' together, as ``--batch-size`` is."""

    amp: str = "off"
    checkpointing: bool | str = False  # the live option's value: every block, none, or the blocks named
    split: int = 1
    accum: int = 1
    batch_size: int = 32
    world_size: int = 1
    parallel: str = "ddp"
    reshard_after_forward: bool = True

    @property
    def sharded(self) -> bool:
        return self.parallel == "fsdp" and self.world_size > 1

    @property
    def rank_batch(self) -> int:
        return max(1, self.batch_size // self.world_size)

    def settings(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        if not self.sharded:
            del values["reshard_after_forward"]
        return values


def configured_shape(options: LiveOptions, batch_size: int, reshard_after_forward: bool) -> StepShape:
    """The step ``options`` train (a configuration's, or a live run's in force): their values, its batch and ranks."""
    return StepShape(amp=options.amp, checkpointing=options.checkpointing, split=options.split,
                     accum=options.accum, batch_size=batch_size, world_size=options.world_size,
                     parallel=options.parallel, reshard_after_forward=reshard_after_forward)


def candidate_shapes(configured: StepShape, gpus: int | None, batch_per_rank: bool = False) -> list[tuple[str, StepShape]]:
    """What a user weighs before launching, each with the change that makes it from ``configured``: each other amp
    mode, checkpointing switched, the batch split in two, a batch twice as large, and on ``gpus`` ranks DDP and
    FSDP2 (where that is another world size), then every saving at once: the least memory these settings reach.
    ``batch_per_rank``: the workload sets its batch for the ranks it runs on (a transformers Trainer's
    ``per_device_train_batch_size`` times them), so another world size keeps each rank's batch; else the batch is
    all ranks' together, as ``--batch-size`` is, and each rank takes its share."""
    changes: list[dict[str, Any]] = [{"amp": mode} for mode in _AMP_MODES if mode != configured.amp]
    changes.append({"checkpointing": not configured.checkpointing})  # named blocks: off
    if configured.rank_batch >= 2 * configured.split:
        changes.append({"split": configured.split * 2})
    changes.append({"batch_size": configured.batch_size * 2})
    ranks = gpus if gpus is not None else configured.world_size
    on_ranks: dict[str, Any] = {"world_size": ranks}
    if batch_per_rank:
        on_ranks["batch_size"] = configured.rank_batch * ranks
    if ranks > 1:
        changes += [{**on_ranks, "parallel": parallel} for parallel in ("ddp", "fsdp")]
    least = {"amp": "bf16", "checkpointing": True, **({**on_ranks, "parallel": "fsdp"} if ranks > 1 else {})}
    changes.append(least)
    listed = [("as configured", configured)]
    for change in changes:
        shape = dataclasses.replace(configured, **change)
        if shape not in [seen for _, seen in listed]:
            listed.append((_described(change, configured), shape))
    return listed


def _described(change: dict[str, Any], configured: StepShape) -> str:
    """``amp=bf16, checkpointing=on``: the values that differ from ``configured``."""
    words = []
    for name, value in change.items():
        if getattr(configured, name) != value or (name == "parallel" and change.get("world_size", 1) > 1):
            words.append(f"{name}={'on' if value is True else 'off' if value is False else value}")
    return ", ".join(words)
