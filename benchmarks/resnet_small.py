"""The workload of ``loop_cost.py``: a small residual CNN with BatchNorm whose steps take ~10 ms on a
2-core CPU (batch 32 of 3x16x16 random images, ten classes), the size where a training loop's own
fixed cost per step shows.

    torchlab-tui benchmarks/resnet_small.py:workload --headless --steps 400

No validation set: the comparison is one training loop against another, and a plain loop evaluates
nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from torchlab.core.workload import Workload
from torchlab.sample_models.convnet import Stage  # two 3x3 conv + BatchNorm with a residual shortcut

BATCH_SIZE = 32
SAMPLES = 8192  # 256 batches: an epoch boundary falls inside a 400-step run, as it would in real training
CLASSES = 10


class SmallResNet(nn.Module):
    """A stem at 16x16, three residual blocks (8x8, then 4x4), global max pooling, a linear head."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.blocks = nn.Sequential(
            Stage(width, width, 2), Stage(width, 2 * width, 2), Stage(2 * width, 2 * width, 1),
        )
        self.head = nn.Linear(2 * width, CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(images)).amax(dim=(2, 3)))


def classification_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    images, labels = batch
    return F.cross_entropy(model(images), labels)


#: ``loop_cost.py`` sets this to learn the torch thread count each runner trains with.
THREADS_FILE_VARIABLE = "TORCHLAB_LOOP_COST_THREADS_FILE"


def workload() -> Workload:
    """Zero-argument factory: the model is initialised from the global seed, the data from its own."""
    if THREADS_FILE_VARIABLE in os.environ:
        Path(os.environ[THREADS_FILE_VARIABLE]).write_text(str(torch.get_num_threads()))
    generator = torch.Generator().manual_seed(1234)
    images = torch.randn(SAMPLES, 3, 16, 16, generator=generator)
    labels = torch.randint(CLASSES, (SAMPLES,), generator=generator)
    return Workload(model=SmallResNet(), dataset=TensorDataset(images, labels), loss_fn=classification_loss,
                    batch_size=BATCH_SIZE)
