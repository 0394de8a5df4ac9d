"""Workloads whose code does what a workload must not: a dataset whose ``__len__`` is no number of samples, a
factory or a loss that ends the process (``sys.exit``). Each factory takes no arguments, as on the command line:
``tests/workloads/misbehaving.py:factory_exits_3``."""

from __future__ import annotations

import sys

import torch
from torch import nn
from torch.utils.data import Dataset

from torchlab.core.workload import Workload


class Samples(Dataset):
    """64 samples of 4 features; ``__len__`` returns ``length`` (a callable: it may raise)."""

    def __init__(self, length=lambda: 64) -> None:
        self.inputs, self.targets = torch.randn(64, 4), torch.randn(64, 1)
        self.length = length

    def __getitem__(self, index: int):
        return self.inputs[index], self.targets[index]

    def __len__(self):
        return self.length()


def mse(model: nn.Module, batch) -> torch.Tensor:
    inputs, targets = batch
    return nn.functional.mse_loss(model(inputs), targets)


def _workload(dataset: Dataset, loss_fn=mse, val_dataset: Dataset | None = None) -> Workload:
    return Workload(model=nn.Linear(4, 1), dataset=dataset, val_dataset=val_dataset, loss_fn=loss_fn, batch_size=8)


def _broken_length():
    raise RuntimeError("the index file is missing")


def len_minus_one() -> Workload:
    return _workload(Samples(lambda: -1))


def len_raises() -> Workload:
    return _workload(Samples(_broken_length))


def len_not_a_number() -> Workload:
    return _workload(Samples(lambda: 2.5))


def val_len_minus_one() -> Workload:
    return _workload(Samples(), val_dataset=Samples(lambda: -1))


def factory_exits() -> Workload:
    sys.exit()


def factory_exits_3() -> Workload:
    sys.exit(3)


def factory_raises_system_exit() -> Workload:
    raise SystemExit


def _give_up() -> None:
    sys.exit("no GPU, giving up")


def factory_exits_in_a_helper() -> Workload:
    _give_up()


def loss_exits_at_step_3() -> Workload:
    calls = [0]

    def loss(model: nn.Module, batch) -> torch.Tensor:
        calls[0] += 1
        if calls[0] == 3:
            sys.exit(3)  # in the loss
        return mse(model, batch)

    return _workload(Samples(), loss)
