"""Live option ``split`` (core/engine/batch_split.py): a step's batch run as pieces, the same samples and gradient."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch

from trainers import WORKLOADS, make_trainer
from torchlab.core.engine.batch_split import check_split, split_batch
from torchlab.core.options import OptionChangeError

#: TinyNet without its dropout: nothing random in a step, so pieces and the whole batch must agree to rounding.
DETERMINISTIC = f"{WORKLOADS / 'tiny.py'}:without_dropout"


def test_a_batch_in_uneven_pieces_trains_as_the_whole_batch_to_float_rounding():
    """16 samples in 3 pieces (6, 5, 5, weighted by their share) with 2 micro-batches a step: every step's loss and
    the weights at the end are the unsplit run's, to float rounding."""
    settings = dict(steps=6, seed=3, checkpoint_every=0)
    whole, whole_seen = make_trainer(DETERMINISTIC, options={"accum": 2}, **settings)
    whole.run()
    split, split_seen = make_trainer(DETERMINISTIC, options={"accum": 2, "split": 3}, **settings)
    split.run()
    assert [row.options.split for row in split_seen.metrics] == [3] * 6
    assert [row.loss for row in split_seen.metrics] == pytest.approx([row.loss for row in whole_seen.metrics], rel=1e-5)
    for ours, theirs in zip(split.parts.model.model.parameters(), whole.parts.model.model.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_pieces_keep_the_batchs_structure_and_cut_its_per_sample_values_with_it():
    Pair = namedtuple("Pair", "inputs targets")
    batch = {"x": torch.arange(10).reshape(5, 2), "meta": Pair(torch.arange(5), ["a", "b", "c", "d", "e"]),
             "scale": torch.tensor(2.0), "name": "run"}
    (first, first_share), (second, second_share) = split_batch(batch, 2)
    assert (first_share, second_share) == (0.4, 0.6)  # 2 and 3 samples of 5
    assert first["x"].tolist() == [[0, 1], [2, 3]] and second["meta"].inputs.tolist() == [2, 3, 4]
    assert isinstance(second["meta"], Pair) and second["meta"].targets == ["c", "d", "e"]
    assert first["scale"] is batch["scale"] and second["name"] == "run"
    assert split_batch(batch, 1) == [(batch, 1.0)]


def test_a_batch_of_the_users_own_dataclass_is_cut_field_by_field_and_moved_to_the_device_whole():
    """Found by the combination matrix (a classifier whose collate_fn makes a dataclass): split refused such a batch
    as one with "no tensor with a first dimension", and the device move left its tensors where they were."""
    from dataclasses import dataclass, field

    from torchlab.core.engine.data import move_to_device

    @dataclass
    class Batch:
        tokens: torch.Tensor
        labels: torch.Tensor
        source: str = "train"
        seen: int = field(default=0, init=False)

    batch = Batch(torch.arange(10).reshape(5, 2), torch.arange(5))
    (first, first_share), (second, _) = split_batch(batch, 2)
    assert isinstance(first, Batch) and first_share == 0.4 and first.tokens.tolist() == [[0, 1], [2, 3]]
    assert second.labels.tolist() == [2, 3, 4] and second.source == "train"
    moved = move_to_device(batch, torch.device("meta"))
    assert isinstance(moved, Batch) and moved.tokens.is_meta and moved.labels.is_meta and moved.source == "train"


@pytest.mark.parametrize("batch, pieces, reason", [
    (torch.zeros(3, 2), 4, "a batch of 3 samples cannot be split in 4: at most 3 here"),
    ((torch.zeros(4, 2), torch.zeros(5)), 2, "this run's has tensors of [4, 5] rows"),
    ({"text": "no tensors"}, 2, "this run's has no tensor with a first dimension"),
])
def test_a_batch_that_cannot_be_cut_so_fine_is_refused_saying_why(batch, pieces, reason):
    with pytest.raises(OptionChangeError, match=reason.replace("[", r"\[").replace("]", r"\]")):
        check_split(batch, pieces)


def test_an_epochs_short_last_batch_is_cut_in_as_many_pieces_as_it_has_samples():
    assert [share for _, share in split_batch(torch.zeros(3, 2), 4)] == pytest.approx([1 / 3] * 3)


def test_a_split_finer_than_the_batch_is_refused_at_the_boundary_and_training_goes_on():
    trainer, seen = make_trainer(DETERMINISTIC, steps=4, checkpoint_every=0, at=["2:split=32", "3:split=4"])
    assert trainer.run().status == "finished"
    [refused] = seen.of("option_refused")
    assert refused["option"] == "split" and "a batch of 16 samples cannot be split in 32" in refused["reason"]
    assert [row.options.split for row in seen.metrics] == [1, 1, 4, 4]
