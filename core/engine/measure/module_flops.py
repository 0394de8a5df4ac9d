"""Where a step's FLOPs are, by module: which module each op of a counted step ran for (measure/flops.py counts them).

A forward op is the innermost module's that was running (global forward hooks, as the memory probe's; a module
outside the model, a loss module in the workload's code, is charged to what runs it). A backward op is charged to the
module whose forward made the autograd node running it (``torch._C._current_autograd_node``): as each module's
forward ends, the nodes it made are claimed for it, walking back from its outputs through the nodes made since it
began (autograd's sequence numbers), the innermost module's first. No backward hook is added: ``FlopCounterMode``'s
module tracking adds them, and a model taking ``autograd.grad`` inside its forward (a gradient penalty) cannot run
under those. A forward that runs inside backward is activation checkpointing's recompute, charged to its module as
such; a backward inside a forward (``autograd.grad`` in it) is charged to the module of its nodes, else to the one
running.

Private torch functions, both in torch since 2.1: ``torch._C._current_autograd_node`` and
``torch._C._autograd._get_sequence_nr``; the tests hold them to a hand count.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from torchlab.core.engine.measure.memory import OUTSIDE_THE_MODEL
from torchlab.core.engine.measure.probes import ROOT_MODULE_NAME

FORWARD, BACKWARD, RECOMPUTE = "forward", "backward", "recompute"


class ModuleFlopTracker:
    """During one counted step: the module each op runs for (``owner``), and the FLOPs charged to each module."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._modules = {module: name or ROOT_MODULE_NAME for name, module in model.named_modules()}
        #: the modules running, innermost last: (name, the sequence number its forward began at, began in backward)
        self._running: list[tuple[str, int, bool]] = []
        self._owners: dict[Any, str] = {}  # autograd nodes -> the module whose forward made them
        self.by_module: dict[str, dict[str, int]] = {}
        self._hooks: list[Any] = []

    def __enter__(self) -> ModuleFlopTracker:
        self._hooks = [register_module_forward_pre_hook(self._enter),
                       register_module_forward_hook(self._leave, always_call=True)]
        return self

    def __exit__(self, *exc_info: object) -> bool:
        for hook in self._hooks:
            hook.remove()
        return False

    def charge(self, flops: int) -> str:
        """``flops`` of the op running now, to its module and pass; the pass."""
        name, kind = self._owner()
        counts = self.by_module.setdefault(name, {FORWARD: 0, BACKWARD: 0, RECOMPUTE: 0})
        counts[kind] += flops
        return kind

    def _owner(self) -> tuple[str, str]:
        node = torch._C._current_autograd_node()
        if self._running:
            name, _, in_backward = self._running[-1]
            if in_backward:
                return name, RECOMPUTE
            return (name, FORWARD) if node is None else (self._owners.get(node, name), BACKWARD)
        if node is not None:
            return self._owners.get(node, OUTSIDE_THE_MODEL), BACKWARD
        return OUTSIDE_THE_MODEL, FORWARD

    def _enter(self, module: torch.nn.Module, args: tuple) -> None:
        name = self._modules.get(module) or (self._running[-1][0] if self._running else OUTSIDE_THE_MODEL)
        self._running.append((name, torch._C._autograd._get_sequence_nr(),
                              torch._C._current_autograd_node() is not None))

    def _leave(self, module: torch.nn.Module, args: tuple, output: object) -> None:
        if not self._running:
            return
        name, began, _ = self._running.pop()
        pending = [tensor.grad_fn for tensor in _tensors(output) if tensor.grad_fn is not None]
        seen: set[Any] = set()
        while pending:
            node = pending.pop()
            if node is None or node in seen or node._sequence_nr() < began:
                continue  # made before this forward began: its caller's, or an earlier module's
            seen.add(node)
            self._owners.setdefault(node, name)  # an inner module's forward ended first and claimed its own
            pending.extend(following for following, _ in node.next_functions)


def _tensors(value: object) -> Iterator[torch.Tensor]:
    """The tensors in a module's output: in tuples, lists, mappings (a transformers ``ModelOutput`` is one) and
    dataclasses."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from _tensors(getattr(value, field.name))
