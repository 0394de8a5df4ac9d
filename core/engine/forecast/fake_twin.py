"""A model's fake twin: the same modules with every parameter and buffer a ``FakeTensor`` (shape, dtype and device,
no storage), on which a training step runs without allocating its memory.

The twin is made from a model as it is, whether it holds real tensors (a live run's model, copied with
``FakeCopyMode``: nothing of its weights is read) or tensors on the ``meta`` device (a model built by
``parameters_on_meta``, which never held its weights). A parameter shared by two modules (tied weights) is one
parameter of the twin too, so it is counted once, as the real model holds it once.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch
from torch._subclasses.fake_tensor import FakeCopyMode, FakeTensorMode


def fake_twin(model: torch.nn.Module, mode: FakeTensorMode, device: torch.device) -> torch.nn.Module:
    """A copy of ``model`` whose tensors are fakes of ``mode`` on ``device``; ``model`` is left as it is."""
    with FakeCopyMode(mode):
        twin = copy.deepcopy(model)  # each tensor once (deepcopy's memo): a tied weight stays one parameter
    for module in twin.modules():
        _without_the_engines_own(module)
    placed: dict[int, torch.Tensor] = {}
    with mode:
        for module in twin.modules():
            for table in (module._parameters, module._buffers):
                for name, tensor in table.items():
                    if tensor is not None and tensor.device != device:
                        table[name] = placed.setdefault(id(tensor), _placed(tensor, device))
    return twin


def _without_the_engines_own(module: torch.nn.Module) -> None:
    """What the trainer put on the live model that the copy must not keep: its hooks (a probe's, the non-finite guard's,
    which would write into the live run's figures from the twin's step) and activation checkpointing's forward (its
    closure runs the live block: the forecast wraps the twin's own blocks as each prediction asks). The model's own
    hooks stay: they are its memory's too."""
    for hooks in (module._forward_hooks, module._forward_pre_hooks, module._backward_hooks, module._backward_pre_hooks):
        for key in [key for key, hook in hooks.items() if _engines(hook)]:
            del hooks[key]
    if _engines(vars(module).get("forward")):
        del module.forward


def _engines(function: object) -> bool:
    function = getattr(function, "__func__", function)  # a bound method: its function
    return function is not None and getattr(function, "__module__", "").startswith("torchlab.core.engine.")


def _placed(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A fake like ``tensor`` on ``device`` (a model built on ``meta`` is predicted on the run's device)."""
    like = torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype, device=device)
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(like, requires_grad=tensor.requires_grad)
    return like


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """While a workload's factory runs: each parameter a module registers is put on the ``meta`` device as it is
    registered, so a model is built without holding its weights (Accelerate's ``init_empty_weights``): at most one
    parameter is allocated at a time, and ``torch.empty`` leaves even that one's pages untouched. Buffers (a
    BatchNorm's statistics) and the datasets are made as they are: they are small, and the data must be real to be
    drawn. Initialisation that runs after registering (``reset_parameters``) runs on ``meta``, where it costs
    nothing."""
    register = torch.nn.Module.register_parameter

    def register_on_meta(module: torch.nn.Module, name: str, parameter: torch.nn.Parameter | None) -> None:
        if type(parameter) is torch.nn.Parameter and parameter.device.type != "meta":  # a lazy one is left as it is
            parameter = torch.nn.Parameter(parameter.to("meta"), requires_grad=parameter.requires_grad)
        register(module, name, parameter)

    torch.nn.Module.register_parameter = register_on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]
