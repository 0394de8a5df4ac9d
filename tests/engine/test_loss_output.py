"""A step's micro-batches made one loss (core/engine/loss_output.py ``mean_of_micro_batches``): the mean, in fp32, on
the device; one micro-batch (the common case) as it is, with nothing stacked."""

from __future__ import annotations

import torch

from torchlab.core.engine.loss_output import mean_of_micro_batches


def test_one_micro_batch_is_its_own_loss_in_fp32_and_its_metrics_as_they_are():
    loss, metrics = torch.tensor(2.0, dtype=torch.bfloat16), torch.tensor([1.0, 3.0])
    mean, mean_metrics = mean_of_micro_batches([loss], [metrics])
    assert mean.dtype == torch.float32 and mean.item() == 2.0 and mean_metrics is metrics


def test_several_are_their_mean_and_metrics_mean_column_by_column():
    mean, metrics = mean_of_micro_batches([torch.tensor(1.0), torch.tensor(3.0)],
                                          [torch.tensor([1.0, 10.0]), torch.tensor([3.0, 30.0])])
    assert mean.item() == 2.0 and metrics.tolist() == [2.0, 20.0]
    assert mean_of_micro_batches([torch.tensor(1.0), torch.tensor(2.0)], [None, None])[1] is None
