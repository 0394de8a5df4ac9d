"""A workload's memory forecast as the trainer would run it (its loss, its optimizer, its batches), and the settings
worth predicting beside the ones configured: what ``torchlab-tui plan`` lists."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.utils.data import DataLoader

from torchlab.core.engine.forecast.memory_forecast import MemoryForecast, StepShape
from torchlab.core.engine.loss_output import LossFunction
from torchlab.core.engine.optimization import build_optimizer
from torchlab.core.records.config import TrainConfig
from torchlab.core.workload import Workload

#: The amp modes a candidate may switch to, in the order listed.
_AMP_MODES = ("off", "bf16", "fp16")


def workload_forecast(workload: Workload, config: TrainConfig, device: torch.device) -> MemoryForecast:
    """The forecast of ``workload``'s step under ``config``: its ``loss_fn`` checked as training checks it, the
    optimizer training would build, and batches drawn from its dataset in order (the first ``size`` samples)."""
    loss = LossFunction(workload, device, first_step=lambda: 1)

    def draw_batch(size: int) -> Any:
        loader = DataLoader(workload.dataset, batch_size=size, collate_fn=workload.collate_fn)
        return next(iter(loader))

    return MemoryForecast(workload.model, loss.alone, lambda model: build_optimizer(model, config, workload),
                          draw_batch, device, workload.checkpoint_blocks)


def configured_shape(config: TrainConfig, batch_size: int) -> StepShape:
    """The step ``config`` trains: its live options' values, its batch and ranks."""
    options = config.options
    return StepShape(amp=options.amp, checkpointing=options.checkpointing, split=options.split,
                     accum=options.accum, batch_size=batch_size, world_size=options.world_size,
                     parallel=options.parallel, reshard_after_forward=config.reshard_after_forward)


def candidate_shapes(configured: StepShape, gpus: int | None) -> list[tuple[str, StepShape]]:
    """What a user weighs before launching, each with the change that makes it from ``configured``: each other amp
    mode, checkpointing switched, the batch split in two, a batch twice as large, and on ``gpus`` ranks DDP and
    FSDP2 (where that is another world size), then every saving at once: the least memory these settings reach."""
    changes: list[dict[str, Any]] = [{"amp": mode} for mode in _AMP_MODES if mode != configured.amp]
    changes.append({"checkpointing": not configured.checkpointing})  # named blocks: off
    if configured.rank_batch >= 2 * configured.split:
        changes.append({"split": configured.split * 2})
    changes.append({"batch_size": configured.batch_size * 2})
    ranks = gpus if gpus is not None else configured.world_size
    if ranks > 1:
        changes += [{"world_size": ranks, "parallel": parallel} for parallel in ("ddp", "fsdp")]
    least = {"amp": "bf16", "checkpointing": True, **({"world_size": ranks, "parallel": "fsdp"} if ranks > 1 else {})}
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
