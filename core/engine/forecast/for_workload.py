"""A workload's memory forecast as the trainer would run it (its loss, its optimizer, its batches), and the settings
worth predicting beside the ones configured: what ``torchlab-tui plan`` lists."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.utils.data import DataLoader

from torchlab.core.engine.forecast.memory_forecast import MemoryForecast, MemoryPrediction, StepShape
from torchlab.core.engine.loss_output import LossFunction
from torchlab.core.engine.optimization import build_optimizer
from torchlab.core.options import LiveOptions
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

    template = build_optimizer(workload.model, config, workload)  # the run's own, on the model as built: no state yet
    return MemoryForecast(workload.model, loss.alone, lambda twin: optimizer_like(template, workload.model, twin),
                          draw_batch, device, workload.checkpoint_blocks)


def optimizer_like(template: torch.optim.Optimizer, model: torch.nn.Module, twin: torch.nn.Module) -> torch.optim.Optimizer:
    """``template``'s optimizer (its class, its groups and every hyperparameter of each) over ``twin``'s parameters,
    each in the place of ``model``'s of the same name. Not the workload's factory called again: a transformers
    Trainer's or a LightningModule's builds on the model it holds, never on the twin."""
    names = {id(parameter): name for name, parameter in model.named_parameters(remove_duplicate=False)}
    twins = dict(twin.named_parameters(remove_duplicate=False))
    groups = [{**{key: value for key, value in group.items() if key != "params"},
               "params": [twins[names[id(parameter)]] for parameter in group["params"]]} for group in template.param_groups]
    try:
        return type(template)(groups)  # each group holds every hyperparameter
    except TypeError:  # a class whose constructor requires one beyond its groups
        return type(template)(groups, **template.defaults)


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


def largest_batch(configured: StepShape, predicted: MemoryPrediction, doubled: MemoryPrediction,
                  limit: int) -> int | None:
    """The largest batch (all ranks', a whole batch for each) whose peak the line through two predictions (the
    configured batch and twice it, ``doubled``) puts at ``limit`` bytes or under; None where not one sample a rank
    would. A peak grows with the batch as its activations do, straight where nothing else depends on it: the plan
    predicts the batch found, to check it."""
    slope = (doubled.peak_bytes - predicted.peak_bytes) / configured.rank_batch  # doubled: one rank batch more
    if slope <= 0:
        return None
    per_rank = int((limit - (predicted.peak_bytes - slope * configured.rank_batch)) // slope)
    return per_rank * configured.world_size if per_rank >= 1 else None


def _described(change: dict[str, Any], configured: StepShape) -> str:
    """``amp=bf16, checkpointing=on``: the values that differ from ``configured``."""
    words = []
    for name, value in change.items():
        if getattr(configured, name) != value or (name == "parallel" and change.get("world_size", 1) > 1):
            words.append(f"{name}={'on' if value is True else 'off' if value is False else value}")
    return ", ".join(words)
