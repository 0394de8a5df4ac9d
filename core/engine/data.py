"""Batches with an exact, resumable position, sharded across data-parallel ranks.

The position is (epoch, global samples consumed in that epoch). Map-style datasets are read through a
``DistributedSampler`` (shuffle, ``drop_last``, ``set_epoch``) whose permutation P depends only on
(seed, epoch); rank r of w reads P[r::w] in local batches of b/w, so after k global batches of b the
ranks together have consumed exactly P[0:k*b], whatever w is. That makes one position valid for every
world size: a run resumed with w' ranks starts each rank at P[s + r::w'], and a single process (w = 1)
reads P[0:b], P[b:2b], ... as it always did. Iterable datasets are read in order: each global batch is
b consecutive samples and rank r takes its slice of them; a resume skips the consumed samples.
Neither path touches the global RNG (the DataLoader gets its own generator), which is what makes a
resume bit-exact. The position is ``BatchStream``'s state (``state_dict``, ``load_state_dict``), with the longest
batch taken before it (measure/longest_batch.py), which a run's memory forecast predicts with.

On CUDA the stream fetches each step's first batch ahead (``fetch_ahead``), while the device still runs the step
before; the batch at the position is then already drawn. A dataset whose ``__getitem__`` draws random numbers has
moved the generators by then, so the stream keeps their states from before that draw (``rng_before_peek``): a
checkpoint or a trial's snapshot taken with a batch drawn ahead holds those, and the batch drawn again after a
restore is the same one.

The number of worker processes and pinned memory are live options: changing either drops the loader and
opens a new one at the position (``configure``), so no sample is skipped or read twice, and the batches are
the same whatever the number of workers: the sampler alone orders a map-style dataset, and an iterable
one is split among the workers by whole batches in the order the DataLoader reads them back (worker k of
W takes batches k, k + W, ...). A dataset that draws random numbers in ``__getitem__`` is the exception:
in the training process (0 workers) it draws from the global RNG, in a worker from that worker's seed.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, get_worker_info

from torchlab.core.engine.batch_split import is_batch_dataclass, replaced_fields
from torchlab.core.engine.measure.longest_batch import LongestBatch
from torchlab.core.engine.state.checkpoint import capture_rng_state
from torchlab.core.engine.adapters.loading import describe_code
from torchlab.core.errors import WorkloadError, shown

if TYPE_CHECKING:
    from torchlab.core.engine.measure.step_phases import PhaseClock

#: Where the step under way is not timed: its data's and copy's phases mark nothing.
_UNTIMED = contextlib.nullcontext()


@dataclass
class DataPosition:
    """Where the next batch starts: ``samples`` global samples into ``epoch`` (a multiple of the batch)."""

    epoch: int = 0
    samples: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "samples": self.samples}

    @classmethod
    def from_dict(cls, state: dict[str, int], batch_size: int) -> DataPosition:
        """Read a checkpoint's position; checkpoints before sharding counted batches of ``batch_size``."""
        if "samples" in state:
            return cls(state["epoch"], state["samples"])
        return cls(state["epoch"], state["batches"] * batch_size)


def epoch_seed(seed: int) -> int:
    """The sampler seed: the permutation of epoch e is ``randperm`` of a generator seeded ``epoch_seed + e``."""
    return seed * 1_000_003


class ResumableDistributedSampler(DistributedSampler):
    """``DistributedSampler`` (shuffled, ``drop_last``) that starts ``start`` global samples into its epoch.

    With ``start == 0`` it yields exactly what ``DistributedSampler`` yields: P[:total_size][rank::w].
    A later start skips the first ``start`` entries of P (the samples all ranks consumed together), so
    rank r continues at P[start + r::w]. A start that is not a multiple of w (only after resuming with
    a different batch size) is rounded down: at most w - 1 samples are seen twice, none skipped.
    """

    def __init__(self, dataset: Dataset, *, rank: int, world_size: int, seed: int, epoch: int, start: int) -> None:
        super().__init__(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=epoch_seed(seed), drop_last=True)
        self.set_epoch(epoch)
        self.start = start - start % world_size

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        permutation = torch.randperm(len(self.dataset), generator=generator)[: self.total_size]
        return iter(permutation[self.start + self.rank :: self.num_replicas].tolist())

    def __len__(self) -> int:
        return max(0, (self.total_size - self.start) // self.num_replicas)


class _RankSlices(IterableDataset):
    """An iterable dataset's samples from ``skip`` on, cut into global batches; this rank's share of each.

    In a DataLoader worker, only the batches that worker's turn brings: the loader asks its W workers for
    batches in turn (batch i from worker i mod W), so worker k yields batches k, k + W, ... and the loader
    hands them out in the dataset's order. Each worker reads the whole stream and skips the others' batches
    (without the split, each worker yielded every batch: W copies of each)."""

    def __init__(self, dataset: IterableDataset, *, skip: int, global_batch: int, rank: int, world_size: int) -> None:
        self.dataset, self.skip, self.global_batch = dataset, skip, global_batch
        local = global_batch // world_size
        self.first, self.last = rank * local, (rank + 1) * local

    def __iter__(self) -> Iterator[Any]:
        worker = get_worker_info()
        turn, turns = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        samples = itertools.islice(iter(self.dataset), self.skip, None)
        for index in itertools.count():
            chunk = list(itertools.islice(samples, self.global_batch))
            if len(chunk) < self.global_batch:  # drop_last, on every rank alike
                return
            if index % turns == turn:
                yield from chunk[self.first : self.last]


class BatchStream:
    """An endless stream of this rank's training batches on the device, epoch after epoch.

    ``batch_size`` is the global batch (all ranks together); each of ``world_size`` ranks gets
    ``batch_size // world_size`` samples per batch.
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        batch_size: int,
        collate_fn: Callable[[list], Any] | None,
        workers: int = 0,
        pin_memory: bool = False,
        seed: int,
        device: torch.device,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if batch_size % world_size:
            raise ValueError(f"the batch of {batch_size} does not split into {world_size} equal parts")
        self.dataset = dataset
        self.batch_size = batch_size
        self.local_batch_size = batch_size // world_size
        self.rank, self.world_size = rank, world_size
        self.collate_fn = collate_fn
        self.workers = workers
        self.pin_memory = pin_memory
        self.seed = seed
        self.device = device
        self.iterable = isinstance(dataset, IterableDataset)
        if not self.iterable:
            size = dataset_size(dataset, "dataset")
            if size < batch_size:
                raise WorkloadError(
                    f"the dataset has {size} samples, fewer than one batch of {batch_size}; "
                    f"lower --batch-size or add data."
                )
        self.position = DataPosition()
        self._iterator: Iterator | None = None
        self._peeked: Any = None  # the batch at the position, fetched by peek_batch and not yet taken
        #: The random generators' states from before the batch at the position was drawn, while it waits to be taken.
        self.rng_before_peek: dict[str, Any] | None = None
        #: Whether ``fetch_ahead`` fetches: on CUDA, where the host's data work then overlaps the device's.
        self.fetches_ahead = device.type == "cuda"
        #: The batch ``next_batch`` returned last: the non-finite guard replays it, a compile at a boundary runs it.
        self.last_batch: Any = None
        #: Where each recent batch began, (epoch, samples into it): the spike guard names a batch's samples by it.
        self.taken_at: deque[tuple[int, int]] = deque(maxlen=4096)
        #: Seconds ``next_batch`` made its caller wait since ``take_wait`` was last called.
        self._waited_s = 0.0
        #: The clock of the step under way, where it is timed: the loader's wait and the copy are marked on it as
        #: the step's ``data`` and ``copy`` phases (core/engine/measure/step_phases.py)
        self.clock: PhaseClock | None = None
        #: The longest batch taken (what the run's memory forecast predicts with), and which recent ones were as long.
        self.lengths = LongestBatch()

    def restore(self, position: DataPosition) -> None:
        self.position = DataPosition(position.epoch, position.samples)
        self._iterator, self._peeked, self.rng_before_peek = None, None, None

    def close(self) -> None:
        """The loader's worker processes told to exit now, where the run ends; the position stays. Left to a garbage
        collection of the trainer's reference cycles, the loader's queues were collected first (their finalizers
        stop the threads that feed them), so its workers never heard they should exit, and each was waited for 5 s
        and then terminated: a run with ``workers`` 2 took 10 s longer to end, the app's quit as much."""
        self._iterator = None  # the last reference: the iterator shuts its workers down at once

    def state_dict(self) -> dict[str, Any]:
        """The position, as checkpoints hold it under ``"data"`` (its loader reopens there), and the longest batch
        taken before it (``longest_batch``, where one was)."""
        state: dict[str, Any] = self.position.as_dict()
        if (longest := self.lengths.state_dict()) is not None:
            state["longest_batch"] = longest
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.restore(DataPosition.from_dict(state, self.batch_size))
        self.lengths.load_state_dict(state.get("longest_batch"))

    def configure(self, *, workers: int | None = None, pin_memory: bool | None = None) -> None:
        """Load with ``workers`` processes and/or ``pinned`` memory from the batch after the one at the position: the
        loader open now (with the batches its workers prefetched) is dropped, and the next fetch opens one where the
        position is then. A batch already drawn at the position is kept: how it was loaded does not change what it
        holds, and drawing it again would draw a dataset's random numbers again."""
        self.workers = self.workers if workers is None else workers
        self.pin_memory = self.pin_memory if pin_memory is None else pin_memory
        self._iterator = None  # its workers exit as it is collected

    def next_batch(self) -> Any:
        """The batch at the position, on the device; the position moves past it. The time it took is the
        caller's wait for data (``take_wait``)."""
        started = time.perf_counter()
        batch = self._peeked if self._peeked is not None else self._fetch()
        self._peeked, self.rng_before_peek = None, None
        self.taken_at.append((self.position.epoch, self.position.samples))  # after the fetch: a new epoch's, if it began
        self.position.samples += self.batch_size
        self.last_batch = batch
        self._waited_s += time.perf_counter() - started
        self.lengths.took(batch)
        return batch

    def samples_of(self, batches: int) -> list[int] | None:
        """The dataset indices of the last ``batches`` batches taken, all ranks' samples together (every rank takes
        its share of the same slice of the epoch's permutation), in the order drawn; None for an IterableDataset,
        whose samples have no index."""
        if self.iterable or batches > len(self.taken_at):
            return None
        indices: list[int] = []
        size = len(self.dataset)
        total = size - size % self.world_size  # DistributedSampler's drop_last: P[:total_size]
        permutations: dict[int, torch.Tensor] = {}  # each epoch's once: a step's batches span one or two
        for epoch, samples in list(self.taken_at)[-batches:]:
            if epoch not in permutations:
                generator = torch.Generator().manual_seed(epoch_seed(self.seed) + epoch)
                permutations[epoch] = torch.randperm(size, generator=generator)[:total]
            start = samples - samples % self.world_size  # as ResumableDistributedSampler rounds a start
            indices += permutations[epoch][start:start + self.batch_size].tolist()
        return indices

    def take_wait(self) -> float:
        """The seconds ``next_batch`` took since the last call: a step's wait for its data."""
        waited, self._waited_s = self._waited_s, 0.0
        return waited

    def peek_batch(self) -> Any:
        """The batch at the position, on the device, without moving past it: ``next_batch`` returns it. Its fetch is
        the caller's wait for data, as ``next_batch``'s is."""
        if self._peeked is None:
            started = time.perf_counter()
            self.rng_before_peek = capture_rng_state()
            self._peeked = self._fetch()
            self._waited_s += time.perf_counter() - started
        return self._peeked

    def reopens_at(self) -> DataPosition:
        """Where the next loader opens: past the batch drawn at the position, if one waits to be taken."""
        if self._peeked is None:
            return self.position
        return DataPosition(self.position.epoch, self.position.samples + self.batch_size)

    def fetch_ahead(self) -> None:
        """Where it pays (``fetches_ahead``: CUDA), the next step's first batch fetched and its copy queued now, while
        the device still runs this step's backward, before the step's one synchronisation: a loop that fetches after
        it leaves the GPU idle for the whole of the host's data work (on an H100, one sync a step cost a plain loop
        1.45 % of a 112 ms step, and 0.54 % with its next batch fetched first: benchmarks/README.md)."""
        if self.fetches_ahead:
            self.peek_batch()

    def finished_epoch(self) -> bool:
        """Whether the last batch taken ended its epoch: no whole batch of a map-style dataset's epoch is left (or a
        batch drawn ahead opened the next); an IterableDataset's end shows only once the next epoch's first batch is
        taken, so for one it says so at that batch: an epoch scheduler steps one step late there."""
        if not self.taken_at:
            return False
        if self._peeked is not None and self.position.epoch > self.epoch:
            return True
        if self.iterable:
            return len(self.taken_at) >= 2 and self.taken_at[-1][0] > self.taken_at[-2][0]
        return self.position.samples + self.batch_size > self._epoch_samples

    @property
    def _epoch_samples(self) -> int:
        """The samples of an epoch, all ranks' batches together: whole batches only (the loader drops the rest), of
        the samples DistributedSampler shares out (a multiple of the ranks)."""
        size = len(self.dataset)
        per_rank = (size - size % self.world_size) // self.world_size
        return (per_rank // self.local_batch_size) * self.batch_size

    @property
    def epoch(self) -> int:
        """The epoch of the last batch taken: the position's may be the next one's, where a batch drawn ahead
        opened it."""
        return self.taken_at[-1][0] if self.taken_at else self.position.epoch

    def epoch_of_taken(self, back: int) -> int:
        """The epoch of the batch taken ``back`` batches ago (1: the last; a step's first of ``accum`` taken ahead)."""
        return self.taken_at[-back][0] if 0 < back <= len(self.taken_at) else self.epoch

    def _fetch(self) -> Any:
        if self._iterator is None:
            self._iterator = self._open_epoch()
        clock = self.clock
        with clock.data if clock is not None else _UNTIMED:
            try:
                batch = next(self._iterator)
            except StopIteration:
                if self.position.samples == 0:
                    raise WorkloadError("the dataset yielded no batch in a whole epoch; it is empty.") from None
                self.position = DataPosition(self.position.epoch + 1, 0)
                self._iterator = self._open_epoch()
                batch = next(self._iterator)
        with clock.copy if clock is not None else _UNTIMED:
            return move_to_device(batch, self.device)

    def _open_epoch(self) -> Iterator:
        epoch, start = self.position.epoch, self.position.samples
        generator = torch.Generator().manual_seed(epoch_seed(self.seed) + epoch)
        common = dict(
            batch_size=self.local_batch_size,
            collate_fn=self.collate_fn,
            num_workers=self.workers,
            worker_init_fn=_leave_signals_to_the_trainer if self.workers else None,
            pin_memory=self.pin_memory,
            drop_last=True,
            generator=generator,
        )
        if self.iterable:
            shard = _RankSlices(self.dataset, skip=start, global_batch=self.batch_size, rank=self.rank, world_size=self.world_size)
            return iter(DataLoader(shard, **common))
        sampler = ResumableDistributedSampler(
            self.dataset, rank=self.rank, world_size=self.world_size, seed=self.seed, epoch=epoch, start=start
        )
        return iter(DataLoader(self.dataset, sampler=sampler, **common))


def _leave_signals_to_the_trainer(worker_id: int) -> None:
    """In a data-loader worker: ignore the stop signals a terminal or a job scheduler sends the whole process group
    (Ctrl-C's SIGINT, a hang-up, ``kill -- -PGID``'s or a container's SIGTERM). The trainer takes them and stops at
    the step boundary with a checkpoint, then tells its workers to exit. A forked worker kept the trainer's own
    handlers (Ctrl-C said "Stopping at the next step boundary" twice) and died of SIGTERM, which the loader then
    raised in the trainer: "Training failed at step 240: RuntimeError: DataLoader worker (pid …) is killed by signal:
    Terminated", a run stopped on request reported as failed. A worker whose trainer is gone exits by itself
    (the loader's watchdog)."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)


def evaluation_batches(
    dataset: Dataset, *, batch_size: int, collate_fn, limit: int, device: torch.device
) -> Iterator[Any]:
    """The first ``limit`` batches of the validation set, in order, on the device.

    The loader gets its own generator: without one, a DataLoader draws its seed from the global RNG,
    and an evaluation would shift the training's dropout from then on (a run that evaluates at a step
    where another does not, such as its last one, could then not be resumed bit-exactly).
    """
    if not isinstance(dataset, IterableDataset):
        dataset_size(dataset, "val_dataset")
    loader = DataLoader(dataset, batch_size=batch_size, collate_fn=collate_fn, shuffle=False, generator=torch.Generator())
    for index, batch in enumerate(loader):
        if index >= limit:
            return
        yield move_to_device(batch, device)


def dataset_size(dataset: Dataset, field: str) -> int:
    """The samples of a map-style dataset (``Workload.field``), or a WorkloadError naming its class and ``__len__``
    where that returns no number of samples: ``len()`` raised ValueError for -1 and TypeError for 2.5, deep in
    the DataLoader's sampler, as a traceback."""
    where = f"Workload.{field}: {type(dataset).__name__}.__len__ ({describe_code(type(dataset).__len__)})"
    must = "it must return the number of samples, a whole number ≥ 0."
    try:
        returned = dataset.__len__()
    except Exception as error:
        raise WorkloadError(f"{where} raised {type(error).__name__}: {error}; {must}") from error
    try:
        size = operator.index(returned)  # what len() takes: an int, or a NumPy integer
    except TypeError:
        size = None
    if size is None or not 0 <= size <= sys.maxsize:
        raise WorkloadError(f"{where} returned {shown(returned)}; {must}")
    return size


def move_to_device(batch: Any, device: torch.device) -> Any:
    return map_batch_tensors(batch, lambda tensor: _to_device(tensor, device))


def _to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    if tensor.is_cpu and device.type == "cpu":  # what ``.to`` would return, without its call (each step, each tensor)
        return tensor
    return tensor.to(device, non_blocking=device.type == "cuda")


def map_batch_tensors(batch: Any, convert: Callable[[torch.Tensor], Any]) -> Any:
    """``batch`` with each tensor in it converted: inside dicts, namedtuples, lists, tuples and the user's own batch
    dataclasses; anything else as it is."""
    if isinstance(batch, torch.Tensor):
        return convert(batch)
    if isinstance(batch, dict):
        return {key: map_batch_tensors(value, convert) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(map_batch_tensors(item, convert) for item in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(map_batch_tensors(item, convert) for item in batch)
    if is_batch_dataclass(batch):  # a batch of the user's own type: its fields converted
        return replaced_fields(batch, lambda item: map_batch_tensors(item, convert))
    return batch
