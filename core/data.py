"""Batches with an exact, resumable position.

The position is (epoch, batches consumed in that epoch). Map-style datasets are shuffled by a
permutation that depends only on (seed, epoch), so a resumed run starts at exactly the next sample;
iterable datasets are replayed and the consumed batches skipped. Neither path touches the global RNG
(the DataLoader gets its own generator), which is what makes a resume bit-exact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from torchlab.core.errors import WorkloadError


@dataclass
class DataPosition:
    epoch: int = 0
    batches: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batches": self.batches}


class EpochPermutationSampler(Sampler[int]):
    """A shuffle that is a pure function of (seed, epoch), starting ``start`` samples into the epoch."""

    def __init__(self, length: int, seed: int, epoch: int, start: int) -> None:
        self.length, self.seed, self.epoch, self.start = length, seed, epoch, start

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return iter(torch.randperm(self.length, generator=generator)[self.start :].tolist())

    def __len__(self) -> int:
        return self.length - self.start


class BatchStream:
    """An endless stream of training batches on the device, epoch after epoch."""

    def __init__(
        self,
        dataset: Dataset,
        *,
        batch_size: int,
        collate_fn: Callable[[list], Any] | None,
        workers: int,
        seed: int,
        device: torch.device,
    ) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.collate_fn = collate_fn
        self.workers = workers
        self.seed = seed
        self.device = device
        self.iterable = isinstance(dataset, IterableDataset)
        if not self.iterable:
            size = len(dataset)
            if size < batch_size:
                raise WorkloadError(
                    f"the dataset has {size} samples, fewer than one batch of {batch_size}; "
                    f"lower --batch-size or add data."
                )
        self.position = DataPosition()
        self._iterator: Iterator | None = None

    def restore(self, position: DataPosition) -> None:
        self.position = DataPosition(position.epoch, position.batches)
        self._iterator = None

    def next_batch(self) -> Any:
        if self._iterator is None:
            self._iterator = self._open_epoch()
        try:
            batch = next(self._iterator)
        except StopIteration:
            if self.position.batches == 0:
                raise WorkloadError("the dataset yielded no batch in a whole epoch; it is empty.") from None
            self.position = DataPosition(self.position.epoch + 1, 0)
            self._iterator = self._open_epoch()
            batch = next(self._iterator)
        self.position.batches += 1
        return move_to_device(batch, self.device)

    def _open_epoch(self) -> Iterator:
        epoch, skip = self.position.epoch, self.position.batches
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        common = dict(
            batch_size=self.batch_size,
            collate_fn=self.collate_fn,
            num_workers=self.workers,
            pin_memory=self.device.type == "cuda",
            drop_last=True,
            generator=generator,
        )
        if self.iterable:
            iterator = iter(DataLoader(self.dataset, **common))
            for _ in range(skip):
                next(iterator)
            return iterator
        sampler = EpochPermutationSampler(len(self.dataset), self.seed, epoch, skip * self.batch_size)
        return iter(DataLoader(self.dataset, sampler=sampler, **common))


def evaluation_batches(
    dataset: Dataset, *, batch_size: int, collate_fn, limit: int, device: torch.device
) -> Iterator[Any]:
    """The first ``limit`` batches of the validation set, in order, on the device."""
    loader = DataLoader(dataset, batch_size=batch_size, collate_fn=collate_fn, shuffle=False)
    for index, batch in enumerate(loader):
        if index >= limit:
            return
        yield move_to_device(batch, device)


def move_to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=device.type == "cuda")
    if isinstance(batch, dict):
        return {key: move_to_device(value, device) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(move_to_device(item, device) for item in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to_device(item, device) for item in batch)
    return batch
