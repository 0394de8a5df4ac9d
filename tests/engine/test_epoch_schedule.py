"""A workload's scheduler stepped once per epoch (``Workload.scheduler_interval="epoch"``): after the optimizer step
that took an epoch's last whole batch, as Lightning steps an epoch scheduler; through a resume and a change of the
run's length as it is."""

from __future__ import annotations

import pytest

from trainers import WORKLOADS, make_trainer
from torchlab.core.errors import WorkloadError
from torchlab.core.workload import Workload

PER_EPOCH = f"{WORKLOADS / 'own_training.py'}:per_epoch"


def body_lrs(seen) -> list[float]:
    return [row.lrs["body"] for row in seen.metrics]


def test_an_epoch_scheduler_steps_after_each_epochs_last_batch_and_goes_on_through_a_longer_run():
    trainer, seen = make_trainer(PER_EPOCH, steps=36, at=["20:steps=40"])  # 16 steps an epoch
    trainer.run()
    assert body_lrs(seen) == pytest.approx([0.05] * 16 + [0.025] * 16 + [0.0125] * 8)
    assert seen.of("option_applied")[0]["detail"] == ""  # its plan is in epochs: the run's length moves nothing


def test_resumed_mid_epoch_it_steps_where_the_run_that_never_stopped_did(tmp_path):
    first, _ = make_trainer(PER_EPOCH, steps=20, checkpoint_dir=tmp_path)
    first.run()
    resumed, seen = make_trainer(PER_EPOCH, steps=36, checkpoint_dir=tmp_path, resume_from=tmp_path / "last.pt")
    resumed.run()
    assert body_lrs(seen) == pytest.approx([0.025] * 12 + [0.0125] * 4)


def test_a_streams_end_shows_when_its_next_epoch_begins_so_its_first_step_still_has_the_old_lr():
    trainer, seen = make_trainer(f"{WORKLOADS / 'own_training.py'}:per_epoch_of_a_stream", steps=20)
    trainer.run()
    assert body_lrs(seen) == pytest.approx([0.05] * 17 + [0.025] * 3)


def test_an_epoch_interval_without_a_scheduler_of_its_own_is_refused():
    from own_training import Classifier, _blobs, loss_and_accuracy

    with pytest.raises(WorkloadError, match="scheduler_interval is \"epoch\" but the workload gives no scheduler"):
        Workload(model=Classifier(), dataset=_blobs(64, seed=1), loss_fn=loss_and_accuracy, scheduler_interval="epoch")
