"""The OOM rescue's split rung, chosen by the memory forecast (core/engine/forecast/): of the splits below the one
that ran out of memory (twice it, four times, … down to pieces of one sample), the first whose step is predicted to
fit the memory this process can reach, instead of one rung at a time, each paid for with another failed attempt.

The step is predicted in this process, on a fake twin of the live model (no storage) and the batch that failed,
while training is stalled anyway; a prediction costs a forward and backward on fake tensors (about a second for a
12-block GPT). What the process can reach: on CUDA the device's free memory and what this process's tensors hold
now (the allocator's cache was emptied after the failure); on a CPU the RAM available and what training holds now.
A rung is taken where its peak is under ``FITS_SHARE`` of that, as ``torchlab-tui plan`` judges. Where no split is
predicted to fit, the last (pieces of one sample) is taken and the next failure goes on to checkpointing; where the
step cannot be predicted (an op fake tensors cannot run), the next split is taken as before. Either way the rung's
note says what was predicted. With ranks the supervisor steps down one rung at a time (its process holds no model).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import psutil
import torch

from torchlab.core.engine.forecast.capacity import FITS_SHARE
from torchlab.core.engine.measure.memory import held_bytes, out_of_memory
from torchlab.core.engine.parts import TrainingParts
from torchlab.core.errors import ForecastError
from torchlab.core.units import format_bytes

if TYPE_CHECKING:
    from torchlab.core.wire.payloads import MemoryPrediction


def split_predicted_to_fit(parts: TrainingParts, batch: Any, samples: int, first: int) -> tuple[int, str]:
    """The split to take (``first``, the ladder's next, or one further down), and what the forecast said of it."""
    # Imported here, at a failure: fake tensors and the memory trackers take seconds to import (FSDP2's, DTensor),
    # which every trainer's start would pay (tests/engine/test_compile.py holds the trainer's imports).
    from torchlab.core.engine.forecast.for_workload import optimizer_like
    from torchlab.core.engine.forecast.step_shape import configured_shape
    from torchlab.core.engine.forecast.memory_forecast import MemoryForecast

    splits = [first]
    while splits[-1] < samples:
        splits.append(min(2 * splits[-1], samples))
    model = parts.model.model
    configured = configured_shape(parts.options, samples, parts.config.reshard_after_forward)
    optimizer = parts.optimization.optimizer
    forecast = MemoryForecast(model, parts.loss.alone, lambda twin: optimizer_like(optimizer, model, twin),
                              lambda size: batch, parts.device, list(parts.model.checkpointing.blocks))
    room = reachable_memory(parts)
    over: list[str] = []
    for split in splits:
        try:
            prediction = forecast.predict(dataclasses.replace(configured, split=split))
        except ForecastError as cannot:
            return first, f"not predicted ({cannot})"
        except Exception as error:  # noqa: BLE001  # the model failed on fake tensors: said, the ladder as before
            if out_of_memory(error):  # raised by the model itself for this size (fake tensors allocate nothing)
                over.append(f"split = {split} out of memory")
                continue
            return first, f"not predicted: the forecast failed ({type(error).__name__}: {str(error)[:120]})"
        if _fits(prediction, room):
            return split, _said(over, prediction, room)
        over.append(f"split = {split} {format_bytes(prediction.peak_bytes)}")
    return splits[-1], f"none predicted to fit in the {format_bytes(room)} this process can reach ({', '.join(over)})"


def reachable_memory(parts: TrainingParts) -> int:
    """The bytes a step of this process can hold at its peak: what its tensors hold now and what is free for them."""
    if parts.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(parts.device)
        return free + torch.cuda.memory_allocated(parts.device)
    model_bytes, optimizer_bytes = held_bytes([*parts.model.model.parameters(), *parts.model.model.buffers()],
                                              parts.optimization.optimizer)
    return psutil.virtual_memory().available + model_bytes + optimizer_bytes


def _fits(prediction: MemoryPrediction, room: int) -> bool:
    return prediction.refused is None and prediction.peak_bytes <= FITS_SHARE * room


def _said(over: list[str], prediction: MemoryPrediction, room: int) -> str:
    """``predicted peak 5.2 GiB of the 7.9 GiB this process can reach``, after the splits passed over, where some
    were: ``split = 2 9.1 GiB, split = 4 7.3 GiB predicted over 90 % of …; this one 5.2 GiB``."""
    reach = f"the {format_bytes(room)} this process can reach"
    if not over:
        return f"predicted peak {format_bytes(prediction.peak_bytes)} of {reach}"
    return (f"{', '.join(over)} predicted over {round(FITS_SHARE * 100)} % of {reach}; this one "
            f"{format_bytes(prediction.peak_bytes)}")
