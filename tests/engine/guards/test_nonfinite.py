"""The non-finite guard stops the run and names the module where NaN/Inf first appeared."""

from __future__ import annotations

import importlib.util
import json

import torch
from torch.utils.data import TensorDataset

from trainers import WORKLOADS, make_trainer
from torchlab.core.errors import EXIT_NONFINITE, EXIT_OK
from torchlab.core.launch.cli import main
from torchlab.core.workload import Workload

TINY_FILE = WORKLOADS / "tiny.py"
FAILING_LATER_FILE = WORKLOADS / "failing_later.py"


def test_nan_in_a_forward_pass_is_localised_to_its_module(tmp_path):
    trainer, seen = make_trainer(f"{TINY_FILE}:nan_in_forward", steps=20, checkpoint_dir=tmp_path, checkpoint_every=2)
    outcome = trainer.run()
    assert outcome.status == "nonfinite" and outcome.step == 5
    [report] = seen.of("nonfinite")
    assert (report["step"], report["phase"], report["module"]) == (6, "forward", "extra")
    assert "extra" in outcome.message
    # The parameters never saw the NaN step, and the step before it is checkpointed: the last good one.
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert [(e["step"], e["reason"]) for e in seen.of("checkpoint")] == [(2, "periodic"), (4, "periodic"), (5, "nonfinite")]


def test_a_nonfinite_stop_keeps_the_step_before_and_says_how_to_resume_it_with_a_lower_lr(tmp_path, capsys):
    """Issue 45: NaN at step 6 with --checkpoint-every 50 left checkpoints/ empty, exit 3, no hint. Now step 5 is
    checkpointed, the message names it and the resume line, and that line resumes (the poison, a counter of the
    process's forwards, is gone in a new one) and finishes at half the LR scale."""
    runs = tmp_path / "runs"
    argv = ["--headless", "--runs-root", str(runs)]
    assert main([f"{TINY_FILE}:nan_in_forward", "--steps", "10", "--checkpoint-every", "50", *argv]) == EXIT_NONFINITE
    [run_dir] = runs.iterdir()
    said = " ".join(capsys.readouterr().err.split())  # the console wraps long lines
    kept = run_dir / "checkpoints" / "step-0000005.pt"
    assert kept.exists()
    assert f"The weights of step 5, before it, are in {kept}; resume from them with a lower LR: " in said
    line = f"torchlab-tui --resume {run_dir} --lr-scale 0.5"
    assert line in said
    assert main([*line.split()[1:], *argv]) == EXIT_OK
    rows = [json.loads(text) for text in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == list(range(1, 11)) and rows[-1]["lr_scale"] == 0.5


def test_weights_that_give_a_nonfinite_forward_again_after_the_resume_send_the_user_to_an_earlier_checkpoint(tmp_path, capsys):
    """The resume line a non-finite stop prints ran into the same non-finite forward at its first step, and said
    again 'resume from them with a lower LR', which cannot help: the forward comes before any update. It now says so,
    and gives the line that resumes the checkpoint before them into a branch."""
    runs = tmp_path / "runs"
    argv = ["--headless", "--runs-root", str(runs)]
    workload = f"{FAILING_LATER_FILE}:nonfinite_forward_from_step_6"
    assert main([workload, "--steps", "10", "--checkpoint-every", "3", *argv]) == EXIT_NONFINITE
    [run_dir] = runs.iterdir()
    capsys.readouterr()
    assert main(["--resume", str(run_dir), "--lr-scale", "0.5", *argv]) == EXIT_NONFINITE
    said = " ".join(capsys.readouterr().err.split())
    earlier = run_dir / "checkpoints" / "step-0000003.pt"
    assert ("The weights of step 5, which this run resumed from, give a non-finite forward too: a lower LR acts only "
            "after a forward and cannot mend them; go back to an earlier checkpoint with a lower LR: torchlab-tui "
            f"--resume {earlier} --run-dir {run_dir}-from-3 --lr-scale 0.25") in said


def test_nan_made_in_a_backward_pass_names_the_module_whose_backward_made_it():
    trainer, seen = make_trainer(f"{TINY_FILE}:nan_in_backward", steps=5, probe_every=1)
    outcome = trainer.run()
    assert outcome.status == "nonfinite" and outcome.step == 0
    [report] = seen.of("nonfinite")
    assert (report["step"], report["phase"], report["module"]) == (1, "backward", "extra")
    assert report["loss"] is not None and report["grad_norm_total"] != report["grad_norm_total"]  # NaN


def test_nan_in_input_data_is_blamed_on_the_data():
    spec = importlib.util.spec_from_file_location("tiny_for_nan_input", TINY_FILE)
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    inputs = torch.randn(32, 8)
    inputs[:, 3] = float("nan")
    workload = Workload(model=tiny.TinyNet(), dataset=TensorDataset(inputs, torch.randn(32, 1)), loss_fn=tiny.mse_loss)
    trainer, seen = make_trainer(workload=workload, steps=3, batch_size=8)
    assert trainer.run().status == "nonfinite"
    assert seen.of("nonfinite")[0]["phase"] == "input"


def test_nan_made_in_a_backward_pass_is_localised_when_loss_fn_returns_metrics_too():
    """The guard's replay backpropagates the loss alone: a loss_fn returning {"loss": ..., "error": ...} once made
    the replay fail with "'dict' object has no attribute 'detach'" instead of naming the module."""
    spec = importlib.util.spec_from_file_location("tiny_for_nan_metrics", TINY_FILE)
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    reference = tiny.nan_in_backward()

    def loss_and_error(model, batch):
        loss = tiny.mse_loss(model, batch)
        return {"loss": loss, "error": loss.detach().sqrt()}

    workload = Workload(model=reference.model, dataset=reference.dataset, loss_fn=loss_and_error, batch_size=16)
    trainer, seen = make_trainer(workload=workload, steps=5, probe_every=1)
    assert trainer.run().status == "nonfinite"
    [report] = seen.of("nonfinite")
    assert (report["step"], report["phase"], report["module"]) == (1, "backward", "extra")
