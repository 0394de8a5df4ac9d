"""The step boundary (core/engine/commands.py): commands queue from any thread and apply between optimizer steps,
each answered with the step it took effect at; scripted ``--at`` entries come through the same queue; a signalled
stop is taken alone; what is still queued when the run ends goes to the next trainer, in order."""

from __future__ import annotations

from trainers import make_trainer
from torchlab.core.wire.protocol import PauseCommand, ProfileCommand, SetCommand


def test_a_command_typed_mid_step_applies_at_the_next_boundary_with_the_step_it_took_effect_at():
    trainer, recorder = make_trainer(steps=6, at=["3:accum=2"])
    assert trainer.train_steps(1)
    trainer.submit(SetCommand("clip", "0.5", source="app"))
    assert trainer.options.clip is None  # queued: nothing changes between boundaries
    assert trainer.train_steps(2)
    applied = [(e["step"], e["option"], e["value"], e["source"]) for e in recorder.of("option_applied")]
    assert applied == [(2, "clip", 0.5, "app"), (3, "accum", 2, "--at")]
    assert trainer.options.clip == 0.5 and trainer.options.accum == 2


def test_a_signalled_stop_is_taken_alone_and_what_was_queued_is_handed_on():
    trainer, recorder = make_trainer(steps=6)
    assert trainer.train_steps(1)
    change = SetCommand("lr_scale", "0.5", source="app")
    trainer.submit(change)
    trainer.request_stop("signal")  # as a Ctrl-C handler calls it
    assert not trainer.train_steps(1)  # no step follows this boundary
    assert trainer.step == 1 and trainer.options.lr_scale == 1.0 and not recorder.of("option_applied")
    assert trainer.pending_commands() == [change]


def test_what_is_still_queued_when_the_run_ends_is_handed_on_in_order():
    trainer, _ = make_trainer(steps=6)
    commands = [SetCommand("clip", "1.0", source="app"), ProfileCommand(2, source="app"), PauseCommand()]
    for command in commands:
        trainer.submit(command)
    assert trainer.pending_commands() == commands and trainer.pending_commands() == []
