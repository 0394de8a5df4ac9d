"""A LightningModule trained as it is (core/engine/adapters/from_lightning.py): its training_step, its logged metrics, its
optimizer's groups and step scheduler, its data loaders and validation; the live options on it; what the engine
cannot honour refused with the reason."""

from __future__ import annotations

import pytest

pytest.importorskip("lightning")

from trainers import WORKLOADS, make_trainer  # noqa: E402
from torchlab.core.engine.state.checkpoint import load_checkpoint  # noqa: E402
from torchlab.core.engine.adapters.loading import load_workload  # noqa: E402
from torchlab.core.errors import WorkloadError  # noqa: E402

LIGHTNING = WORKLOADS / "lightning_module.py"


def reference_lrs(steps: int) -> list[tuple[float, float]]:
    """The LRs the module's own optimizer and scheduler give each step, stepped as Lightning steps them."""
    import lightning_module

    configured = lightning_module.Regressor().configure_optimizers()
    optimizer, scheduler = configured["optimizer"], configured["lr_scheduler"]["scheduler"]
    lrs = []
    for _ in range(steps):
        lrs.append(tuple(group["lr"] for group in optimizer.param_groups))
        optimizer.step()
        scheduler.step()
    return lrs


def test_a_lightning_module_trains_with_its_own_step_metrics_groups_and_step_scheduler(tmp_path):
    trainer, seen = make_trainer(f"{LIGHTNING}:module", steps=6, eval_every=3, checkpoint_dir=tmp_path,
                                 at=["3:amp=bf16", "4:checkpointing=on"])
    trainer.run()
    rows = seen.metrics
    assert [row.step for row in rows] == list(range(1, 7))
    assert all(set(row.metrics) == {"train_mae"} and row.metrics["train_mae"] > 0 for row in rows)
    assert [tuple(row.lrs.values()) for row in rows] == pytest.approx(reference_lrs(6))  # warm-up per step, per group
    assert list(rows[0].lrs) == ["body", "head"]
    evaluated = [row for row in rows if row.val_loss is not None]
    # validation_step logged val_mae: reported so (not as "train_mae", the training metric's name), and shown so
    assert [row.step for row in evaluated] == [3, 6] and all(set(row.val_metrics) == {"val_mae"} for row in evaluated)
    assert [(row.options.amp, row.options.checkpointing) for row in rows][2:4] == [("bf16", False), ("bf16", True)]
    saved = load_checkpoint(tmp_path / "last.pt")
    assert list(saved["model"]) == [f"body.{i}.0.{p}" for i in range(3) for p in ("weight", "bias")] + ["head.weight", "head.bias"]
    assert type(trainer.parts.model.model).__name__ == "Regressor"


def test_a_resume_continues_the_modules_schedule_where_it_was(tmp_path):
    """Stopped at step 3 and resumed with --steps 6: the LRs of steps 4-6 are those of a run that never stopped (the
    warm-up, a chainable LinearLR, replayed from its start, not from the checkpoint's LR); extended live, the
    scheduler is made again by configure_optimizers and moved onto the optimizer training holds."""
    first, _ = make_trainer(f"{LIGHTNING}:module", steps=3, checkpoint_dir=tmp_path)
    first.run()
    resumed, seen = make_trainer(f"{LIGHTNING}:module", steps=6, checkpoint_dir=tmp_path, resume_from=tmp_path / "last.pt")
    resumed.run()
    assert [tuple(row.lrs.values()) for row in seen.metrics] == pytest.approx(reference_lrs(6)[3:])
    extended, seen = make_trainer(f"{LIGHTNING}:module", steps=3, at=["3:steps=7"])  # the live steps: made again
    extended.run()
    assert [tuple(row.lrs.values()) for row in seen.metrics] == pytest.approx(reference_lrs(7))


def test_a_data_module_beside_it_feeds_it_and_no_scheduler_keeps_the_lr():
    workload = load_workload(f"{LIGHTNING}:with_data_module")
    assert len(workload.dataset) == 128 and len(workload.val_dataset) == 32 and workload.batch_size == 8
    trainer, seen = make_trainer(f"{LIGHTNING}:without_scheduler", steps=3)
    trainer.run()
    assert {tuple(row.lrs.values()) for row in seen.metrics} == {(1e-2, 1e-3)}  # Lightning's: constant


def test_configure_optimizers_reads_the_runs_plan_from_self_trainer():
    """OneCycleLR over self.trainer.estimated_stepping_batches: the run's --steps, and the new total when it grows."""
    trainer, seen = make_trainer(f"{LIGHTNING}:one_cycle", steps=10, at=["6:steps=20"])
    trainer.run()
    import lightning_module

    reference = lightning_module.OneCycle()
    reference._trainer = type("Plan", (), {"estimated_stepping_batches": 10})()
    configured = reference.configure_optimizers()
    optimizer, scheduler = configured["optimizer"], configured["lr_scheduler"]["scheduler"]
    planned = []
    for _ in range(5):
        planned.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    lrs = [row.lr for row in seen.metrics]
    assert lrs[:5] == pytest.approx(planned) and len(lrs) == 20
    assert lrs[9] < lrs[5] and lrs[19] < lrs[9]  # the cycle over 20 steps, from step 6 on: not ended at 10


def test_a_torchmetrics_metric_logged_as_itself_is_its_value_on_the_steps_batch():
    trainer, seen = make_trainer(f"{LIGHTNING}:with_torchmetrics", steps=3)
    trainer.run()
    assert all(row.metrics["metric_mae"] == pytest.approx(row.metrics["train_mae"], rel=1e-5) for row in seen.metrics)


def test_self_global_step_and_current_epoch_are_the_runs_and_batch_idx_counts_within_the_epoch():
    """256 samples in batches of 16: 16 steps an epoch; global_step is the optimizer steps taken before this one."""
    trainer, seen = make_trainer(f"{LIGHTNING}:reads_its_position", steps=20)
    trainer.run()
    said = [(row.metrics["global_step"], row.metrics["epoch"], row.metrics["batch_idx"]) for row in seen.metrics]
    assert said == [(step, step // 16, step % 16) for step in range(20)]


@pytest.mark.parametrize("factory, said", [
    ("manual", "automatic_optimization = False (manual optimization"),
    ("clips_itself", "overrides configure_gradient_clipping(), a hook the engine does not call"),
])
def test_what_the_engine_cannot_honour_is_refused_naming_the_hook(factory, said):
    with pytest.raises(WorkloadError, match=said.replace("(", r"\(").replace(")", r"\)")):
        load_workload(f"{LIGHTNING}:{factory}")


def test_a_scheduler_of_lightnings_default_interval_steps_once_an_epoch():
    """([optimizer], [scheduler]) says no interval: Lightning's default, "epoch" (256 samples, batches of 16)."""
    import lightning_module

    trainer, seen = make_trainer(f"{LIGHTNING}:epoch_scheduler", steps=36)
    trainer.run()
    [optimizer], [scheduler] = lightning_module.Regressor("epoch").configure_optimizers()
    planned = []
    for _ in range(3):
        planned += [tuple(group["lr"] for group in optimizer.param_groups)] * 16
        optimizer.step()
        scheduler.step()
    assert [tuple(row.lrs.values()) for row in seen.metrics] == pytest.approx(planned[:36])


@pytest.mark.parametrize("factory, said", [
    ("two_optimizers", "returned 2 optimizers (SGD, SGD); the engine steps one optimizer"),
    ("reads_the_logger", "self.trainer.logger: the workbench trains this module without Lightning's Trainer"),
])
def test_what_configure_optimizers_gives_that_the_engine_cannot_take_is_refused_as_the_run_starts(factory, said):
    with pytest.raises(WorkloadError, match=said.replace("(", r"\(").replace(")", r"\)")):
        make_trainer(f"{LIGHTNING}:{factory}", steps=2)


def test_checkpointing_wraps_a_cnns_conv_stages_or_the_blocks_the_module_names():
    """The classifier holds most of the parameters (its flattened Linear), the largest container by them: c wrapped
    its Flatten/ReLU/Dropout/Linear (issue 45). A LightningModule's blocks are the children that hold parameters of
    the container with the most of them; its own checkpoint_blocks attribute chooses others."""
    trainer, seen = make_trainer(f"{LIGHTNING}:cnn", steps=2, at=["2:checkpointing=on"])
    trainer.run()
    assert trainer.parts.model.checkpointing.wrapped_names() == ["features.0", "features.1", "features.2"]
    assert load_workload(f"{LIGHTNING}:cnn_naming_its_blocks").checkpoint_blocks == ["features.1", "features.2"]
