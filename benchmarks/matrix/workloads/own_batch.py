"""A dataset whose batches are the user's own type: a dataclass of token ids, their padding mask and a label, made
by the workload's ``collate_fn`` (as a text classifier's usually is), for a model that reads its fields by name.
What the engine does with a batch (move it to the device, split it, shard it over ranks, replay it after a spike)
must see through it.

    torchlab-tui benchmarks/matrix/workloads/own_batch.py:workload
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from torchlab.core.workload import Workload

VOCABULARY, LENGTH, CLASSES = 50, 12, 3


@dataclass
class Batch:
    """Samples along the first dimension of each field."""

    tokens: torch.Tensor  # (samples, LENGTH) token ids, 0 pads
    mask: torch.Tensor  # (samples, LENGTH) True where a token is
    labels: torch.Tensor  # (samples,)


class Sentences(torch.utils.data.Dataset):
    """Token sequences of varied lengths, labelled by the sum of their tokens modulo CLASSES."""

    def __init__(self, samples: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.lengths = torch.randint(3, LENGTH + 1, (samples,), generator=generator)
        self.tokens = torch.randint(1, VOCABULARY, (samples, LENGTH), generator=generator)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        tokens = self.tokens[index, : self.lengths[index]]
        return tokens, int(tokens.sum()) % CLASSES


def collate(samples: list[tuple[torch.Tensor, int]]) -> Batch:
    tokens = torch.zeros(len(samples), LENGTH, dtype=torch.long)
    for row, (sample, _) in enumerate(samples):
        tokens[row, : len(sample)] = sample
    return Batch(tokens=tokens, mask=tokens != 0, labels=torch.tensor([label for _, label in samples]))


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.linear = nn.Linear(width, width)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden + torch.relu(self.linear(self.norm(hidden)))


class Classifier(nn.Module):
    def __init__(self, width: int = 32, depth: int = 2) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCABULARY, width, padding_idx=0)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, CLASSES)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = self.embedding(tokens)
        for block in self.blocks:
            hidden = block(hidden)
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1.0)
        return self.head(pooled)


def _loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch.tokens, batch.mask), batch.labels)


def workload() -> Workload:
    return Workload(model=Classifier(), dataset=Sentences(512, 1), val_dataset=Sentences(64, 2), loss_fn=_loss,
                    collate_fn=collate, batch_size=16)
