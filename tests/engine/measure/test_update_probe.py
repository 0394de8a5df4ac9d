"""Optimizer health (core/engine/measure/update_probe.py): each measured step's update-to-weight ratio per module, the weight
norms and Adam's moments, in the step's own row although they are read with the next step's transfer."""

from __future__ import annotations

import pytest

from trainers import WORKLOADS, make_trainer
from torchlab.core.records.rundir import to_json_line
from torchlab.core.wire import strict_json
from torchlab.core.wire.metrics_row import MetricsRow

SETTINGS = dict(steps=5, seed=4, probe_every=1, schedule="constant", checkpoint_every=0)


def test_the_ratios_are_true_to_the_lr_a_doubled_lr_scale_doubles_every_modules_ratio():
    """AdamW's update is the LR times a normalised step (its decay too): from the same state and batch, step 5 at
    twice the LR moves every module twice as far."""
    plain, seen_plain = make_trainer(**SETTINGS)
    plain.run()
    doubled, seen_doubled = make_trainer(at=["5:lr_scale=2"], **SETTINGS)
    doubled.run()
    assert [row.update_ratios for row in seen_doubled.metrics[:4]] == [row.update_ratios for row in seen_plain.metrics[:4]]
    before, after = seen_plain.at(5).update_ratios, seen_doubled.at(5).update_ratios
    assert set(after) == set(seen_plain.at(5).grad_norms) and len(after) >= 5
    assert {name: after[name] / before[name] for name in after} == pytest.approx(dict.fromkeys(after, 2.0), rel=1e-3)
    assert all(1e-4 < ratio < 0.1 for ratio in before.values())


def test_only_measured_rows_carry_them_each_in_order_the_last_read_as_the_run_ends():
    trainer, seen = make_trainer(**{**SETTINGS, "steps": 6, "probe_every": 3})
    trainer.run()
    assert [row.step for row in seen.metrics] == list(range(1, 7))
    measured = [row.step for row in seen.metrics if row.update_ratios is not None]
    assert measured == [row.step for row in seen.metrics if row.grad_norms is not None] == [3, 6]
    row = seen.at(6)  # the last step: no next transfer, read as the run ended
    assert set(row.weight_norms) == set(row.grad_norms) and all(norm > 0 for norm in row.weight_norms.values())
    first, root = row.adam["stem"]
    assert first > 0 and root > 0
    assert MetricsRow.from_json(strict_json.loads(to_json_line(row.json_object()))) == row  # its metrics.jsonl line


def test_an_optimizer_without_adams_moments_gives_ratios_and_no_moments():
    trainer, seen = make_trainer(f"{WORKLOADS / 'tiny.py'}:sgd_without_spike", **SETTINGS)
    trainer.run()
    assert all(row.update_ratios and row.adam is None for row in seen.metrics)


def test_a_step_whose_update_was_skipped_carries_no_update_figures():
    """fp16's GradScaler skips the update of a step whose gradients overflowed: nothing moved, and its row said every
    module's ratio was 0 (a column of "frozen" in the heatmap). Skipped here as the scaler would, on a CPU."""
    trainer, seen = make_trainer(**SETTINGS)
    precision = trainer.parts.precisions.current
    step_as_given = precision.step
    precision.step = lambda optimizer: trainer.parts.progress.step + 1 != 3 and step_as_given(optimizer)
    assert trainer.run().status == "finished"
    assert seen.at(3).update_ratios is None and seen.at(3).grad_norms is not None and seen.at(3).skipped
    assert all(seen.at(step).update_ratios for step in (2, 4))


def test_under_amsgrad_the_moment_reported_is_the_one_its_step_divides_by():
    import torch

    from torchlab.core.engine.measure.update_probe import _adam_moments

    param = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.Adam([param], lr=0.1, amsgrad=True)
    for scale in (10.0, 0.0):  # a gradient, then none: v decays, its running maximum stays
        param.grad = torch.full((3,), scale)
        optimizer.step()
    present, [first], [second] = _adam_moments([param], optimizer)
    assert present is None and torch.equal(second, optimizer.state[param]["max_exp_avg_sq"])
    assert second.sum() > optimizer.state[param]["exp_avg_sq"].sum()


def test_a_copy_of_the_parameters_that_does_not_fit_turns_the_update_figures_off_not_the_run():
    """On a card near full the update probe's copy of the parameters (a measured step's only extra memory) can run out
    of memory: the run goes on without the figures, said once, its gradient norms still measured."""
    import torch

    trainer, seen = make_trainer(**SETTINGS)
    copy = trainer.instruments.update_probe.before_update

    def out_of_memory_at_step_3():
        if trainer.parts.progress.step + 1 == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return copy()

    trainer.instruments.update_probe.before_update = out_of_memory_at_step_3
    assert trainer.run().status == "finished"
    assert [row.step for row in seen.metrics if row.update_ratios] == [1, 2]
    assert all(row.grad_norms for row in seen.metrics)
    [said] = [event for event in seen.of("log") if "update probe" in event["text"]]
    assert said["level"] == "warning" and said["text"].startswith("step 3: the update probe's copy of the parameters (")
