"""A tiny masked-LM-like model named the way HuggingFace names BERT's modules: long, nested, alike.

``bert.encoder.layer.0.attention.self.query`` and its siblings differ in one index in the middle of forty
characters, and ``lm_head`` shares its weight with ``bert.embeddings.word_embeddings`` (tied, as in GPT-2
and BERT): what the app's gradient table must still show readably. Trains in milliseconds on a CPU.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from torchlab.core.workload import Workload

VOCAB, WIDTH, LAYERS, LENGTH = 32, 16, 4, 8


class SelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.query, self.key, self.value = (nn.Linear(WIDTH, WIDTH) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.query(x) @ self.key(x).transpose(1, 2) / WIDTH**0.5
        return scores.softmax(dim=-1) @ self.value(x)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self = SelfAttention()  # sic: HuggingFace's name
        self.output = nn.ModuleDict({"dense": nn.Linear(WIDTH, WIDTH), "LayerNorm": nn.LayerNorm(WIDTH)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output["LayerNorm"](x + self.output["dense"](self.self(x)))


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention = Attention()
        self.intermediate = nn.ModuleDict({"dense": nn.Linear(WIDTH, 2 * WIDTH)})
        self.output = nn.ModuleDict({"dense": nn.Linear(2 * WIDTH, WIDTH), "LayerNorm": nn.LayerNorm(WIDTH)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attention(x)
        hidden = torch.relu(self.intermediate["dense"](x))
        return self.output["LayerNorm"](x + self.output["dense"](hidden))


class Bert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embeddings = nn.ModuleDict({
            "word_embeddings": nn.Embedding(VOCAB, WIDTH), "position_embeddings": nn.Embedding(LENGTH, WIDTH),
            "LayerNorm": nn.LayerNorm(WIDTH),
        })
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(Layer() for _ in range(LAYERS))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embeddings["word_embeddings"](tokens) + self.embeddings["position_embeddings"](positions)
        x = self.embeddings["LayerNorm"](x)
        for layer in self.encoder.layer:
            x = layer(x)
        return x


class MaskedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bert = Bert()
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.lm_head.weight = self.bert.embeddings["word_embeddings"].weight  # tied

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.bert(tokens))


def _loss(model: nn.Module, batch) -> torch.Tensor:
    (tokens,) = batch
    logits = model(tokens)
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens.roll(-1, dims=1).reshape(-1))


def workload() -> Workload:
    generator = torch.Generator().manual_seed(5)
    data = TensorDataset(torch.randint(VOCAB, (128, LENGTH), generator=generator))
    return Workload(model=MaskedLM(), dataset=data, loss_fn=_loss, batch_size=16)


def module_names() -> list[tuple[str, int, list[str]]]:
    """What the trainer's probe names: (module, parameters, other modules holding its tied parameters)."""
    from torchlab.core.engine.measure.probes import GradNormProbe

    probe = GradNormProbe(MaskedLM())
    return list(zip(probe.module_names, probe.param_counts, probe.tied_names))
