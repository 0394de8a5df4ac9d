"""The trainer's loop: live changes at step boundaries, precision, clipping, evaluation, resume."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from torchlab.core.wire.observer import TrainerObserver
from trainers import TINY, make_trainer
from torchlab.core.engine.state.checkpoint import CheckpointCadence
from torchlab.core.errors import ConfigError
from torchlab.core.wire.events import Paused
from torchlab.core.wire.protocol import PauseCommand, ResumeCommand, SaveCheckpointCommand, SetCommand, StopCommand


def test_scripted_change_takes_effect_at_its_step_and_is_acknowledged():
    trainer, seen = make_trainer(steps=8, at=["5:clip=0.5", "6:accum=2"])
    outcome = trainer.run()
    assert outcome.status == "finished"
    applied = seen.of("option_applied")
    assert [(e["option"], e["step"], e["value"], e["previous"]) for e in applied] == [
        ("clip", 5, 0.5, None),
        ("accum", 6, 2, 1),
    ]
    assert seen.at(4).options.clip is None and seen.at(5).options.clip == 0.5
    assert seen.at(5).options.accum == 1 and seen.at(6).options.accum == 2
    # Clipping is reported from the step it applies: the pre-clip norm and whether it fired.
    assert seen.at(4).clipped is None and isinstance(seen.at(5).clipped, bool)
    # Two micro-batches per step from step 6: the data position advances twice as fast.
    assert trainer.data.position.samples == (5 + 3 * 2) * 16


def test_change_submitted_from_another_thread_applies_at_a_step_boundary():
    trainer, seen = make_trainer(steps=30)
    submitted_at = {}

    class SubmitOnStep3(TrainerObserver):
        def on_metrics(self, record):
            if record.step == 3:
                submitted_at["step"] = 3
                threading.Thread(target=trainer.submit, args=(SetCommand("lr_scale", "0.5", "test"),)).start()

    trainer.observers.append(SubmitOnStep3())
    trainer.run()
    [ack] = seen.of("option_applied")
    assert ack["step"] > submitted_at["step"]
    before, after = seen.at(ack["step"] - 1), seen.at(ack["step"])
    assert before.options.lr_scale == 1.0 and after.options.lr_scale == 0.5
    # The scale multiplies the schedule's LR from that step on.
    assert after.lr == pytest.approx(0.5 * trainer.scheduler.lr_lambdas[0](ack["step"] - 1) * 1e-3)


def test_invalid_changes_are_refused_with_a_reason_and_the_run_goes_on():
    trainer, seen = make_trainer(steps=6, at=["2:amp=fp16", "3:world_size=3"])
    trainer.submit(SetCommand("accum", "zero"))
    trainer.submit(SetCommand("warp_drive", "on"))
    assert trainer.run().status == "finished"
    refused = {(e["option"], e["step"]): e["reason"] for e in seen.of("option_refused")}
    assert "fp16 needs CUDA" in refused[("amp", 2)]
    assert "world size 3 does not divide the batch of 16" in refused[("world_size", 3)]
    assert "whole number" in refused[("accum", 1)]
    assert "unknown option" in refused[("warp_drive", 1)]
    assert all(record.options.amp == "off" and record.options.world_size == 1 for record in seen.metrics)


def test_world_size_limits_are_refused_with_the_reason():
    from torchlab.core.engine.parallel.distributed import check_world_size, usable_cpus
    from torchlab.core.options import OptionChangeError

    cpus = usable_cpus()
    check_world_size(cpus, device=torch.device("cpu"), batch_size=cpus * 4)
    with pytest.raises(OptionChangeError, match=f"{cpus + 1} ranks on the CPU need {cpus + 1} cores, one each; this run may use {cpus}"):
        check_world_size(cpus + 1, device=torch.device("cpu"), batch_size=(cpus + 1) * 4)
    with pytest.raises(OptionChangeError, match="world size 3 does not divide the batch of 16"):
        check_world_size(3, device=torch.device("cpu"), batch_size=16)


def test_a_world_size_change_needs_a_supervisor_to_relaunch():
    trainer, seen = make_trainer(steps=3, at=["2:world_size=2"])
    assert trainer.run().status == "finished"
    [refusal] = seen.of("option_refused")
    assert "no supervisor to relaunch its ranks" in refusal["reason"] or "cores" in refusal["reason"]


def test_a_world_size_change_checkpoints_and_ends_for_a_relaunch(tmp_path):
    trainer, seen = make_trainer(steps=8, checkpoint_dir=tmp_path, checkpoint_every=0, batch_size=16,
                                 at=["3:world_size=2", "3:clip=0.5", "4:accum=2"])
    trainer.parts.world.can_relaunch = True  # as the supervisor builds it
    outcome = trainer.run()
    assert (outcome.status, outcome.step) == ("relaunch", 2)
    assert (outcome.relaunch.value, outcome.relaunch.previous, outcome.relaunch.step) == (2, 1, 3)
    assert [e["option"] for e in seen.of("option_applied")] == ["clip"]  # world_size: acknowledged after the relaunch
    [checkpoint] = seen.of("checkpoint")
    assert (checkpoint["step"], checkpoint["reason"]) == (2, "world_size")
    assert not seen.of("run_ended")
    state = torch.load(tmp_path / "last.pt", weights_only=True)
    assert state["options"]["world_size"] == 2 and state["options"]["clip"] == 0.5
    assert state["scripted_through"] == 3  # the relaunched run applies "4:accum=2", not the changes of step 3 again


def test_a_world_size_whose_share_of_the_batch_the_split_cannot_cut_is_refused_before_the_relaunch(tmp_path):
    """Found by the combination matrix: split 16 (the OOM rescue's ladder) and a world size of 2 on a batch of 16:
    the relaunched ranks refused split 16 for their 8 samples at their start, and the run ended there (exit 2)."""
    trainer, seen = make_trainer(steps=4, checkpoint_dir=tmp_path, checkpoint_every=0, batch_size=16,
                                 options={"split": 16}, at=["2:world_size=2"])
    trainer.parts.world.can_relaunch = True
    assert trainer.run().status == "finished"  # at one rank, as it was
    [refusal] = seen.of("option_refused")
    assert refusal["option"] == "world_size" and "2 ranks would each take 8 samples a batch" in refusal["reason"]
    assert "lower split first" in refusal["reason"]


def test_a_run_paused_at_the_boundary_of_a_relaunch_hands_the_pause_to_the_relaunched_trainer(tmp_path):
    """Found by the combination matrix: the app's pause and a scripted world-size change at one boundary; the ranks
    started again trained on, and a run detached while paused finished alone."""
    from torchlab.core.wire.protocol import PauseCommand

    trainer, seen = make_trainer(steps=8, checkpoint_dir=tmp_path, checkpoint_every=0, batch_size=16,
                                 at=["1:world_size=2"])
    trainer.parts.world.can_relaunch = True
    trainer.submit(PauseCommand())  # typed while the trainer started: the first boundary's, as the --at
    assert trainer.run().status == "relaunch"
    assert seen.of("paused") and [type(c) for c in trainer.pending_commands()] == [PauseCommand]


def test_fp16_at_start_on_cpu_is_a_config_error_naming_the_flag():
    with pytest.raises(ConfigError, match=r"amp \(--amp\) fp16: fp16 needs CUDA"):
        make_trainer(steps=2, options={"amp": "fp16"})


def test_bf16_autocast_trains_on_cpu_and_keeps_parameters_fp32():
    trainer, seen = make_trainer(steps=6, at=["3:amp=bf16"])
    trainer.run()
    assert [r.options.amp for r in seen.metrics] == ["off", "off", "bf16", "bf16", "bf16", "bf16"]
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert all(math.isfinite(r.loss) for r in seen.metrics)


def test_checkpointing_toggles_in_place_without_renaming_parameters():
    trainer, seen = make_trainer(steps=6, at=["2:checkpointing=on", "5:checkpointing=off"])
    names_before = [name for name, _ in trainer.model.named_parameters()]
    trainer.run()
    assert [r.options.checkpointing for r in seen.metrics] == [False, True, True, True, False, False]
    assert [name for name, _ in trainer.model.named_parameters()] == names_before
    assert not any("forward" in vars(block) for block in trainer.parts.model.checkpointing.blocks.values())


def test_checkpointing_refused_when_the_model_has_no_blocks():
    trainer, seen = make_trainer(f"{TINY.rsplit(':', 1)[0]}:no_checkpoint_blocks", steps=2, at=["1:checkpointing=on"])
    trainer.run()
    [refusal] = seen.of("option_refused")
    assert "no checkpoint blocks" in refusal["reason"]


def test_pause_holds_at_a_boundary_and_resume_continues():
    trainer, seen = make_trainer(steps=5)
    resumed = threading.Event()

    class PauseAtStep2(TrainerObserver):
        def on_metrics(self, record):
            if record.step == 2:
                trainer.submit(PauseCommand())

        def on_event(self, event):
            if isinstance(event, Paused):
                # The loop is now blocked waiting for a command; no step runs until Resume arrives.
                assert len(seen.metrics) == 2
                threading.Thread(target=lambda: (trainer.submit(ResumeCommand()), resumed.set())).start()

    trainer.observers.append(PauseAtStep2())
    assert trainer.run().status == "finished"
    assert resumed.is_set()
    assert [e["event"] for e in seen.events if e["event"] in ("paused", "resumed")] == ["paused", "resumed"]
    assert seen.of("paused")[0]["step"] == 2 and seen.of("resumed")[0]["step"] == 3


def test_stop_request_ends_the_run_with_a_final_checkpoint(tmp_path):
    trainer, seen = make_trainer(steps=50, checkpoint_dir=tmp_path, checkpoint_every=0)

    class StopAtStep4(TrainerObserver):
        def on_metrics(self, record):
            if record.step == 4:
                trainer.submit(StopCommand("test"))

    trainer.observers.append(StopAtStep4())
    outcome = trainer.run()
    assert (outcome.status, outcome.step) == ("stopped", 4)
    [checkpoint] = seen.of("checkpoint")
    assert checkpoint["step"] == 4 and (tmp_path / "last.pt").exists()


def test_save_checkpoint_command_writes_one_at_the_boundary(tmp_path):
    trainer, seen = make_trainer(steps=3, checkpoint_dir=tmp_path, checkpoint_every=0)
    trainer.submit(SaveCheckpointCommand())  # before step 1: nothing trained yet, nothing to save
    trainer.run()
    assert [e["reason"] for e in seen.of("checkpoint")] == ["final"]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_auto_checkpoints_fall_on_every_100th_step_once_a_minute_and_100_times_their_cost_have_passed():
    clock = FakeClock()
    cadence = CheckpointCadence("auto", clock=clock)
    clock.now += 59
    assert not cadence.due(100)  # 59 s after the start: a crash would lose under a minute
    clock.now += 1
    assert not cadence.due(150) and cadence.due(200)  # on a multiple of 100 only
    cadence.record(2.0)  # that one took 2 s of training: the next waits 200 s, not 60
    clock.now += 100
    assert not cadence.due(300)
    clock.now += 100
    assert cadence.due(400)
    cadence.record(0.01)
    clock.now += 60
    assert cadence.due(500)


@pytest.mark.parametrize(("every", "due"), [(7, [7, 14, 21]), (0, [])])
def test_a_fixed_checkpoint_cadence_is_every_nth_step_whatever_the_time(every, due):
    cadence = CheckpointCadence(every, clock=FakeClock())
    assert [step for step in range(1, 22) if cadence.due(step)] == due


def test_a_fast_run_with_the_default_cadence_writes_no_periodic_checkpoint_in_its_first_minute(tmp_path):
    trainer, seen = make_trainer(steps=210, checkpoint_dir=tmp_path)  # a few seconds: steps 100 and 200 are due by count
    assert trainer.config.checkpoint_every == "auto"
    trainer.run()
    assert [(e["step"], e["reason"]) for e in seen.of("checkpoint")] == [(210, "final")]


def test_validation_loss_is_reported_on_eval_steps():
    trainer, seen = make_trainer(steps=6, eval_every=3)
    trainer.run()
    assert [r.step for r in seen.metrics if r.val_loss is not None] == [3, 6]
    assert all(r.val_loss > 0 for r in seen.metrics if r.val_loss is not None)
    assert trainer.model.training


def test_metrics_carry_the_documented_keys():
    trainer, seen = make_trainer(steps=2)
    trainer.run()
    required = {"step", "loss", "lr", "samples_per_s", "step_time_s", "grad_norm_total", "grad_norms",
                "amp", "checkpointing", "clip", "accum", "world_size"}
    assert required <= set(seen.metrics[0].json_object())  # as metrics.jsonl has them
    assert set(seen.metrics[0].grad_norms) == set(trainer.instruments.grad_probe.module_names)


def test_sgd_and_onecycle_schedule_train():
    trainer, seen = make_trainer(steps=20, optimizer="sgd", schedule="onecycle", lr=0.05)
    trainer.run()
    lrs = [r.lr for r in seen.metrics]
    assert lrs.index(max(lrs)) == pytest.approx(6, abs=1)  # peak at 30 % of the run
    assert seen.metrics[-1].loss < seen.metrics[0].loss
