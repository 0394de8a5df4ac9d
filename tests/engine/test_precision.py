"""Precision objects and the fp16 GradScaler they keep, exercised on the CPU.

fp16 is refused on a CPU run (``make_precision``), so these tests build the fp16 precision by hand with a
CPU GradScaler, or give ``Precisions`` a CUDA device it never touches: the scaler's logic (skip on
overflow, lower the scale, keep it across modes and checkpoints) is the same on either device.
"""

from __future__ import annotations

import pytest
import torch

from trainers import WORKLOADS, make_trainer
from torchlab.core.engine.state.checkpoint import load_checkpoint, save_checkpoint
from torchlab.core.engine.precision import FP16Precision, Precisions
from torchlab.core.options import OptionChangeError

CPU = torch.device("cpu")
#: A scaler's state as a checkpoint holds it, with a scale no fresh scaler has.
LOWERED_SCALER_STATE = {"scale": 1024.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000, "_growth_tracker": 7}


def _one_step(precision: FP16Precision, model: torch.nn.Module, optimizer: torch.optim.Optimizer, poison: float) -> bool:
    with precision.autocast():
        loss = model(torch.ones(2, 4)).float().mean() * poison
    precision.backward(loss)
    precision.unscale_(optimizer)
    stepped = precision.step(optimizer)
    optimizer.zero_grad(set_to_none=True)
    return stepped


def test_fp16_skips_a_step_whose_gradients_overflow_and_reports_the_lowered_scale():
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    precision = FP16Precision(CPU, torch.amp.GradScaler("cpu"))
    before = [p.detach().clone() for p in model.parameters()]

    assert _one_step(precision, model, optimizer, poison=float("inf")) is False
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))  # the step never happened
    assert precision.skipped_step() == {"reason": "fp16 overflow: the scaler lowered its scale", "scale": 2.0**15}

    assert _one_step(precision, model, optimizer, poison=1.0) is True
    assert not all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert precision.scaler.get_scale() == 2.0**15  # a finite step keeps the scale


def test_no_grad_scaler_exists_until_fp16_is_chosen_and_a_refused_fp16_makes_none():
    precisions = Precisions(CPU)
    assert [precisions.make(name).name for name in ("off", "bf16")] == ["off", "bf16"]
    with pytest.raises(OptionChangeError, match="fp16 needs CUDA"):
        precisions.make("fp16")
    assert precisions.state_dict() is None  # what a checkpoint of this run holds under "grad_scaler"


def test_the_grad_scaler_is_kept_across_switching_fp16_off_and_on(monkeypatch):
    # A CUDA device that is never touched: the scaler makes its tensors lazily, at its first scale().
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    precisions = Precisions(torch.device("cuda"))
    first = precisions.make("fp16")
    first.scaler.load_state_dict(LOWERED_SCALER_STATE)  # as if overflows had lowered it

    assert precisions.make("off").name == "off"
    assert precisions.state_dict() == LOWERED_SCALER_STATE  # still saved in checkpoints while fp16 is off
    again = precisions.make("fp16")
    assert again.scaler is first.scaler and again.scaler.get_scale() == 1024.0


def test_a_checkpoints_grad_scaler_is_restored_and_saved_again_while_fp16_is_off(tmp_path):
    for name in ("first", "fp16", "resumed"):
        (tmp_path / name).mkdir()
    first, _ = make_trainer(steps=2, checkpoint_dir=tmp_path / "first")
    first.run()
    state = load_checkpoint(tmp_path / "first" / "last.pt")
    assert state["grad_scaler"] is None  # this run never chose fp16
    # A checkpoint of a run that trained in fp16 (on a GPU) and switched it off before step 2.
    save_checkpoint(tmp_path / "fp16", 2, {**state, "grad_scaler": LOWERED_SCALER_STATE}, keep=1)

    resumed, _ = make_trainer(steps=4, checkpoint_dir=tmp_path / "resumed", resume_from=tmp_path / "fp16" / "last.pt")
    assert resumed.run().status == "finished"
    assert load_checkpoint(tmp_path / "resumed" / "last.pt")["grad_scaler"] == LOWERED_SCALER_STATE


# PyTorch's warning when the first optimizer step was skipped (as GradScaler does on overflow).
@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before `optimizer.step\\(\\)`")
def test_an_fp16_overflow_skips_the_step_and_reports_the_scale_until_too_many_in_a_row():
    trainer, seen = make_trainer(f"{WORKLOADS / 'tiny.py'}:nan_in_backward", steps=40)
    # fp16 is refused on this CPU run; the loop is the same whatever built the precision.
    trainer.parts.precisions.current = FP16Precision(CPU, torch.amp.GradScaler("cpu"))
    before = [p.detach().clone() for p in trainer.model.parameters()]

    outcome = trainer.run()
    skipped = seen.of("step_skipped")
    assert [e["scale"] for e in skipped[:3]] == [2.0**15, 2.0**14, 2.0**13]
    assert skipped[0]["reason"] == "fp16 overflow: the scaler lowered its scale"
    assert all(record.skipped for record in seen.metrics)
    assert all(torch.equal(a, p) for a, p in zip(before, trainer.model.parameters()))
    # Routine for a while; 25 skips in a row means the model itself makes NaN: then it is an error.
    assert len(skipped) == 25 and outcome.status == "nonfinite" and outcome.step == 25
    [report] = seen.of("nonfinite")
    assert (report["phase"], report["module"]) == ("backward", "extra")
