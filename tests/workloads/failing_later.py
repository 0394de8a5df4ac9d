"""Workloads that fail after steps that trained, for tests/engine/test_faults.py: an exception from a helper of the user's
own (a data reader), as a real run meets one at step N; the engine must lead with the user's line, not its own."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from torchlab.core.workload import Workload


def read_shard(index: int) -> torch.Tensor:
    """The user's own reader: shard 7 is corrupt."""
    if index == 7:
        raise ValueError(f"corrupt shard {index}: header checksum mismatch")
    generator = torch.Generator().manual_seed(index)
    return torch.randn(8, generator=generator)


class ReadsShards(nn.Module):
    """Reads a shard in its forward, as some users' models fetch what they need (shard = the step's number)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 1)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.linear(x + read_shard(self.calls + 1))


def raises_in_a_helper_at_step_6() -> Workload:
    """Steps 1-5 read shards 2-6; step 6 reads shard 7, which raises ValueError in read_shard."""
    return Workload(model=ReadsShards(), dataset=TensorDataset(torch.randn(64, 8)), loss_fn=lambda model, batch: model(batch[0]).pow(2).mean(),
                    batch_size=4)


class FailsFromStep(nn.Module):
    """Raises in its forward from optimizer step ``first_failing`` on (the workload's before_step tells it the step)."""

    def __init__(self, first_failing: int) -> None:
        super().__init__()
        self.linear, self.first_failing, self.step = nn.Linear(8, 1), first_failing, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.step >= self.first_failing:
            raise RuntimeError(f"expected scalar type BFloat16 but found Float (step {self.step})")
        return self.linear(x)


def fails_from_step_3() -> Workload:
    """Trains steps 1-2, fails at 3 and at every step after: a resume from step 2 fails on its process's first."""
    model = FailsFromStep(3)
    return Workload(model=model, dataset=TensorDataset(torch.randn(64, 8)), batch_size=4,
                    loss_fn=lambda model, batch: model(batch[0]).pow(2).mean(),
                    before_step=lambda step, epoch: setattr(model, "step", step))


class NonFiniteFromStep(nn.Module):
    """Its forward is NaN from optimizer step ``first_failing`` on, whatever its weights: weights that give a
    non-finite forward again after a resume, as weights grown out of range do."""

    def __init__(self, first_failing: int) -> None:
        super().__init__()
        self.linear, self.first_failing, self.step = nn.Linear(8, 1), first_failing, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x)
        return out * float("nan") if self.step >= self.first_failing else out


def nonfinite_forward_from_step_6() -> Workload:
    """Trains steps 1-5; the forward of step 6 and of every step after is NaN, in a resumed process too."""
    model = NonFiniteFromStep(6)
    return Workload(model=model, dataset=TensorDataset(torch.randn(64, 8)), batch_size=4,
                    loss_fn=lambda model, batch: model(batch[0]).pow(2).mean(),
                    before_step=lambda step, epoch: setattr(model, "step", step))
