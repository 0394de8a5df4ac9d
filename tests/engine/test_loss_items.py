"""A loss that is a mean over items (Workload.loss_items): each micro-batch weighs by its items over the step's, so
accumulation, a split batch and ranks give the gradient and loss of the mean over every item of the step."""

from __future__ import annotations

import pytest
import torch

from trainers import TINY, make_trainer

TOKENS = TINY.replace(":workload", ":token_mean")


def reference(trainer) -> tuple[float, float]:
    import copy

    model = copy.deepcopy(trainer.model)
    data = trainer.parts.workload.dataset
    errors = (model(data.x).squeeze(-1) - data.y) ** 2
    loss = (errors * data.mask).sum() / data.mask.sum()
    loss.backward()
    return loss.item(), torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item()


@pytest.mark.parametrize("options", [{"accum": "2"}, {"accum": "2", "split": "2"}, {"accum": "1", "split": "4"}],
                         ids=["accum 2", "accum 2 split 2", "split 4"])
def test_micro_batches_weigh_by_their_items_so_the_step_is_the_mean_over_every_item(options):
    settings = {"batch_size": 8 if options["accum"] == "1" else 4}
    trainer, seen = make_trainer(TOKENS, steps=1, probe_every=1, options=options, **settings)
    expected_loss, expected_norm = reference(trainer)  # before the step: the weights it starts from
    trainer.run()
    row = seen.metrics[0]
    assert row.loss == pytest.approx(expected_loss, rel=1e-5)
    assert row.grad_norm_total == pytest.approx(expected_norm, rel=1e-5)


def test_without_loss_items_micro_batches_weigh_alike_and_the_step_is_not_the_token_mean():
    """The control: the same loss weighed by samples is another figure (so the test above can fail)."""
    trainer, seen = make_trainer(TOKENS, steps=1, probe_every=1, options={"accum": "2"}, batch_size=4)
    trainer.parts.workload.loss_items = None
    expected_loss, _ = reference(trainer)
    trainer.run()
    assert seen.metrics[0].loss != pytest.approx(expected_loss, rel=1e-3)
