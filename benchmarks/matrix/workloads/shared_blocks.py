"""Two checkpoint blocks that share one parameter (a weight tied across blocks): FSDP2 shards each block's
parameters as a unit and cannot shard one two blocks hold, so ``--parallel fsdp`` must be refused before anything
is spent, naming the parameter (core/engine/parallel/sharding.py); one process and DDP train it.

    torchlab-tui benchmarks/matrix/workloads/shared_blocks.py:workload
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from torchlab.core.workload import Workload


class SharedBlocks(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.stem = nn.Linear(8, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(2))
        self.blocks[1][0].weight = self.blocks[0][0].weight
        self.head = nn.Linear(width, 1)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = self.stem(inputs)
        for block in self.blocks:
            hidden = block(hidden)
        return self.head(hidden)


def _loss(model: nn.Module, batch) -> torch.Tensor:
    inputs, targets = batch
    return nn.functional.mse_loss(model(inputs), targets)


def workload() -> Workload:
    generator = torch.Generator().manual_seed(3)
    inputs = torch.randn(256, 8, generator=generator)
    return Workload(model=SharedBlocks(), dataset=TensorDataset(inputs, inputs[:, :1].tanh()), loss_fn=_loss,
                    batch_size=16)
