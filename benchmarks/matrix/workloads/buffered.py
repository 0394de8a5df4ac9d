"""A model with a float buffer and a custom ``autograd.Function``: what a user's own layer often is, and what a
precision, a sharding or a split must leave alone (a buffer is never cast, never sharded; a custom backward must
still be called once per piece).

    torchlab-tui benchmarks/matrix/workloads/buffered.py:workload
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from torchlab.core.workload import Workload


class ScaledTanh(torch.autograd.Function):
    """tanh(x) * scale with a hand-written backward: autograd never sees inside it."""

    @staticmethod
    def forward(ctx, inputs: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        output = torch.tanh(inputs)
        ctx.save_for_backward(output, scale)
        return output * scale

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        output, scale = ctx.saved_tensors
        return grad * scale * (1 - output * output), None


class Block(nn.Module):
    """A linear layer whose output is normalised by a running mean of its magnitude, kept in a float buffer."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.register_buffer("running_magnitude", torch.ones(()))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = self.linear(inputs)
        if self.training:
            with torch.no_grad():
                self.running_magnitude.mul_(0.9).add_(0.1 * hidden.detach().abs().mean().float())
        return ScaledTanh.apply(hidden, 1.0 / self.running_magnitude.clamp_min(1e-3)) + inputs


class BufferedNet(nn.Module):
    def __init__(self, features: int = 8, width: int = 16, depth: int = 2) -> None:
        super().__init__()
        self.stem = nn.Linear(features, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = self.stem(inputs)
        for block in self.blocks:
            hidden = block(hidden)
        return self.head(hidden)


def _data(samples: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, 8, generator=generator)
    targets = torch.sin(inputs.sum(dim=1, keepdim=True))
    return TensorDataset(inputs, targets)


def _loss(model: nn.Module, batch) -> torch.Tensor:
    inputs, targets = batch
    return nn.functional.mse_loss(model(inputs), targets)


def workload() -> Workload:
    return Workload(model=BufferedNet(), dataset=_data(512, 1), val_dataset=_data(64, 2), loss_fn=_loss, batch_size=16)
