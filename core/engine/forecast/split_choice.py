"""Which split of a batch to take where a step ran out of memory: the first predicted to fit the memory a process
has, and what was predicted of it and of the splits passed over. The OOM rescue's one rule, in one process
(core/engine/guards/rescue_forecast.py, predicting on the live model's twin) and with ranks (their supervisor,
asking the run's forecaster process: forecaster.py)."""

from __future__ import annotations

from collections.abc import Callable

from torchlab.core.engine.forecast.capacity import FITS_SHARE
from torchlab.core.engine.measure.memory import out_of_memory
from torchlab.core.errors import ForecastError
from torchlab.core.units import format_bytes
from torchlab.core.wire.payloads import MemoryPrediction


def splits_from(first: int, samples: int) -> list[int]:
    """The ladder's splits from ``first`` on: twice it, four times, ... to pieces of one of ``samples``."""
    splits = [first]
    while splits[-1] < samples:
        splits.append(min(2 * splits[-1], samples))
    return splits


def first_split_to_fit(splits: list[int], predict: Callable[[int], MemoryPrediction], room: int,
                       whose: str) -> tuple[int, str]:
    """The first of ``splits`` whose step ``predict`` puts under ``FITS_SHARE`` of ``room`` (the memory one process
    has: ``whose`` says which), and what was predicted of it and of those passed over; the last where none is, the
    first where a split cannot be predicted (``ForecastError``, or the model failing on fake tensors)."""
    first, over = splits[0], []
    for split in splits:
        try:
            prediction = predict(split)
        except ForecastError as cannot:
            return first, f"not predicted ({cannot})"
        except Exception as error:  # noqa: BLE001  # the model failed on fake tensors: said, the ladder as before
            if out_of_memory(error):  # raised by the model itself for this size (fake tensors allocate nothing)
                over.append(f"split = {split} out of memory")
                continue
            return first, f"not predicted: the forecast failed ({type(error).__name__}: {str(error)[:120]})"
        if _fits(prediction, room):
            return split, _said(over, prediction, room, whose)
        over.append(f"split = {split} {format_bytes(prediction.peak_bytes)}")
    return splits[-1], f"none predicted to fit in the {format_bytes(room)} {whose} ({', '.join(over)})"


def _fits(prediction: MemoryPrediction, room: int) -> bool:
    return prediction.refused is None and prediction.peak_bytes <= FITS_SHARE * room


def _said(over: list[str], prediction: MemoryPrediction, room: int, whose: str) -> str:
    """``predicted peak 5.2 GiB of the 7.9 GiB this process can reach``, after the splits passed over, where some
    were: ``split = 2 9.1 GiB, split = 4 7.3 GiB predicted over 90 % of …; this one 5.2 GiB``."""
    reach = f"the {format_bytes(room)} {whose}"
    if not over:
        return f"predicted peak {format_bytes(prediction.peak_bytes)} of {reach}"
    return (f"{', '.join(over)} predicted over {round(FITS_SHARE * 100)} % of {reach}; this one "
            f"{format_bytes(prediction.peak_bytes)}")
