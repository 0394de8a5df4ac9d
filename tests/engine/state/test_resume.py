"""Checkpoints: atomic, pruned, loadable without unpickling code, and a resume that is bit-exact."""

from __future__ import annotations

import pytest
import torch

from torchlab.core.wire.observer import TrainerObserver
from trainers import StopAt, make_trainer
from torchlab.core.engine.state.checkpoint import load_checkpoint, save_checkpoint
from torchlab.core.errors import StorageError
from torchlab.core.errors import ConfigError


@pytest.mark.parametrize("settings", [
    {},  # cosine schedule, dropout, shuffled data
    {"options": {"accum": "2", "clip": "0.3", "amp": "bf16", "checkpointing": "on"}, "at": ["6:lr_scale=0.5", "13:accum=1"]},
], ids=["defaults", "live-options"])
def test_resume_continues_bit_exact(tmp_path, settings):
    straight, seen_straight = make_trainer(steps=20, **settings)
    straight.run()

    first, _ = make_trainer(steps=20, checkpoint_dir=tmp_path, checkpoint_every=0, **settings)
    first.observers.append(StopAt(first, 10))
    assert first.run().step == 10

    resumed, seen_resumed = make_trainer(steps=20, checkpoint_dir=tmp_path, resume_from=tmp_path / "last.pt", **settings)
    resumed.run()
    assert [r.step for r in seen_resumed.metrics] == list(range(11, 21))
    assert [r.loss for r in seen_resumed.metrics] == [r.loss for r in seen_straight.metrics[10:]]
    for (name, a), (_, b) in zip(straight.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(a, b), name
    assert resumed.options == straight.options


def test_resume_keeps_the_checkpoints_options_unless_given_explicitly(tmp_path):
    first, _ = make_trainer(steps=4, checkpoint_dir=tmp_path, at=["2:clip=0.7", "3:accum=3"])
    first.run()
    resumed, _ = make_trainer(steps=6, resume_from=tmp_path, options={"accum": "2"}, explicit={"accum"})
    assert resumed.options.clip == 0.7  # from the checkpoint
    assert resumed.options.accum == 2  # given on the command line: wins


def test_checkpoint_write_is_atomic_when_interrupted(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, 1, {"weights": torch.ones(3)}, keep=3)

    def failing_save(obj, handle):
        handle.write(b"partial bytes")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(StorageError, match="no space left on device"):
        save_checkpoint(tmp_path, 2, {"weights": torch.zeros(3)}, keep=3)
    monkeypatch.undo()
    assert not (tmp_path / "step-0000002.pt").exists()
    assert torch.equal(load_checkpoint(tmp_path / "last.pt")["weights"], torch.ones(3))


def test_old_step_checkpoints_are_pruned_and_last_points_at_the_newest(tmp_path):
    for step in range(1, 6):
        save_checkpoint(tmp_path, step, {"step": step}, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step-*.pt")) == ["step-0000004.pt", "step-0000005.pt"]
    assert load_checkpoint(tmp_path / "last.pt")["step"] == 5


def test_loading_refuses_a_pickle_that_would_run_code(tmp_path):
    class Payload(TrainerObserver):
        def __reduce__(self):
            return (print, ("this must never run",))

    path = tmp_path / "evil.pt"
    torch.save({"format": 1, "payload": Payload()}, path)
    with pytest.raises(ConfigError, match="truncated or not a checkpoint"):
        load_checkpoint(path)


def test_resume_from_a_missing_or_foreign_file_names_it(tmp_path):
    with pytest.raises(ConfigError, match="no such checkpoint file"):
        load_checkpoint(tmp_path / "nope.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="junk.pt"):
        load_checkpoint(tmp_path / "junk.pt")
    torch.save({"something": "else"}, tmp_path / "foreign.pt")
    with pytest.raises(ConfigError, match="not a checkpoint torchlab wrote"):
        load_checkpoint(tmp_path / "foreign.pt")
    save_checkpoint(tmp_path, 1, {"format": 99}, keep=1)  # written by torchlab's save, of another format
    with pytest.raises(ConfigError, match="not a torchlab checkpoint of format 1"):
        load_checkpoint(tmp_path / "last.pt")


def test_evaluation_leaves_the_training_random_stream_alone():
    """A run that stops at step N evaluates there; resumed, it must match a run that did not (dropout)."""
    evaluating, seen_evaluating = make_trainer(steps=8, eval_every=2)
    evaluating.run()
    plain, seen_plain = make_trainer(steps=8, eval_every=0)
    plain.run()
    assert [r.loss for r in seen_evaluating.metrics] == [r.loss for r in seen_plain.metrics]
