"""A workload's memory forecast as the trainer would run it (its loss, its optimizer, its batches), and the settings
worth predicting beside the ones configured: what ``torchlab-tui plan`` lists."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

from torchlab.core.engine.forecast.memory_forecast import MemoryForecast
from torchlab.core.engine.forecast.step_shape import StepShape
from torchlab.core.engine.loss_output import LossFunction
from torchlab.core.engine.optimization import build_optimizer
from torchlab.core.records.config import TrainConfig
from torchlab.core.wire.payloads import MemoryPrediction
from torchlab.core.workload import Workload

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


