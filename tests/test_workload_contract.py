"""A workload's own optimizer (parameter groups), scheduler and metrics (issue 15): trained with, reported,
scaled live without compounding, resumed bit for bit; a contract broken gets one clear paragraph."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from trainers import WORKLOADS, make_trainer
from workloads.own_training import onecycle_head_lrs
from torchlab.core.errors import EXIT_OK, EXIT_USAGE
from torchlab.core.errors import WorkloadError
from torchlab.core.launch.cli import main

OWN = WORKLOADS / "own_training.py"
BODY_LR, HEAD_LR, ETA_MIN = 0.05, 0.2, 0.001


def cosine(base: float, step: int, total: int) -> float:
    """CosineAnnealingLR's closed form: the LR the step after ``step`` completed steps uses."""
    return ETA_MIN + (base - ETA_MIN) * (1 + math.cos(math.pi * step / total)) / 2


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_workloads_optimizer_scheduler_and_accuracy_train_and_are_reported():
    trainer, seen = make_trainer(f"{OWN}:workload", steps=40, eval_every=20, checkpoint_every=0)
    trainer.run()
    first, last = seen.metrics[0], seen.metrics[-1]
    assert [group["name"] for group in trainer.optimizer.param_groups] == ["body", "head"]
    assert first.lrs == {"body": pytest.approx(BODY_LR), "head": pytest.approx(HEAD_LR)} and first.lr == first.lrs["body"]
    assert last.lrs["head"] == pytest.approx(cosine(HEAD_LR, 39, 40), rel=1e-12)
    assert set(first.metrics) == {"accuracy"} and 0 <= first.metrics["accuracy"] <= 1
    assert last.metrics["accuracy"] > 0.8 > first.metrics["accuracy"]  # it learns, and the figure follows
    evaluated = seen.at(40)
    assert set(evaluated.val_metrics) == {"accuracy"} and evaluated.val_metrics["accuracy"] > 0.8
    assert seen.at(39).val_metrics is None


def test_lr_scale_multiplies_every_groups_scheduled_lr_without_feeding_back_into_a_chainable_schedule():
    trainer, seen = make_trainer(f"{OWN}:workload", steps=30, checkpoint_every=0, at=["11:lr_scale=0.5", "21:lr_scale=1"])
    trainer.run()
    for row in seen.metrics:
        scale = 0.5 if 11 <= row.step <= 20 else 1.0
        for name, base in (("body", BODY_LR), ("head", HEAD_LR)):
            assert row.lrs[name] == pytest.approx(scale * cosine(base, row.step - 1, 30), rel=1e-9), (row.step, name)


def test_the_metrics_are_the_mean_over_micro_batches():
    whole, seen_whole = make_trainer(f"{OWN}:workload", steps=1, batch_size=64, checkpoint_every=0)
    whole.run()
    halves, seen_halves = make_trainer(f"{OWN}:workload", steps=1, batch_size=32, checkpoint_every=0, options={"accum": 2})
    halves.run()
    # The same 64 samples, as one batch or two micro-batches of 32: the same accuracy (a mean of equal halves).
    assert seen_halves.metrics[0].metrics["accuracy"] == pytest.approx(seen_whole.metrics[0].metrics["accuracy"])


def test_a_run_with_its_own_optimizer_and_scheduler_resumes_bit_for_bit(tmp_path):
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    settings = [f"{OWN}:workload", "--headless", "--eval-every", "0", "--at", "4:lr_scale=0.5"]
    assert main([*settings, "--steps", "16", "--run-dir", str(straight)]) == EXIT_OK
    assert main([*settings, "--steps", "16", "--checkpoint-every", "8", "--run-dir", str(stopped)]) == EXIT_OK
    resumed = tmp_path / "resumed"
    assert main(["--resume", str(stopped / "checkpoints" / "step-0000008.pt"), "--headless", "--run-dir", str(resumed)]) == EXIT_OK
    expected = {row["step"]: row for row in rows(straight)}
    for row in rows(resumed):
        want = expected[row["step"]]
        assert (row["loss"], row["lrs"], row["metrics"]) == (want["loss"], want["lrs"], want["metrics"]), row["step"]


def test_a_resume_with_more_steps_builds_the_workloads_scheduler_for_the_new_total(tmp_path):
    """OneCycleLR raises once stepped past its total: the schedule is the factory's for the new total."""
    run = tmp_path / "run"
    assert main([f"{OWN}:onecycle", "--headless", "--steps", "10", "--eval-every", "0", "--run-dir", str(run)]) == EXIT_OK
    assert main(["--resume", str(run), "--headless", "--steps", "20"]) == EXIT_OK
    planned = onecycle_head_lrs(20)
    after = [row for row in rows(run) if row["step"] > 10]
    assert [row["step"] for row in after] == list(range(11, 21))
    assert [row["lrs"]["head"] for row in after] == pytest.approx(planned[10:], rel=1e-9)


@pytest.mark.parametrize("factory, message", [
    ("not_an_optimizer", "Workload.optimizer must return a torch.optim.Optimizer, got str."),
    ("optimizer_of_another_model", "returned an optimizer over 6 tensor(s) that are not the model's parameters"),
    ("on_plateau", "Workload.scheduler returned ReduceLROnPlateau, which steps on a metric"),
])
def test_an_optimizer_or_scheduler_that_breaks_the_contract_is_refused_in_words(factory, message):
    with pytest.raises(WorkloadError, match=None) as raised:
        make_trainer(f"{OWN}:{factory}", steps=2)
    assert message in str(raised.value) and "own_training.py" in str(raised.value)


@pytest.mark.parametrize("factory, message", [
    ("metrics_that_change", "loss_fn returned the metrics accuracy on the first step and acc on step 3"),
    ("metric_not_scalar", "loss_fn's metric 'correct' must be a scalar, got a tensor of shape [32]"),
])
def test_metrics_that_break_the_contract_stop_the_run_with_one_paragraph(tmp_path, capsys, factory, message):
    assert main([f"{OWN}:{factory}", "--headless", "--steps", "5", "--run-dir", str(tmp_path / "run")]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert message in " ".join(err.split()) and "Traceback" not in err


@pytest.mark.parametrize("flags, message", [
    (["--lr", "0.01"], "lr (--lr) 0.01: this workload gives its own optimizer"),
    (["--schedule", "onecycle"], "schedule (--schedule) 'onecycle': this workload gives its own scheduler"),
])
def test_a_setting_the_workloads_own_optimizer_or_scheduler_replaces_is_refused_not_ignored(tmp_path, capsys, flags, message):
    assert main([f"{OWN}:workload", "--headless", "--steps", "2", *flags, "--run-dir", str(tmp_path / "run")]) == EXIT_USAGE
    assert message in " ".join(capsys.readouterr().err.split())


def test_every_field_of_workload_is_described_in_its_docstring_and_in_the_readme():
    """The contract is public API: a field a user cannot read about in either place is one they guess at (the
    README once listed collate_fn and batch_size by name only)."""
    import dataclasses
    import re

    from torchlab.core.workload import Workload

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    table_rows = {match.group(1): match.group(2) for match in re.finditer(r"^\| `(\w+)` \| [^|]+ \| (.+) \|$", readme, re.M)}
    for field in dataclasses.fields(Workload):
        assert re.search(rf"``{field.name}(\(|``)", Workload.__doc__), f"Workload's docstring does not describe {field.name}"
        assert len(table_rows.get(field.name, "")) > 20, f"README's table of Workload fields has no row for {field.name}"


def test_before_step_is_called_once_a_step_with_the_step_and_its_batchs_epoch():
    """tiny's 256 samples in batches of 16, two micro-batches a step: 8 steps an epoch; called once a step."""
    from torchlab.core.engine.adapters.loading import load_workload

    calls = []
    workload = load_workload(f"{WORKLOADS / 'tiny.py'}:workload")
    workload.before_step = lambda step, epoch: calls.append((step, epoch))
    trainer, _ = make_trainer(workload=workload, steps=10, options={"accum": "2"})
    trainer.run()
    assert calls == [(step, (step - 1) // 8) for step in range(1, 11)]


def test_no_adapted_library_is_loaded_by_a_run_that_does_not_use_it():
    """Lightning and transformers are the user's imports: loading another workload loads neither (their adapters
    recognise an object only where the user's code loaded its class)."""
    code = ("import sys; from torchlab.core.engine.adapters.loading import load_workload; load_workload('mlp'); "
            "print(*(name in sys.modules for name in ('lightning', 'pytorch_lightning', 'transformers')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "False", "False"]
