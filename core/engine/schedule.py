"""Learning-rate schedules as one ``LambdaLR`` each, so the scheduler's state is just its step count.

The live ``lr_scale`` option multiplies whatever the schedule gives; the trainer applies it after each
scheduler step. The factor functions are closures, which LambdaLR does not save: a resumed run
rebuilds them from its configuration.

A resume that changes the number of steps (``--resume RUN --steps N``) re-plans what is left of the
decay instead of starting the schedule over: from the step it resumed at, the decay goes on from where
it was and reaches its end value at the new total. The LR is continuous at the boundary (the first step
after it uses exactly the LR a run that was never resumed would have used), warm-up and OneCycle's peak
stay where the original total put them, and a run extended after it finished continues at the
schedule's final LR (``--lr-scale`` raises it). Each such resume is kept in the configuration
(``schedule_extensions``), so a later resume rebuilds the same schedule.
"""

from __future__ import annotations

import math

import torch

from torchlab.core.records.config import TrainConfig

#: OneCycle, as in Smith & Topin and torch's OneCycleLR defaults: start at max/25, peak at 30 %, end at max/1e4.
ONECYCLE_START_DIVISOR = 25.0
ONECYCLE_FINAL_DIVISOR = 1e4
ONECYCLE_PEAK_FRACTION = 0.3


def lr_factor(
    schedule: str, step: int, total_steps: int, warmup_steps: int, extensions: tuple[tuple[int, int], ...] = (),
) -> float:
    """The multiplier of the base LR for the optimizer step after ``step`` completed steps.

    ``extensions``: (step resumed at, total before) for each resume that changed the total, oldest first.
    """
    if schedule == "constant":
        return 1.0
    first_total = extensions[0][1] if extensions else total_steps
    if schedule == "cosine":
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = _decay_progress(step, warmup_steps, first_total, total_steps, extensions)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))  # decays to 10 % of the base LR
    if schedule == "onecycle":
        peak = max(1, round(ONECYCLE_PEAK_FRACTION * first_total))
        start, end = 1.0 / ONECYCLE_START_DIVISOR, 1.0 / (ONECYCLE_START_DIVISOR * ONECYCLE_FINAL_DIVISOR)
        if step < peak:
            return _cosine_between(start, 1.0, step / peak)
        return _cosine_between(1.0, end, _decay_progress(step, peak, first_total, total_steps, extensions))
    raise ValueError(f"unknown schedule {schedule!r}")


def _decay_progress(
    step: int, decay_start: int, first_total: int, total_steps: int, extensions: tuple[tuple[int, int], ...],
) -> float:
    """How far the decay has gone (0 to 1) after ``step`` steps: linearly from ``decay_start`` to the first
    total; after each extension, from where it had got to at that step, linearly to 1 at the next total."""
    pieces: list[tuple[int, float, int]] = []  # (anchor step, progress there, total it decays to)

    def progress_at(at: int) -> float:
        progress = min(1.0, (at - decay_start) / max(1, first_total - decay_start))
        for anchor, progress_at_anchor, total in pieces:
            if at < anchor:
                break
            progress = min(1.0, progress_at_anchor + (1.0 - progress_at_anchor) * (at - anchor) / max(1, total - anchor))
        return progress

    totals_after = [total_before for _, total_before in extensions[1:]] + [total_steps]
    for (extended_at, _), total in zip(extensions, totals_after):
        anchor = max(extended_at, decay_start)  # an extension during warm-up or the rise leaves them as they were
        pieces.append((anchor, progress_at(anchor), total))
    return progress_at(step)


def _cosine_between(begin: float, end: float, progress: float) -> float:
    return end + (begin - end) * 0.5 * (1.0 + math.cos(math.pi * progress))


def make_scheduler(optimizer: torch.optim.Optimizer, config: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    schedule, total, warmup, extensions = config.schedule, config.steps, config.resolved_warmup_steps, config.schedule_extensions
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(schedule, step, total, warmup, extensions))
