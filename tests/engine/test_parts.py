"""The trainer's parts own their state: each part's ``state_dict`` loads back into it (``load_state_dict``) and
training goes on as from the state it was taken at; the checkpoint is what they return, as one typed record
(core/engine/parts.py, core/engine/state/checkpoint_contents.py)."""

from __future__ import annotations

import dataclasses
import io
import random

import pytest
import torch

from trainers import make_trainer
from torchlab.core.engine.state.checkpoint_contents import _OPTIONAL_PARTS, _PARTS, TrainingState, saved_world_size
from torchlab.core.engine.data import BatchStream
from torchlab.core.engine.optimization import Optimization
from torchlab.core.engine.parts import Progress, RandomStates
from torchlab.core.engine.precision import Precisions
from torchlab.core.errors import ConfigError
from torchlab.core.options import OptionChangeError

SCALER_STATE = {"scale": 1024.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000, "_growth_tracker": 7}


def _losses(trainer, steps: int) -> list[float]:
    """The loss of each of the next ``steps`` training steps, as the step reports it."""
    return [trainer.train_step(trainer.instruments.plan(trainer.step + 1)).loss for _ in range(steps)]


def test_progress_round_trip_keeps_the_step_the_scripted_step_and_the_training_time():
    progress = Progress()
    progress.step, progress.scripted_through = 41, 42
    state = progress.state_dict()
    assert (state["step"], state["scripted_through"]) == (41, 42) and state["elapsed_s"] >= 0
    resumed = Progress()
    resumed.load_state_dict({**state, "elapsed_s": 100.0})
    assert (resumed.step, resumed.scripted_through, resumed.first_step_of_process) == (41, 42, 42)
    assert 100.0 <= resumed.elapsed() < 101.0  # the earlier processes' time, and this one's from its start


def test_random_states_round_trip_replays_the_same_numbers_and_a_batch_drawn_ahead_is_drawn_again():
    data = BatchStream(torch.utils.data.TensorDataset(torch.arange(8.0)), batch_size=2, collate_fn=None, seed=0,
                       device=torch.device("cpu"))
    states = RandomStates(data)
    saved = states.state_dict()
    drawn = (random.random(), torch.rand(3).tolist())
    states.load_state_dict(saved)
    assert (random.random(), torch.rand(3).tolist()) == drawn
    states.load_state_dict(saved)
    data.peek_batch()
    random.random(), torch.rand(3)  # as a dataset's __getitem__ would draw
    held = states.state_dict()  # the batch at the position waits to be taken: the states from before it was drawn
    states.load_state_dict(held)
    data.load_state_dict(data.state_dict())
    assert (random.random(), torch.rand(3).tolist()) == drawn


def test_precision_round_trip_keeps_the_grad_scaler_and_none_drops_one_made_since():
    precisions = Precisions(torch.device("cpu"))
    assert precisions.state_dict() is None and precisions.current.name == "off"
    precisions.load_state_dict(SCALER_STATE)
    assert precisions.state_dict() == SCALER_STATE
    again = Precisions(torch.device("cpu"))
    again.load_state_dict(precisions.state_dict())
    assert again.state_dict() == SCALER_STATE
    again.load_state_dict(None)  # a snapshot from before fp16 was chosen: the scaler made since goes
    assert again.state_dict() is None


def test_data_round_trip_gives_the_same_next_batches():
    dataset = torch.utils.data.TensorDataset(torch.arange(40.0).reshape(40, 1))
    stream = BatchStream(dataset, batch_size=4, collate_fn=None, seed=3, device=torch.device("cpu"))
    for _ in range(12):  # into the second epoch
        stream.next_batch()
    state = stream.state_dict()
    expected = [stream.next_batch()[0].tolist() for _ in range(3)]
    resumed = BatchStream(dataset, batch_size=4, collate_fn=None, seed=3, device=torch.device("cpu"))
    resumed.load_state_dict(state)
    assert state == {"epoch": 1, "samples": 8, "longest_batch": {"elements": 4, "shapes": [[4, 1]]}}
    assert [resumed.next_batch()[0].tolist() for _ in range(3)] == expected
    assert resumed.take_wait() >= 0 and resumed.take_wait() == 0.0  # what it made its caller wait, taken once


def test_optimization_round_trip_restores_moments_and_schedule_under_the_scale_in_force():
    def optimization() -> Optimization:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
        return Optimization(optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5))

    first = optimization()
    for _ in range(3):
        sum(parameter.square().sum() for parameter in first.optimizer.param_groups[0]["params"]).backward()
        first.optimizer.step()
        first.optimizer.zero_grad()
        first.step_schedule(finished_epoch=False)
    state = first.state_dict()
    second = optimization()
    second.scale_lr(0.5)
    second.load_state_dict(state)
    assert second.scheduler.last_epoch == 3 and second.lrs.scheduled == first.lrs.scheduled == [0.05]
    assert second.optimizer.param_groups[0]["lr"] == 0.025  # the schedule's LR, times the scale in force
    moments = [torch.equal(a["exp_avg"], b["exp_avg"]) for a, b in zip(first.optimizer.state.values(), second.optimizer.state.values())]
    assert moments == [True, True]


def test_the_options_round_trip_enacts_what_differs_and_a_refused_one_changes_nothing():
    trainer, _ = make_trainer(steps=20)
    trainer.train_steps(2)
    options = trainer.checkpoints.states["options"]
    saved = options.state_dict()
    scheduled = trainer.parts.optimization.lrs.scheduled[0]
    options.load_state_dict({**saved, "lr_scale": 0.25, "checkpointing": True})
    assert trainer.options.lr_scale == 0.25 and trainer.optimizer.param_groups[0]["lr"] == 0.25 * scheduled
    assert trainer.parts.model.checkpointing.wrapped_blocks()  # enacted, not only held
    options.load_state_dict(saved)
    assert trainer.options.as_dict() == saved and trainer.optimizer.param_groups[0]["lr"] == scheduled
    assert trainer.parts.model.checkpointing.wrapped_blocks() == []
    with pytest.raises(OptionChangeError, match="fp16 needs CUDA"):
        options.load_state_dict({**saved, "amp": "fp16"})
    assert options.state_dict() == saved and trainer.parts.precisions.current.name == "off"


def test_a_snapshot_put_back_trains_on_as_if_the_steps_after_it_never_ran():
    trainer, _ = make_trainer(steps=20, options={"clip": "0.5"})
    trainer.train_steps(3)
    snapshot = trainer.checkpoints.snapshot()
    ahead = _losses(trainer, 4)
    trainer.checkpoints.restore(snapshot)
    assert _losses(trainer, 4) == ahead  # the same weights, moments, LR, random numbers and batches
    trainer.checkpoints.restore(snapshot)  # as often as needed: the snapshot itself is never trained on
    assert _losses(trainer, 4) == ahead


def test_the_checkpoint_is_what_the_parts_return_as_one_record(tmp_path):
    trainer, _ = make_trainer(steps=20, options={"lr_scale": "0.5"})
    trainer.train_steps(5)
    state = trainer.checkpoints.state_dict()
    assert (state.step, state.options["lr_scale"], state.data) == (5, 0.5, trainer.data.state_dict())
    assert state.grad_scaler is None and state.rng_by_rank is None and "rng_by_rank" not in state.contents()
    buffer = io.BytesIO()
    torch.save({"format": 1, **state.contents()}, buffer)
    buffer.seek(0)
    read = TrainingState.read(torch.load(buffer, weights_only=True), tmp_path / "step.pt")
    assert read.step == 5 and read.config == state.config and read.optimizer["param_groups"] == state.optimizer["param_groups"]
    assert all(torch.equal(read.model[name], tensor) for name, tensor in state.model.items())


def test_the_record_has_a_field_for_each_entry_the_checks_know():
    assert [field.name for field in dataclasses.fields(TrainingState)] == [*_PARTS, *_OPTIONAL_PARTS]


def test_a_record_is_read_only_once_its_entries_are_checked(tmp_path):
    trainer, _ = make_trainer(steps=4)
    trainer.train_steps(2)
    contents = trainer.checkpoints.state_dict().contents()
    with pytest.raises(ConfigError, match="its step is 'two', where torchlab writes a whole number from 0"):
        TrainingState.read({**contents, "step": "two"}, tmp_path / "c.pt")


def test_the_saved_world_size_is_read_from_the_options_or_not_at_all():
    assert saved_world_size({"options": {"world_size": 4, "amp": "off"}}) == 4
    assert saved_world_size({"options": {"amp": "off"}}) == 1  # from before the world size was live
    assert saved_world_size({"options": {"world_size": "many"}}) is None
    assert saved_world_size(["not", "a", "checkpoint"]) is None
