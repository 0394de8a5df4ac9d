"""A batch cut into pieces along its first dimension, each with its share of the samples (live option ``split``).

The trainer runs a step's batch as ``split`` pieces one after another, each piece's loss weighted by its share of
the batch's samples before its backward, so the gradients add up to the whole batch's: the same samples and the
same gradient per optimizer step (to float rounding), where a loss is a mean over the batch's samples (the
default reduction), with a fraction of the activations' memory alive at once. A batch of 5 in two pieces is 3 and
2 samples, weighted 3/5 and 2/5: an odd batch stays exact. This is ``accum`` without a larger batch: the
optimizer step sees what it saw before, only the peak memory changes (Composer's
``device_train_microbatch_size``; what OOM rescue lowers first, issue 30). Statistics the model takes over its
batch (BatchNorm's) are the piece's, as under DDP they are each rank's.

What splits: a tensor (along dim 0), and tuples, lists, dicts and dataclasses of them, nested (a batch of the
user's own type: its fields cut, each piece made by ``dataclasses.replace``); a list of plain values, one a
sample (a batch's texts), is cut with them; other values (a number, a string) go to every piece as they are. Every
tensor with a first dimension must have the batch's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from torchlab.core.options import OptionChangeError


def batch_samples(batch: Any) -> int:
    """The samples in ``batch``: the first dimension its tensors share. OptionChangeError where it has no tensor with
    one, or two that disagree."""
    sizes = {tensor.shape[0] for tensor in batch_tensors(batch) if tensor.dim() > 0}
    if len(sizes) != 1:
        found = "no tensor with a first dimension" if not sizes else f"tensors of {sorted(sizes)} rows"
        raise OptionChangeError(f"a batch splits along the first dimension its tensors share; this run's has {found}")
    return sizes.pop()


def split_batch(batch: Any, pieces: int) -> list[tuple[Any, float]]:
    """``batch`` as ``pieces`` pieces (as even as can be: torch.tensor_split's), each with its share of the samples;
    a batch of fewer samples (an epoch's last) in as many pieces as it has. One piece, the batch itself, where
    ``pieces`` is 1. OptionChangeError where it has no first dimension to cut along."""
    if pieces == 1:
        return [(batch, 1.0)]
    samples = batch_samples(batch)
    pieces = min(pieces, samples)
    bounds = [samples * index // pieces for index in range(pieces + 1)]
    return [(_piece(batch, start, end, samples), (end - start) / samples) for start, end in zip(bounds, bounds[1:])]


def check_split(batch: Any, pieces: int) -> None:
    """OptionChangeError where a batch like ``batch`` cannot be cut into ``pieces``: no first dimension, or fewer
    samples."""
    samples = batch_samples(batch)
    if samples < pieces:
        raise OptionChangeError(f"a batch of {samples} sample{'s' if samples != 1 else ''} cannot be split in {pieces}: "
                            f"at most {samples} here")


def is_batch_dataclass(value: Any) -> bool:
    """A dataclass instance (a batch of the user's own type), not the class itself."""
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def replaced_fields(value: Any, change) -> Any:
    """A dataclass batch with each of its fields (those ``__init__`` takes) replaced by ``change`` of it."""
    return dataclasses.replace(value, **{field.name: change(getattr(value, field.name))
                                         for field in dataclasses.fields(value) if field.init})


def _piece(value: Any, start: int, end: int, samples: int) -> Any:
    if isinstance(value, torch.Tensor):
        return value[start:end] if value.dim() > 0 else value
    if is_batch_dataclass(value):
        return replaced_fields(value, lambda item: _piece(item, start, end, samples))
    if isinstance(value, Mapping):
        return type(value)({key: _piece(item, start, end, samples) for key, item in value.items()})
    if isinstance(value, (list, tuple)):
        if len(value) == samples and not any(isinstance(item, (torch.Tensor, Mapping, list, tuple)) for item in value):
            items = value[start:end]  # one plain value per sample (a batch's texts, its ids)
        else:
            items = [_piece(item, start, end, samples) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return value


def batch_tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor in ``value`` (a batch), in its order (a dict's as it holds them, a dataclass's by field)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if is_batch_dataclass(value):
        return [tensor for field in dataclasses.fields(value) for tensor in batch_tensors(getattr(value, field.name))]
    if isinstance(value, Mapping):
        return [tensor for item in value.values() for tensor in batch_tensors(item)]
    if isinstance(value, (list, tuple)):
        return [tensor for item in value for tensor in batch_tensors(item)]
    return []
