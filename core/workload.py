"""The workload contract: what a user hands to torchlab. Public API; keep it stable.

A workload file defines a zero-argument factory that returns a ``Workload``::

    from torchlab.core.workload import Workload

    def workload() -> Workload:
        return Workload(model=MyNet(), dataset=my_dataset, loss_fn=lambda model, batch: ...)

The factory runs in the trainer process only, after seeding, so model initialisation is reproducible.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset

from torchlab.core.wire.errors import WorkloadError

LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]


@dataclass(kw_only=True)
class Workload:
    """A model, its data, and how to compute a scalar loss from one batch.

    ``checkpoint_blocks`` names the submodules that activation checkpointing wraps (qualified names,
    as in ``model.named_modules()``); left as None, they are the children of the largest
    ``ModuleList``/``Sequential`` in the model.
    """

    model: torch.nn.Module
    dataset: Dataset
    loss_fn: LossFn
    val_dataset: Dataset | None = None
    collate_fn: Callable[[list], Any] | None = None
    batch_size: int | None = None
    checkpoint_blocks: Sequence[str] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, torch.nn.Module):
            raise WorkloadError(
                f"Workload.model must be a torch.nn.Module, got {type(self.model).__name__}."
            )
        for field_name in ("dataset", "val_dataset"):
            data = getattr(self, field_name)
            if data is None and field_name == "val_dataset":
                continue
            if not _is_dataset(data):
                raise WorkloadError(
                    f"Workload.{field_name} must be a torch Dataset (map-style with __getitem__ and "
                    f"__len__, or an IterableDataset), got {type(data).__name__}."
                )
        if not callable(self.loss_fn):
            raise WorkloadError("Workload.loss_fn must be callable as loss_fn(model, batch) -> scalar tensor.")
        if self.collate_fn is not None and not callable(self.collate_fn):
            raise WorkloadError("Workload.collate_fn must be callable or None.")
        if self.batch_size is not None and (
            isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1
        ):
            raise WorkloadError(f"Workload.batch_size must be a positive integer, got {self.batch_size!r}.")
        if self.checkpoint_blocks is not None:
            if isinstance(self.checkpoint_blocks, str) or not all(
                isinstance(name, str) for name in self.checkpoint_blocks
            ):
                raise WorkloadError(
                    "Workload.checkpoint_blocks must be a list of qualified module names, "
                    "e.g. ['blocks.0', 'blocks.1']."
                )
            self.checkpoint_blocks = list(self.checkpoint_blocks)


def _is_dataset(data: object) -> bool:
    if isinstance(data, IterableDataset):
        return True
    return hasattr(data, "__getitem__") and hasattr(data, "__len__")
