"""Learning-rate schedules as one ``LambdaLR`` each, so the scheduler's state is just its step count.

The live ``lr_scale`` option multiplies whatever the schedule gives; the trainer applies it after each
scheduler step. The factor functions are closures, which LambdaLR does not save: a resumed run
rebuilds them from its configuration.
"""

from __future__ import annotations

import math

import torch

from torchlab.core.config import TrainConfig

#: OneCycle, as in Smith & Topin and torch's OneCycleLR defaults: start at max/25, peak at 30 %, end at max/1e4.
ONECYCLE_START_DIVISOR = 25.0
ONECYCLE_FINAL_DIVISOR = 1e4
ONECYCLE_PEAK_FRACTION = 0.3


def lr_factor(schedule: str, step: int, total_steps: int, warmup_steps: int) -> float:
    """The multiplier of the base LR for the optimizer step after ``step`` completed steps."""
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))  # decays to 10 % of the base LR
    if schedule == "onecycle":
        peak = max(1, round(ONECYCLE_PEAK_FRACTION * total_steps))
        start, end = 1.0 / ONECYCLE_START_DIVISOR, 1.0 / (ONECYCLE_START_DIVISOR * ONECYCLE_FINAL_DIVISOR)
        if step < peak:
            return _cosine_between(start, 1.0, step / peak)
        return _cosine_between(1.0, end, min(1.0, (step - peak) / max(1, total_steps - peak)))
    raise ValueError(f"unknown schedule {schedule!r}")


def _cosine_between(begin: float, end: float, progress: float) -> float:
    return end + (begin - end) * 0.5 * (1.0 + math.cos(math.pi * progress))


def make_scheduler(optimizer: torch.optim.Optimizer, config: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    schedule, total, warmup = config.schedule, config.steps, config.resolved_warmup_steps
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(schedule, step, total, warmup))
