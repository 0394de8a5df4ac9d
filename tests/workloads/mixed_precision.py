"""Tiny workloads whose state autocast keeps in fp32 while their matrices run in bf16: a CNN with BatchNorm (running
statistics, and affine parameters a norm uses as they are), and a plain model that multiplies by a float buffer.
Under amp=bf16 they train in one process and under DDP; these are the shapes that must train under FSDP2 too.

Each factory takes no arguments, as on the command line: ``tests/workloads/mixed_precision.py:cnn_with_batchnorm``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from torchlab.core.workload import Workload


def _images(samples: int = 128, seed: int = 3) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(samples, 1, 8, 8, generator=generator)
    labels = (images.mean(dim=(1, 2, 3)) > 0).long()  # learnable: the sign of the mean brightness
    return TensorDataset(images, labels)


class CnnWithBatchNorm(nn.Module):
    """Two conv stages (the checkpoint blocks), each Conv, BatchNorm, ReLU; their pooled features weighted by a float
    buffer (fixed per-channel weights), then a linear classifier."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.stages = nn.Sequential(
            nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()),
            nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()),
        )
        self.register_buffer("channel_weights", torch.linspace(0.5, 1.5, width))
        self.classifier = nn.Linear(width, 2)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.stages(images).mean(dim=(2, 3)) * self.channel_weights)


def _classification_loss(model: nn.Module, batch) -> torch.Tensor:
    images, labels = batch
    return nn.functional.cross_entropy(model(images), labels)


def cnn_with_batchnorm() -> Workload:
    return Workload(model=CnnWithBatchNorm(), dataset=_images(), loss_fn=_classification_loss, batch_size=16)


class ScaledByBuffer(nn.Module):
    """Linear blocks (the checkpoint blocks) whose output is multiplied by a float buffer of per-feature scales before
    the head: a buffer is state, not a parameter, and stays fp32 whatever the precision."""

    def __init__(self, features: int = 8, width: int = 16) -> None:
        super().__init__()
        self.register_buffer("scale", torch.linspace(0.5, 1.5, width))
        self.blocks = nn.Sequential(
            nn.Sequential(nn.Linear(features, width), nn.ReLU()),
            nn.Sequential(nn.Linear(width, width), nn.ReLU()),
        )
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x) * self.scale)


def _regression(samples: int = 128, features: int = 8, seed: int = 4) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, features, generator=generator)
    targets = torch.tanh(inputs @ torch.randn(features, 1, generator=generator))
    return TensorDataset(inputs, targets)


def _mse(model: nn.Module, batch) -> torch.Tensor:
    inputs, targets = batch
    return nn.functional.mse_loss(model(inputs), targets)


def scaled_by_buffer() -> Workload:
    return Workload(model=ScaledByBuffer(), dataset=_regression(), loss_fn=_mse, batch_size=16)
