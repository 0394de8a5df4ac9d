"""The longest batch a run has taken (core/engine/measure/longest_batch.py): what the trainer announces
(``longest_batch``), what marks a memory step as measured on a batch as long, and what a checkpoint keeps of it."""

from __future__ import annotations

import pytest
import torch

from trainers import WORKLOADS, make_trainer
from torchlab.core.engine.measure.longest_batch import LongestBatch
from torchlab.core.engine.state.checkpoint_contents import check_training_state
from torchlab.core.errors import ConfigError

VARYING = f"{WORKLOADS / 'tiny.py'}:varying_lengths"  # the dataset's first samples its shortest


def batch(length: int, samples: int = 4) -> dict:
    return {"tokens": torch.zeros(samples, length, dtype=torch.long), "labels": torch.zeros(samples, dtype=torch.long)}


def test_the_longest_is_the_batch_with_most_elements_and_a_recent_one_as_long_is_known():
    lengths = LongestBatch()
    for length in (8, 20, 12, 20, 5):
        lengths.took(batch(length))
    assert lengths.longest.shapes == ((4, 20), (4,)) and lengths.longest.elements == 84
    assert [lengths.was_longest(taken) for taken in range(1, 7)] == [False, True, False, True, False, False]
    assert lengths.longest_taken_at == 4  # the last as long: on CUDA, within the allocator's peak since a reset
    lengths.peak_reset_at = 4
    assert not lengths.measured_on_longest(4, allocator_peak=True)
    assert lengths.measured_on_longest(3, allocator_peak=False)  # the step whose first batch was the 4th


def test_a_restore_never_shortens_what_the_run_has_seen():
    """A trial's arm or a rollback restores the data position; the batches taken meanwhile were taken all the same."""
    lengths = LongestBatch()
    lengths.took(batch(30))
    earlier = LongestBatch()
    earlier.took(batch(10))
    lengths.load_state_dict(earlier.state_dict())
    assert lengths.longest.elements == 4 * 30 + 4
    lengths.load_state_dict({"elements": 999, "shapes": [[4, 249], [4]]})
    assert lengths.longest.shapes == ((4, 249), (4,))


def test_the_trainer_announces_each_longer_batch_and_marks_the_memory_steps_measured_on_one(tmp_path):
    """Batches padded to their longest sequence: the first batch is announced (no news in the log: ``previous``
    0), then each longer one; a memory step is marked as measured on the longest exactly where its activations are
    as large as any before (activations grow with the tokens), so that only such a step checks a prediction."""
    trainer, seen = make_trainer(VARYING, steps=24, memory_every=1, checkpoint_dir=tmp_path, checkpoint_every=0)
    trainer.run()
    announced = seen.of("longest_batch")
    assert announced[0]["previous_elements"] == 0 and len(announced) >= 3
    assert [event["elements"] for event in announced] == sorted({event["elements"] for event in announced})
    assert all(later["previous_elements"] == earlier["elements"] for earlier, later in zip(announced, announced[1:]))
    most = 0
    for row in seen.metrics:
        activations = row.memory.activations_bytes
        assert row.memory.longest_batch == (activations >= most), row.step
        most = max(most, activations)

    checkpoint = torch.load(tmp_path / "last.pt", weights_only=True)
    assert checkpoint["data"]["longest_batch"] == {"elements": announced[-1]["elements"], "shapes": announced[-1]["shapes"]}
    checkpoint["data"]["longest_batch"]["shapes"] = "3"
    with pytest.raises(ConfigError, match=r"its data\.longest_batch\.shapes is"):
        check_training_state(checkpoint, tmp_path / "last.pt")
    resumed, again = make_trainer(VARYING, steps=26, memory_every=1, resume_from=tmp_path / "last.pt")
    resumed.run()
    first = again.of("longest_batch")[0]
    assert first["step"] == 24 and first["elements"] >= announced[-1]["elements"] and first["previous_elements"] == 0
