"""Data position: worker processes and iterable datasets give the same batches, and resume exactly."""

from __future__ import annotations

import torch
from torch.utils.data import IterableDataset

from conftest import make_trainer
from torchlab.core.data import BatchStream, DataPosition


def test_worker_processes_give_the_same_training_as_the_main_process():
    single, seen_single = make_trainer(steps=6, workers=0)
    single.run()
    parallel, seen_parallel = make_trainer(steps=6, workers=2)
    parallel.run()
    assert [r["loss"] for r in seen_parallel.metrics] == [r["loss"] for r in seen_single.metrics]


class Counting(IterableDataset):
    """0, 1, 2, ... n-1 as float tensors: an iterable dataset whose order is easy to check."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return (torch.tensor([float(i)]) for i in range(self.n))


def test_iterable_dataset_streams_across_epochs_and_resumes_by_skipping():
    stream = BatchStream(Counting(10), batch_size=4, collate_fn=None, workers=0, seed=0, device=torch.device("cpu"))
    firsts = [stream.next_batch()[0].item() for _ in range(5)]
    assert firsts == [0.0, 4.0, 0.0, 4.0, 0.0]  # drop_last: 2 batches per epoch of 10
    assert stream.position == DataPosition(epoch=2, batches=1)
    resumed = BatchStream(Counting(10), batch_size=4, collate_fn=None, workers=0, seed=0, device=torch.device("cpu"))
    resumed.restore(DataPosition(epoch=2, batches=1))
    assert resumed.next_batch()[0].item() == 4.0


def test_map_style_epochs_reshuffle_and_resume_mid_epoch():
    data = torch.utils.data.TensorDataset(torch.arange(12.0))

    def stream():
        return BatchStream(data, batch_size=3, collate_fn=None, workers=0, seed=5, device=torch.device("cpu"))

    straight = stream()
    batches = [straight.next_batch()[0].tolist() for _ in range(8)]
    assert sorted(sum(batches[:4], [])) == list(range(12))  # one epoch covers every sample once
    assert batches[:4] != batches[4:]  # the next epoch is shuffled anew
    resumed = stream()
    resumed.restore(DataPosition(epoch=1, batches=2))
    assert [resumed.next_batch()[0].tolist() for _ in range(2)] == batches[6:8]
