"""Data position: worker processes and iterable datasets give the same batches, and resume exactly; the workers
and pinned memory change while a run trains without a sample skipped or read twice."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import IterableDataset

from trainers import WORKLOADS, StopAt, make_trainer
from torchlab.core.engine.data import BatchStream, DataPosition
from torchlab.core.errors import ConfigError


def test_worker_processes_give_the_same_training_as_the_main_process():
    single, seen_single = make_trainer(steps=6, options={"workers": 0})
    single.run()
    parallel, seen_parallel = make_trainer(steps=6, options={"workers": 2})
    parallel.run()
    assert [r.loss for r in seen_parallel.metrics] == [r.loss for r in seen_single.metrics]


def test_a_run_whose_workers_change_has_the_losses_of_one_that_never_changed():
    """16 batches an epoch: the changes fall mid-epoch, and 2 workers are in force across the epoch's end."""
    steady, seen_steady = make_trainer(steps=20)
    steady.run()
    changing, seen = make_trainer(steps=20, at=["3:workers=2", "9:workers=1", "14:workers=0", "15:workers=2", "19:workers=1"])
    in_use, close = [], changing.data.close
    changing.data.close = lambda: (in_use.append(changing.data._iterator._num_workers), close())
    changing.run()
    assert [record.loss for record in seen.metrics] == [record.loss for record in seen_steady.metrics]
    changes = [(event["step"], event["value"], event["detail"]) for event in seen.of("option_applied")]
    assert changes == [
        (3, 2, "the data loader starts again at sample 32 of epoch 0"),
        (9, 1, "the data loader starts again at sample 128 of epoch 0"),
        (14, 0, "the data loader starts again at sample 208 of epoch 0"),
        (15, 2, "the data loader starts again at sample 224 of epoch 0"),
        (19, 1, "the data loader starts again at sample 32 of epoch 1"),
    ]
    assert [record.options.workers for record in seen.metrics][1:4] == [0, 2, 2]
    assert in_use == [1]  # the loader in use at the end has the workers last asked for
    assert all(record.data_wait_s >= 0 for record in seen.metrics)


def test_the_loaders_workers_have_exited_when_the_run_returns():
    """Left to a garbage collection of the trainer's cycles, the loader's queues went first and its workers never
    heard they should exit: each was waited for 5 s, then terminated (a headless run with 2 workers ended 10 s late,
    and the suite's next test paid it)."""
    trainer, _ = make_trainer(steps=3, options={"workers": 2})
    trainer.train_steps(2)
    workers = list(trainer.parts.data._iterator._workers)
    assert len(workers) == 2 and all(worker.is_alive() for worker in workers)
    assert trainer.run().status == "finished"
    assert not any(worker.is_alive() for worker in workers)


def test_the_loaders_workers_leave_a_process_groups_stop_signals_to_the_trainer():
    """SIGTERM to the whole group (a container's stop, ``kill -- -PGID``) killed the workers, and the loader raised
    that in the trainer: a run stopped on request ended "failed". The trainer takes the signal; its workers go on."""
    import os
    import signal

    import re
    import time

    def ignores_stop_signals(pid: int) -> bool:  # its worker_init_fn has run (the kernel's mask of ignored signals)
        ignored = int(re.search(r"SigIgn:\s*([0-9a-f]+)", Path(f"/proc/{pid}/status").read_text()).group(1), 16)
        return all(ignored >> (signum - 1) & 1 for signum in (signal.SIGINT, signal.SIGTERM))

    trainer, _ = make_trainer(steps=4, options={"workers": 2})
    trainer.train_steps(1)
    workers = list(trainer.parts.data._iterator._workers)
    # A worker still starting has not yet run its init (CI under load killed the second one there): wait for it.
    deadline = time.monotonic() + 60
    while not all(ignores_stop_signals(worker.pid) for worker in workers) and time.monotonic() < deadline:
        time.sleep(0.01)
    for worker in workers:
        os.kill(worker.pid, signal.SIGTERM)
        os.kill(worker.pid, signal.SIGINT)
    assert trainer.run().status == "finished"


def test_pinned_memory_is_refused_on_a_cpu_run_and_its_default_there_is_off():
    trainer, seen = make_trainer(steps=2, at=["2:pin_memory=on"])
    assert trainer.options.pin_memory is False  # auto: on with CUDA only, as the DataLoader always had it
    trainer.run()
    [refusal] = seen.of("option_refused")
    assert refusal["option"] == "pin_memory" and refusal["step"] == 2
    assert refusal["reason"] == ("pinned memory speeds up copies of batches from the host to a CUDA device; this run "
                                 "trains on cpu, where batches are not copied")
    assert trainer.data.pin_memory is False
    with pytest.raises(ConfigError, match=r"^pin_memory \(--pin-memory\) on: pinned memory speeds up copies"):
        make_trainer(steps=2, options={"pin_memory": "on"})


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
    assert stream.position == DataPosition(epoch=2, samples=4)
    resumed = BatchStream(Counting(10), batch_size=4, collate_fn=None, workers=0, seed=0, device=torch.device("cpu"))
    resumed.restore(DataPosition(epoch=2, samples=4))
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
    resumed.restore(DataPosition(epoch=1, samples=6))
    assert [resumed.next_batch()[0].tolist() for _ in range(2)] == batches[6:8]


def local_batches(data, *, world_size: int, rank: int, batch_size: int, count: int, position=None):
    stream = BatchStream(data, batch_size=batch_size, collate_fn=None, workers=0, seed=5,
                         device=torch.device("cpu"), rank=rank, world_size=world_size)
    if position is not None:
        stream.restore(position)
    batches = (stream.next_batch() for _ in range(count))
    return [(batch[0] if isinstance(batch, list) else batch).flatten().tolist() for batch in batches]


def test_ranks_together_read_the_single_process_batches():
    """Global batch k of w ranks is the single process's batch k as a set: same gradient, same loss curve."""
    data = torch.utils.data.TensorDataset(torch.arange(40.0))
    single = local_batches(data, world_size=1, rank=0, batch_size=8, count=7)  # 5 per epoch: crosses an epoch
    for world_size in (2, 4):
        per_rank = [local_batches(data, world_size=world_size, rank=r, batch_size=8, count=7) for r in range(world_size)]
        for k in range(7):
            assert all(len(ranks[k]) == 8 // world_size for ranks in per_rank)
            assert sorted(sum((ranks[k] for ranks in per_rank), [])) == sorted(single[k])


def test_the_sampler_is_distributed_sampler_with_set_epoch():
    from torch.utils.data import DistributedSampler

    from torchlab.core.engine.data import ResumableDistributedSampler, epoch_seed

    data = torch.utils.data.TensorDataset(torch.arange(23.0))
    for rank in range(3):
        ours = ResumableDistributedSampler(data, rank=rank, world_size=3, seed=5, epoch=2, start=0)
        theirs = DistributedSampler(data, num_replicas=3, rank=rank, shuffle=True, seed=epoch_seed(5), drop_last=True)
        theirs.set_epoch(2)
        assert list(ours) == list(theirs) and len(ours) == len(theirs)


def test_a_position_resumes_under_another_world_size():
    """After 3 global batches at one world size, any other world size continues with global batch 4."""
    data = torch.utils.data.TensorDataset(torch.arange(48.0))
    single = local_batches(data, world_size=1, rank=0, batch_size=8, count=5)
    for world_size in (1, 2, 4):
        per_rank = [local_batches(data, world_size=world_size, rank=r, batch_size=8, count=2,
                                  position=DataPosition(epoch=0, samples=3 * 8)) for r in range(world_size)]
        for k in range(2):
            assert sorted(sum((ranks[k] for ranks in per_rank), [])) == sorted(single[3 + k])


def test_iterable_datasets_are_sliced_per_global_batch():
    single = local_batches(Counting(21), world_size=1, rank=0, batch_size=4, count=6)
    halves = [local_batches(Counting(21), world_size=2, rank=r, batch_size=4, count=6) for r in range(2)]
    assert halves[0][0] == [0.0, 1.0] and halves[1][0] == [2.0, 3.0]
    assert [a + b for a, b in zip(*halves)] == single  # 5 full batches per epoch on both ranks
    resumed = local_batches(Counting(21), world_size=2, rank=1, batch_size=4, count=1, position=DataPosition(0, 8))
    assert resumed == [[10.0, 11.0]]



@pytest.mark.parametrize("workers", [2, 3])
def test_an_iterable_dataset_gives_the_same_batches_whatever_the_workers_and_a_change_skips_none(workers):
    """Without a split by worker, each worker yielded the whole stream: every batch came ``workers`` times."""

    def firsts(stream: BatchStream, count: int) -> list[float]:
        return [stream.next_batch()[0].item() for _ in range(count)]

    def stream(loading: int) -> BatchStream:
        return BatchStream(Counting(22), batch_size=4, collate_fn=None, workers=loading, seed=0, device=torch.device("cpu"))

    expected = firsts(stream(0), 12)  # 5 batches an epoch: crosses two epoch ends
    assert expected[:6] == [0.0, 4.0, 8.0, 12.0, 16.0, 0.0]
    assert firsts(stream(workers), 12) == expected
    changing = stream(0)
    seen = firsts(changing, 3)
    changing.configure(workers=workers)
    seen += firsts(changing, 1)
    assert changing._iterator._num_workers == workers  # at once: not only from the next epoch on
    seen += firsts(changing, 3)
    changing.configure(workers=0)
    seen += firsts(changing, 5)
    assert seen == expected


def test_a_peeked_batch_is_the_next_one_and_a_new_loader_starts_where_the_peek_was():
    data = torch.utils.data.TensorDataset(torch.arange(12.0))
    straight = BatchStream(data, batch_size=3, collate_fn=None, seed=5, device=torch.device("cpu"))
    expected = [straight.next_batch()[0].tolist() for _ in range(6)]
    peeking = BatchStream(data, batch_size=3, collate_fn=None, seed=5, device=torch.device("cpu"))
    taken = [peeking.next_batch()[0].tolist() for _ in range(3)]
    assert peeking.peek_batch()[0].tolist() == expected[3] and peeking.position == DataPosition(0, 9)
    peeking.configure(workers=1)
    taken += [peeking.next_batch()[0].tolist() for _ in range(3)]
    assert taken == expected


JITTERED = f"{WORKLOADS / 'tiny.py'}:jittered_data"


def fetching_ahead(trainer):
    """The trainer, its stream fetching each step's batch ahead as it does on CUDA (``BatchStream.fetch_ahead``)."""
    trainer.data.fetches_ahead = True
    return trainer


def test_batches_fetched_ahead_train_as_batches_fetched_when_taken_across_an_epochs_end():
    """16 batches an epoch: step 16's fetch ahead opens epoch 1, and its row still says epoch 0."""
    taken, seen_taken = make_trainer(steps=20, at=["6:workers=1", "9:workers=0"])
    taken.run()
    ahead, seen_ahead = make_trainer(steps=20, at=["6:workers=1", "9:workers=0"])
    fetching_ahead(ahead).run()
    assert [row.loss for row in seen_ahead.metrics] == [row.loss for row in seen_taken.metrics]
    assert [row.epoch for row in seen_ahead.metrics] == [0] * 16 + [1] * 4
    assert [row.epoch for row in seen_taken.metrics] == [0] * 16 + [1] * 4
    # the batch drawn ahead at the change stays: the new loader opens past it
    assert [event["detail"] for event in seen_ahead.of("option_applied")] == [
        "the data loader starts again at sample 96 of epoch 0", "the data loader starts again at sample 144 of epoch 0"]


def test_a_resume_of_a_run_that_fetched_ahead_draws_a_datasets_random_numbers_as_the_run_did(tmp_path):
    """The checkpoint at step 10 holds the generators from before step 11's batch was drawn ahead: the resumed run
    draws that batch's noise again, and trains as the run that never stopped."""
    straight, seen_straight = make_trainer(JITTERED, steps=16)
    fetching_ahead(straight).run()
    first, _ = make_trainer(JITTERED, steps=16, checkpoint_dir=tmp_path, checkpoint_every=0)
    first.observers.append(StopAt(first, 10))
    assert fetching_ahead(first).run().step == 10
    resumed, seen_resumed = make_trainer(JITTERED, steps=16, resume_from=tmp_path / "last.pt")
    fetching_ahead(resumed).run()
    assert [row.loss for row in seen_resumed.metrics] == [row.loss for row in seen_straight.metrics[10:]]


def test_a_trial_in_a_run_that_fetches_ahead_leaves_its_training_bit_for_bit():
    untried, seen_untried = make_trainer(JITTERED, steps=12, checkpoint_every=0)
    fetching_ahead(untried).run()
    tried, seen_tried = make_trainer(JITTERED, steps=12, checkpoint_every=0, trials=["5:lr_scale=0.5"], trial_steps=3)
    fetching_ahead(tried).run()
    assert len(seen_tried.of("trial_result")) == 1
    assert [row.loss for row in seen_tried.metrics] == [row.loss for row in seen_untried.metrics]
