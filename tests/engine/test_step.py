"""One optimizer step (core/engine/step.py) and its plan (core/engine/instruments.py ``StepPlan``), called as the loop
and a trial's arm call them: the orders the step's docstring names, checked where they decide what a user sees."""

from __future__ import annotations

import pytest
import torch

from trainers import WORKLOADS, make_trainer
from torchlab.core.engine.instruments import StepPlan
from torchlab.core.engine.trials import TrialStopped
from torchlab.core.errors import NonFiniteError

NAN_AFTER_5 = f"{WORKLOADS / 'tiny.py'}:nan_in_forward"  # the 6th forward's output is NaN, and every one after


def weights(trainer) -> list[torch.Tensor]:
    return [param.detach().clone() for param in trainer.model.parameters()]


def same(before: list[torch.Tensor], trainer) -> bool:
    return all(torch.equal(old, new) for old, new in zip(before, trainer.model.parameters()))


def test_a_trial_arms_step_is_neither_training_nor_guarded_nor_retried():
    plan = StepPlan.trial(memory=True)
    assert (plan.report, plan.memory, plan.training, plan.guarded, plan.retries) == (False, True, False, False, False)


def test_trainings_step_in_one_process_is_guarded_retried_and_reports_on_its_report_steps():
    trainer, _ = make_trainer(steps=4, log_every=2)
    quiet, report = trainer.instruments.plan(1), trainer.instruments.plan(2)
    assert not quiet.report and report.report
    assert all(plan.training and plan.guarded and plan.retries for plan in (quiet, report))


def test_the_row_held_for_the_last_steps_update_figures_is_sent_after_this_steps_transfer_and_before_its_update():
    trainer, _ = make_trainer(steps=4, probe_every=1)
    before, seen = weights(trainer), []
    trainer.train_step.send_held_row = lambda: seen.append(same(before, trainer))
    trainer.train_step(trainer.instruments.plan(1))
    assert seen == [True]  # sent once, with the weights as the update found them
    assert not same(before, trainer)


def test_a_nan_stops_training_before_its_update_and_ends_a_trial_arm_without_one():
    for plan, stopped in ((None, NonFiniteError), (StepPlan.trial(memory=False), TrialStopped)):
        trainer, _ = make_trainer(NAN_AFTER_5, steps=10)
        assert trainer.train_steps(5)
        before = weights(trainer)
        with pytest.raises(stopped):
            trainer.train_step(plan or trainer.instruments.plan(6))
        assert same(before, trainer), stopped  # the weights (and the last checkpoint) stay finite
