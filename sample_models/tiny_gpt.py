"""Sample workload: a tiny GPT-style causal transformer learning a synthetic order-2 Markov language.

Why this data: each token is drawn from a fixed random distribution conditioned on the two tokens
before it, with next-token logits ``previous_weight[t-1] + second_previous_weight[t-2]``. The
transitions are peaked, so there is a lot to learn below ``ln(vocab_size)``, in two visible phases.
At the default vocabulary of 64 (``ln 64`` = 4.16 nats), the best a bigram model can do is about
1.65 nats per token, and the true entropy rate is about 1.16. The model learns most of the bigram
part within the first ~100 steps, then must attend to the token two back to go further, which takes
a working causal attention (at the defaults and lr 1e-3 it passes the bigram level after ~400
steps). Sequences come from their own ``torch.Generator`` seeded with ``data_seed``, so they are the
same whatever the training seed.

Dropout defaults to 0.1 because the engine checks bit-exact resume and activation checkpointing with
random layers in play. ``tie_weights=True`` shares the language-model head's weight with the token
embedding (as in GPT-2), a way to try shared parameters; it is off by default because the untied head
learns the bigram statistics noticeably faster in the first hundred steps.

The default batch is 16 sequences of 64 tokens, which keeps one optimizer step near 120 ms on a
2-core CPU; 32 sequences learn about as well per step but take twice as long.

Recommended optimizer: AdamW with lr 1e-3 (the engine default) to 3e-3.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from torchlab.core.workload import Workload

# Standard deviations of the random transition logits from the previous token and from the one before
# it; larger means more predictable text.
_PREVIOUS_SHARPNESS = 3.5
_SECOND_PREVIOUS_SHARPNESS = 2.0
_INIT_STD = 0.02


class MarkovLanguage:
    """A fixed random order-2 Markov chain over ``vocab_size`` tokens, drawn from ``generator``."""

    def __init__(self, vocab_size: int, generator: torch.Generator) -> None:
        self.vocab_size = vocab_size
        shape = (vocab_size, vocab_size)
        self.previous_weight = _PREVIOUS_SHARPNESS * torch.randn(shape, generator=generator)
        self.second_previous_weight = _SECOND_PREVIOUS_SHARPNESS * torch.randn(shape, generator=generator)

    def next_token_logits(self, second_previous: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        """Unnormalised log-probabilities of the next token for a batch of ``(t-2, t-1)`` contexts."""
        return self.previous_weight[previous] + self.second_previous_weight[second_previous]

    def sample(self, num_sequences: int, length: int, generator: torch.Generator) -> torch.Tensor:
        """``num_sequences`` sequences of ``length`` tokens, each started from two uniform tokens.

        Draws each next token by inverse-CDF sampling (one uniform number per row, looked up in the
        cumulative distribution), which is exact and far faster than ``torch.multinomial`` on CPU.
        """
        tokens = torch.empty(num_sequences, length, dtype=torch.long)
        tokens[:, :2] = torch.randint(self.vocab_size, (num_sequences, 2), generator=generator)
        for position in range(2, length):
            logits = self.next_token_logits(tokens[:, position - 2], tokens[:, position - 1])
            cumulative = logits.softmax(dim=-1).cumsum(dim=-1)
            uniform = torch.rand(num_sequences, 1, generator=generator)
            # Rounding can leave the last cumulative value a hair below 1; clamp onto the last token.
            next_token = torch.searchsorted(cumulative, uniform).clamp_(max=self.vocab_size - 1)
            tokens[:, position] = next_token.squeeze(1)
        return tokens


class NextTokenDataset(Dataset):
    """Fixed token sequences served as ``(inputs, targets)`` with targets shifted one to the left."""

    def __init__(self, sequences: torch.Tensor) -> None:
        self.sequences = sequences

    def __len__(self) -> int:
        return self.sequences.shape[0]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        sequence = self.sequences[index]
        return sequence[:-1], sequence[1:]


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where each position sees only itself and earlier positions."""

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads}).")
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.attn_dropout = dropout
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, d_model = x.shape
        # (B, T, 3, H, D) -> three tensors of (B, H, T, D).
        q, k, v = self.qkv(x).view(batch, length, 3, self.n_heads, d_model // self.n_heads).unbind(dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        dropout_p = self.attn_dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        out = out.transpose(1, 2).reshape(batch, length, d_model)
        return self.resid_dropout(self.proj(out))


class FeedForward(nn.Module):
    """Position-wise two-layer MLP with GELU, four times wider inside."""

    def __init__(self, d_model: int, dropout: float) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(self.act(self.fc(x))))


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = FeedForward(d_model, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Token + learned position embeddings, a ``blocks`` ModuleList, final LayerNorm, ``lm_head``.

    ``blocks`` is the largest ModuleList by parameter count, so the engine's default activation
    checkpointing wraps each transformer block.
    """

    def __init__(
        self,
        *,
        vocab_size: int,
        context_length: int,
        d_model: int,
        n_layers: int,
        n_heads: int,
        dropout: float,
        tie_weights: bool,
    ) -> None:
        super().__init__()
        self.context_length = context_length
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(context_length, d_model)
        self.emb_dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList([Block(d_model, n_heads, dropout) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self._init_weights(n_layers)
        if tie_weights:
            self.lm_head.weight = self.tok_emb.weight

    def _init_weights(self, n_layers: int) -> None:
        """GPT-2 style: small normal weights, zero biases, residual projections scaled by depth.

        Small initial logits put the first loss near ``ln(vocab_size)``, a useful sanity mark.
        """
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=_INIT_STD)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for block in self.blocks:
            for residual_proj in (block.attn.proj, block.mlp.proj):
                nn.init.normal_(residual_proj.weight, mean=0.0, std=_INIT_STD / math.sqrt(2 * n_layers))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits of shape (batch, length, vocab) for token ids of shape (batch, length)."""
        length = tokens.shape[1]
        if length > self.context_length:
            raise ValueError(f"Sequence length {length} exceeds the context length {self.context_length}.")
        positions = torch.arange(length, device=tokens.device)
        x = self.emb_dropout(self.tok_emb(tokens) + self.pos_emb(positions))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def next_token_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy of the predicted next token at every position."""
    inputs, targets = batch
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_workload(
    *,
    vocab_size: int = 64,
    context_length: int = 64,
    d_model: int = 128,
    n_layers: int = 4,
    n_heads: int = 4,
    dropout: float = 0.1,
    tie_weights: bool = False,
    num_train: int = 8192,
    num_val: int = 512,
    batch_size: int = 16,
    data_seed: int = 0,
) -> Workload:
    """The GPT workload at any size; the defaults are what the CLI trains.

    ``num_train`` and ``num_val`` count sequences of ``context_length`` + 1 tokens.
    """
    generator = torch.Generator().manual_seed(data_seed)
    language = MarkovLanguage(vocab_size, generator)
    sequences = language.sample(num_train + num_val, context_length + 1, generator)
    model = TinyGPT(
        vocab_size=vocab_size,
        context_length=context_length,
        d_model=d_model,
        n_layers=n_layers,
        n_heads=n_heads,
        dropout=dropout,
        tie_weights=tie_weights,
    )
    return Workload(
        model=model,
        dataset=NextTokenDataset(sequences[:num_train]),
        val_dataset=NextTokenDataset(sequences[num_train:]),
        loss_fn=next_token_loss,
        batch_size=batch_size,
    )


def workload() -> Workload:
    """Zero-argument factory used by the CLI."""
    return make_workload()
