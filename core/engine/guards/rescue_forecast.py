"""The OOM rescue's rung, chosen by the memory forecast (core/engine/forecast/): of the splits below the one that ran
out of memory (twice it, four times, … down to pieces of one sample), then of the checkpointing rungs (a quarter of
the blocks, half, all), the first whose step is predicted to fit the memory this process can reach, instead of one
rung at a time, each paid for with another failed attempt.

The step is predicted in this process, on a fake twin of the live model (no storage) and the batch that failed,
while training is stalled anyway; a prediction costs a forward and backward on fake tensors (about a second for a
12-block GPT). What the process can reach: on CUDA the device's free memory and what this process's tensors hold
now (the allocator's cache was emptied after the failure); on a CPU the RAM available and what training holds now.
A rung is taken where its peak is under ``FITS_SHARE`` of that, as ``torchlab-tui plan`` judges. Where no split is
predicted to fit, the last (pieces of one sample) is taken and the next failure goes on to checkpointing, predicted
likewise; where the step cannot be predicted (an op fake tensors cannot run), the next rung is taken as before.
Either way the rung's note says what was predicted (the choice is core/engine/forecast/rung_choice.py's, with ranks
too: their supervisor asks the run's forecaster process for the splits, having no model of its own).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import psutil
import torch

from torchlab.core.engine.measure.memory import held_bytes
from torchlab.core.engine.parts import TrainingParts
from torchlab.core.options import LiveOption


def rung_predicted_to_fit(parts: TrainingParts, batch: Any, samples: int | None, option: LiveOption,
                          values: list[Any]) -> tuple[Any, str]:
    """Of ``option``'s rungs ``values`` (the ladder's next first), the one to take, and what the forecast said of it:
    the first predicted to fit, or one further down (``rung_choice.first_rung_to_fit``)."""
    # Imported here, at a failure: fake tensors and the memory trackers take seconds to import (FSDP2's, DTensor),
    # which every trainer's start would pay (tests/engine/test_compile.py holds the trainer's imports).
    from torchlab.core.engine.forecast.for_workload import optimizer_like
    from torchlab.core.engine.forecast.memory_forecast import MemoryForecast
    from torchlab.core.engine.forecast.rung_choice import first_rung_to_fit
    from torchlab.core.engine.forecast.step_shape import configured_shape

    model = parts.model.model
    configured = configured_shape(parts.options, samples or 1, parts.config.reshard_after_forward)
    optimizer = parts.optimization.optimizer
    forecast = MemoryForecast(model, parts.loss.alone, lambda twin: optimizer_like(optimizer, model, twin),
                              lambda size: batch, parts.device, list(parts.model.checkpointing.blocks))
    return first_rung_to_fit(option, values,
                             lambda value: forecast.predict(dataclasses.replace(configured, **{option.name: value})),
                             reachable_memory(parts), "this process can reach")


def reachable_memory(parts: TrainingParts) -> int:
    """The bytes a step of this process can hold at its peak: what its tensors hold now and what is free for them."""
    if parts.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(parts.device)
        return free + torch.cuda.memory_allocated(parts.device)
    model_bytes, optimizer_bytes = held_bytes([*parts.model.model.parameters(), *parts.model.model.buffers()],
                                              parts.optimization.optimizer)
    return psutil.virtual_memory().available + model_bytes + optimizer_bytes


