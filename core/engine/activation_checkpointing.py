"""Activation checkpointing that can be switched on and off in place while a run trains.

Each checkpoint block's ``forward`` is shadowed by an instance attribute that calls the class's forward
through non-reentrant ``torch.utils.checkpoint``; switching off deletes the attribute. No module is
replaced, so parameter names, the state dict, optimizer state and hooks are untouched.

BatchNorm inside a block would update its running statistics twice per step (forward and the
recompute during backward); the recompute context restores them, so checkpointing changes memory and
speed, never the model's numbers. Under torch.compile the recompute is part of the compiled backward,
which updates no buffer: there the block is checkpointed without that context (torch.compile accepts none).
A block called with a key/value cache (a transformers decoder layer) is called without it, as transformers'
own checkpointing calls its layers: the cache, filled in the forward, would change what the recompute saves.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Sequence

import torch
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.checkpoint import checkpoint

from torchlab.core.errors import WorkloadError


def default_checkpoint_blocks(model: torch.nn.Module) -> list[str]:
    """The children of the largest ModuleList/Sequential (by parameter count), as qualified names."""
    best_name, best_size = None, 0
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)) and len(module) > 1:
            size = sum(p.numel() for p in module.parameters())
            if size > best_size:
                best_name, best_size = name, size
    if best_name is None:
        return []
    container = model.get_submodule(best_name)
    prefix = f"{best_name}." if best_name else ""
    return [f"{prefix}{child_name}" for child_name, _ in container.named_children()]


class ActivationCheckpointing:
    """Wraps (``enable``) or unwraps (``disable``) the named blocks of ``model``."""

    def __init__(self, model: torch.nn.Module, block_names: Sequence[str] | None) -> None:
        names = list(block_names) if block_names is not None else default_checkpoint_blocks(model)
        #: why this model's blocks cannot be checkpointed, once a step found it (core/engine/guards/oom_rescue.py ``with_rescue``)
        self.cannot: str | None = None
        self.blocks: dict[str, torch.nn.Module] = {}
        for name in names:
            try:
                self.blocks[name] = model.get_submodule(name)
            except AttributeError:
                raise WorkloadError(
                    f"Workload.checkpoint_blocks names {name!r}, which is not a submodule of "
                    f"{type(model).__name__}; use names from model.named_modules()."
                ) from None

    def enable(self, names: Iterable[str] | None = None) -> None:
        """Checkpoint the blocks ``names`` (None: every block), and no other."""
        chosen = set(self.blocks if names is None else names)
        for name, block in self.blocks.items():
            wrapped = "forward" in vars(block)
            if name in chosen and not wrapped:
                block.forward = _checkpointed_forward(block)
            elif name not in chosen and wrapped:
                del block.forward

    def wrapped_blocks(self) -> list[torch.nn.Module]:
        """The blocks checkpointed now."""
        return [block for block in self.blocks.values() if "forward" in vars(block)]

    def wrapped_names(self) -> list[str]:
        return [name for name, block in self.blocks.items() if "forward" in vars(block)]

    def saved_by_block(self, by_module: Iterable[tuple[str, int]]) -> dict[str, int]:
        return saved_by_block(self.blocks, by_module)

    def disable(self) -> None:
        self.enable([])


def saved_by_block(blocks: Iterable[str], by_module: Iterable[tuple[str, int]]) -> dict[str, int]:
    """Each of ``blocks``' activation bytes in a memory measurement's ``(module, bytes)`` pairs: its own modules' and
    its children's (a checkpointed block's are the inputs its recompute keeps). By name alone: the ranks' supervisor,
    which holds no model, ranks blocks by rank 0's measurement the same way."""
    saved = dict.fromkeys(blocks, 0)
    for module, size in by_module:
        for name in saved:
            if module == name or module.startswith(name + "."):
                saved[name] += size
                break
    return saved


#: The arguments a block takes a key/value cache by (transformers' names, old and new): a cache filled in the forward
#: is read in the recompute, which then saves other tensors than the forward did (CheckpointError).
CACHE_ARGUMENTS = ("cache", "past_key_values", "past_key_value", "layer_past")


def _checkpointed_forward(block: torch.nn.Module):
    plain_forward = type(block).forward.__get__(block)
    contexts = functools.partial(_checkpoint_contexts, block)

    def forward(*args, **kwargs):
        if not torch.is_grad_enabled():  # evaluation: nothing to recompute
            return plain_forward(*args, **kwargs)
        kwargs = _without_cache(kwargs)
        if torch.compiler.is_compiling():
            # Compiled, the recompute is the backward graph's (AOTAutograd's partitioner): it updates no buffer,
            # and torch.compile refuses a context_fn other than selective checkpointing's.
            return checkpoint(plain_forward, *args, use_reentrant=False, **kwargs)
        return checkpoint(plain_forward, *args, use_reentrant=False, context_fn=contexts, **kwargs)

    return forward


def _without_cache(kwargs: dict) -> dict:
    """A checkpointed block's keyword arguments with no key/value cache to fill, as transformers' own checkpointing
    calls its layers (``GradientCheckpointingLayer``): ``use_cache`` False and the cache None. A cache is for
    generation; a training forward's is thrown away."""
    if not (kwargs.get("use_cache") or any(kwargs.get(name) is not None for name in CACHE_ARGUMENTS)):
        return kwargs
    kwargs = dict(kwargs)
    if kwargs.get("use_cache"):
        kwargs["use_cache"] = False
    for name in CACHE_ARGUMENTS:
        if kwargs.get(name) is not None:
            kwargs[name] = None
    return kwargs


def _checkpoint_contexts(block: torch.nn.Module):
    return contextlib.nullcontext(), _KeepBatchNormStatistics(block)


class _KeepBatchNormStatistics:
    """Restores BatchNorm running statistics after the recompute, which must not count twice."""

    def __init__(self, block: torch.nn.Module) -> None:
        self.buffers = [
            buffer
            for module in block.modules()
            if isinstance(module, _BatchNorm) and module.training and module.track_running_stats
            for buffer in (module.running_mean, module.running_var, module.num_batches_tracked)
            if buffer is not None
        ]

    def __enter__(self) -> None:
        self.saved = [buffer.clone() for buffer in self.buffers]

    def __exit__(self, *exc_info) -> None:
        with torch.no_grad():
            for buffer, saved in zip(self.buffers, self.saved):
                buffer.copy_(saved)
