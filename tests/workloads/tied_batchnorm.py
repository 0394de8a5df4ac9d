"""A model of our own for the memory forecast: an embedding tied to the output head (one parameter, two modules), and
blocks of Linear → BatchNorm1d (running statistics: buffers) → GELU, the checkpoint blocks. Next-token prediction on
a fixed random corpus."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from torchlab.core.workload import Workload

VOCAB, WIDTH, CONTEXT = 512, 96, 32


class TiedBatchNormNet(nn.Module):
    def __init__(self, blocks: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.Sequential(*(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.BatchNorm1d(WIDTH), nn.GELU())
                                      for _ in range(blocks)))
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(tokens).flatten(0, 1)  # BatchNorm1d over every position of every sequence
        return self.head(self.blocks(hidden)).view(*tokens.shape, VOCAB)


def next_token_loss(model: nn.Module, batch) -> torch.Tensor:
    (tokens,) = batch
    logits = model(tokens[:, :-1])
    return nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())


def workload() -> Workload:
    corpus = torch.randint(0, VOCAB, (256, CONTEXT + 1), generator=torch.Generator().manual_seed(3))
    return Workload(model=TiedBatchNormNet(), dataset=TensorDataset(corpus), loss_fn=next_token_loss, batch_size=16)
