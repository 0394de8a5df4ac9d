"""Workloads that bring their own optimizer (named parameter groups), scheduler and metrics, as a user's would;
and ones that get the contract wrong on purpose. Factories take no arguments: ``own_training.py:workload``.
"""

from __future__ import annotations

import os

import torch
from torch import nn
from torch.utils.data import TensorDataset

from torchlab.core.workload import Workload


def _blobs(samples: int, seed: int) -> TensorDataset:
    """Four Gaussian blobs in 8 dimensions: a classifier gets most of them right within a few dozen steps."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(4, (samples,), generator=generator)
    centres = torch.randn(4, 8, generator=torch.Generator().manual_seed(1)) * 2
    return TensorDataset(centres[labels] + torch.randn(samples, 8, generator=generator), labels)


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def two_groups(model: Classifier) -> torch.optim.Optimizer:
    """SGD with momentum; the head learns four times faster than the body (each group named)."""
    return torch.optim.SGD([
        {"params": model.body.parameters(), "lr": 0.05, "name": "body"},
        {"params": model.head.parameters(), "lr": 0.2, "name": "head"},
    ], momentum=0.9)


def cosine(optimizer: torch.optim.Optimizer, total_steps: int) -> torch.optim.lr_scheduler.LRScheduler:
    """A chainable schedule: each LR is computed from the group's LR before it (a scaled LR fed back would compound)."""
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps, eta_min=0.001)


def loss_and_accuracy(model: nn.Module, batch) -> dict[str, torch.Tensor]:
    inputs, labels = batch
    logits = model(inputs)
    return {"loss": nn.functional.cross_entropy(logits, labels), "accuracy": (logits.argmax(dim=1) == labels).float().mean()}


def workload() -> Workload:
    return Workload(model=Classifier(), dataset=_blobs(512, seed=2), val_dataset=_blobs(128, seed=3), loss_fn=loss_and_accuracy,
                    optimizer=two_groups, scheduler=cosine, batch_size=32)


def onecycle() -> Workload:
    """OneCycleLR raises past its total: a run extended on resume must build it again for the new total."""
    def schedule(optimizer, total_steps):
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=[0.1, 0.4], total_steps=total_steps)

    built = workload()
    built.scheduler = schedule
    return built


def onecycle_head_lrs(total_steps: int) -> list[float]:
    """The head group's LR at each step of ``onecycle``'s schedule planned for ``total_steps`` (what a run extended
    to that total must follow)."""
    probe = torch.optim.SGD([{"params": [torch.zeros(1, requires_grad=True)]}, {"params": [torch.zeros(1, requires_grad=True)]}], lr=0.1)
    plan = torch.optim.lr_scheduler.OneCycleLR(probe, max_lr=[0.1, 0.4], total_steps=total_steps)
    lrs = []
    for _ in range(total_steps):
        lrs.append(probe.param_groups[1]["lr"])
        probe.step()
        plan.step()
    return lrs


def not_an_optimizer() -> Workload:
    built = workload()
    built.optimizer = lambda model: "sgd"
    return built


def optimizer_of_another_model() -> Workload:
    built = workload()
    built.optimizer = lambda model: torch.optim.SGD(Classifier().parameters(), lr=0.1)
    return built


def on_plateau() -> Workload:
    built = workload()
    built.scheduler = lambda optimizer, total_steps: torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
    return built


def metrics_that_change() -> Workload:
    """Accuracy on the first steps, then a metric of another name: refused, naming both."""
    calls = [0]

    def loss_fn(model, batch):
        calls[0] += 1
        out = loss_and_accuracy(model, batch)
        return out if calls[0] < 3 else {"loss": out["loss"], "acc": out["accuracy"]}

    built = workload()
    built.loss_fn = loss_fn
    return built


def metric_not_scalar() -> Workload:
    def loss_fn(model, batch):
        inputs, labels = batch
        logits = model(inputs)
        return {"loss": nn.functional.cross_entropy(logits, labels), "correct": logits.argmax(dim=1) == labels}

    built = workload()
    built.loss_fn = loss_fn
    return built


def rank_accuracy() -> Workload:
    """Each rank reports its rank as its 'accuracy' (from the launcher's RANK): the mean over ranks is exact."""
    def loss_fn(model, batch):
        out = loss_and_accuracy(model, batch)
        return {"loss": out["loss"], "rank": float(os.environ.get("RANK", "0"))}

    built = workload()
    built.loss_fn = loss_fn
    return built


def _halving_each_epoch(optimizer: torch.optim.Optimizer, total_steps: int) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)


def per_epoch() -> Workload:
    """StepLR halving the LR once an epoch, stepped per epoch: 512 samples in batches of 32, 16 steps an epoch."""
    return Workload(model=Classifier(), dataset=_blobs(512, seed=2), loss_fn=loss_and_accuracy, optimizer=two_groups,
                    scheduler=_halving_each_epoch, scheduler_interval="epoch", batch_size=32)


class _Stream(torch.utils.data.IterableDataset):
    """The same 512 samples as a stream, whose end shows only when it is read past."""

    def __iter__(self):
        data = _blobs(512, seed=2)
        return iter(data[index] for index in range(len(data)))


def per_epoch_of_a_stream() -> Workload:
    built = per_epoch()
    built.dataset = _Stream()
    return built
