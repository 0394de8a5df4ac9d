"""Which rung of the OOM rescue's ladder to take where a step ran out of memory: of the splits below (or, with the
batch split to single samples, the checkpointing rungs), the first predicted to fit the memory a process has, and
what was predicted of it and of those passed over. The rescue's one rule, in one process
(core/engine/guards/rescue_forecast.py, predicting on the live model's twin) and with ranks (their supervisor,
asking the run's forecaster process: forecaster.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchlab.core.engine.forecast.capacity import FITS_SHARE
from torchlab.core.engine.measure.memory import out_of_memory
from torchlab.core.errors import ForecastError
from torchlab.core.options import LiveOption
from torchlab.core.units import format_bytes
from torchlab.core.wire.payloads import MemoryPrediction


def splits_from(first: int, samples: int) -> list[int]:
    """The ladder's splits from ``first`` on: twice it, four times, ... to pieces of one of ``samples``."""
    splits = [first]
    while splits[-1] < samples:
        splits.append(min(2 * splits[-1], samples))
    return splits


def first_rung_to_fit(option: LiveOption, values: list[Any], predict: Callable[[Any], MemoryPrediction], room: int,
                      whose: str) -> tuple[Any, str]:
    """The first of ``option``'s rungs, ``values``, whose step ``predict`` puts under ``FITS_SHARE`` of ``room`` (the
    memory one process has: ``whose`` says which), and what was predicted of it and of those passed over; the last
    where none is, the first where one cannot be predicted (``ForecastError``, or the model failing on fake tensors)."""
    first, over = values[0], []
    for value in values:
        rung = f"{option.name} = {option.brief(value)}"
        try:
            prediction = predict(value)
        except ForecastError as cannot:
            return first, f"not predicted ({cannot})"
        except Exception as error:  # noqa: BLE001  # the model failed on fake tensors: said, the ladder as before
            if out_of_memory(error):  # raised by the model itself for this size (fake tensors allocate nothing)
                over.append(f"{rung} (the model ran out of memory on fake tensors)")
                continue
            return first, f"not predicted: the forecast failed ({type(error).__name__}: {str(error)[:120]})"
        if _fits(prediction, room):
            return value, _said(over, prediction, room, whose)
        over.append(f"{rung} ({format_bytes(prediction.peak_bytes)}, over {round(FITS_SHARE * 100)} %)")
    return values[-1], f"none predicted to fit in the {format_bytes(room)} {whose}: {', '.join(over)}"


def _fits(prediction: MemoryPrediction, room: int) -> bool:
    return prediction.refused is None and prediction.peak_bytes <= FITS_SHARE * room


def _said(over: list[str], prediction: MemoryPrediction, room: int, whose: str) -> str:
    """``predicted peak 5.2 GiB of the 7.9 GiB this process can reach``, and the rungs passed over, where some were:
    ``; passed over: split = 2 (9.1 GiB), split = 4 (7.3 GiB)``."""
    said = f"predicted peak {format_bytes(prediction.peak_bytes)} of the {format_bytes(room)} {whose}"
    return f"{said}; passed over: {', '.join(over)}" if over else said
