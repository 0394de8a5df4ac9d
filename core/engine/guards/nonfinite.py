"""Where did the NaN come from? Localise a non-finite loss or gradient to a module.

Runs only after a non-finite value was seen, so it may be thorough: it replays the failing batch with
temporary hooks on every module and reports the first place a value went non-finite, in this order:
a parameter already non-finite; the input batch; the first module (in execution order) whose output
is non-finite; the loss function; then, in backward order, the first module whose input gradient is
non-finite while its output gradient was finite, i.e. the module whose backward produced it.
``stop_on_nonfinite`` is the trainer's guard: it localises the step's NaN and stops the run with it.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import torch

from torchlab.core.engine.measure.probes import ROOT_MODULE_NAME
from torchlab.core.errors import NonFiniteError


def stop_on_nonfinite(step: int, loss_value: float, total_norm: float | None, *, model: torch.nn.Module,
                      optimizer: torch.optim.Optimizer, run_loss: Callable[[], torch.Tensor], batch: Any) -> NoReturn:
    """Raise the NonFiniteError of ``step`` (its loss, or its gradients' total norm, is NaN/Inf), naming where the
    NaN came from: ``run_loss`` replays ``batch``, the step's last. The step's gradients are dropped, before the
    replay and after it, and the weights are as the step before left them."""
    optimizer.zero_grad(set_to_none=True)
    report = localise_nonfinite(model, run_loss, batch)
    optimizer.zero_grad(set_to_none=True)
    report.update(step=step, loss=loss_value, grad_norm_total=total_norm)
    where = f" in {report['module']}" if report["module"] else ""
    raise NonFiniteError(
        f"step {step}: non-finite {'loss' if not math.isfinite(loss_value) else 'gradient'} "
        f"({report['phase']}{where}): {report['detail']}",
        report,
    )


def resume_after_nonfinite(kept: Path | None, kept_step: int | None, lr_scale: float) -> str:
    """What a non-finite stop leaves to resume from (``kept``, the checkpoint of ``kept_step``; None: none), and the
    line that resumes it at half the LR scale in force: a NaN that an LR too high made comes back on the same one.
    The run's directory where the checkpoint is in its ``checkpoints/`` (``--resume`` takes its last.pt)."""
    lower = f"--lr-scale {lr_scale / 2:g}"
    if kept is None:
        return (f"No checkpoint to resume from (no step finished before it, or the run keeps none): start it again with "
                f"a lower LR ({lower}) or clipping (--clip 1.0)")
    resumed = kept.parent.parent if kept.parent.name == "checkpoints" else kept
    return (f"The weights of step {kept_step}, before it, are in {kept}; resume from them with a lower LR: "
            f"torchlab-tui --resume {shlex.quote(str(resumed))} {lower}")


def again_after_nonfinite(kept: Path | None, kept_step: int, lr_scale: float) -> str:
    """What is left when the weights of ``kept_step`` (``kept``), which this process resumed from, gave a non-finite
    forward on its first step: an LR acts only after a forward, so no LR mends them. An earlier checkpoint of the run,
    resumed into a branch (the run's own directory holds the later steps), or a fresh start."""
    earlier = sorted((path for path in kept.parent.glob("step-*.pt") if _step_of(path) < kept_step), key=_step_of) if kept else []
    said = (f"The weights of step {kept_step}, which this run resumed from, give a non-finite forward too: a lower LR "
            f"acts only after a forward and cannot mend them")
    if not earlier:
        return f"{said}; start the run again with a lower LR (--lr-scale {lr_scale / 2:g}) or clipping (--clip 1.0)"
    branch = kept.parent.parent.with_name(f"{kept.parent.parent.name}-from-{_step_of(earlier[-1])}")
    return (f"{said}; go back to an earlier checkpoint with a lower LR: torchlab-tui --resume "
            f"{shlex.quote(str(earlier[-1]))} --run-dir {shlex.quote(str(branch))} --lr-scale {lr_scale / 2:g}")


def _step_of(path: Path) -> int:
    """The step of a checkpoint file named ``step-0000040.pt``; -1 for any other name."""
    digits = path.stem.removeprefix("step-")
    return int(digits) if digits.isdigit() else -1


def localise_nonfinite(
    model: torch.nn.Module,
    run_loss: Callable[[], torch.Tensor],
    batch: Any,
) -> dict[str, Any]:
    """Return ``{"phase", "module", "detail"}`` for the first non-finite value when replaying a batch.

    ``run_loss`` computes the loss on ``batch`` under the run's autocast; gradients it leaves are
    discarded by the caller.
    """
    for name, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            if not torch.isfinite(param).all():
                return _report("parameters", name, f"parameter {_qualified(name, param_name)} holds NaN/Inf")
    if _has_nonfinite(batch):
        return _report("input", None, "the input batch already holds NaN/Inf")

    tracer = _Tracer(model)
    try:
        loss = run_loss()
        if tracer.first_nonfinite_output is not None:
            name = tracer.first_nonfinite_output
            return _report("forward", name, f"the output of {_display(name)} is the first non-finite value")
        if not torch.isfinite(loss.detach()).all():
            return _report("loss", None, "every module output is finite; the loss function made the NaN/Inf")
        loss.backward()
        name = tracer.backward_culprit()
        if name is not None:
            return _report("backward", name, f"the backward pass of {_display(name)} produced the first NaN/Inf gradient")
    finally:
        tracer.remove()
    for name, module in model.named_modules():
        for param in module.parameters(recurse=False):
            if param.grad is not None and not torch.isfinite(param.grad).all():
                return _report("backward", name, f"the gradient of {_display(name)} holds NaN/Inf")
    return _report("unknown", None, "the replayed step was finite (a non-deterministic NaN?)")


class _Tracer:
    """Temporary hooks recording where values first become non-finite, forward and backward."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.first_nonfinite_output: str | None = None
        self._output_grad_finite: dict[str, bool] = {}
        self._candidates: list[str] = []
        self._handles = []
        for name, module in model.named_modules():
            self._handles.append(module.register_forward_pre_hook(self._pre_hook(name)))
            self._handles.append(module.register_forward_hook(self._hook(name)))

    def _pre_hook(self, name: str):
        def hook(module, inputs):
            for tensor in _tensors(inputs):
                if tensor.requires_grad:
                    tensor.register_hook(self._input_grad_hook(name))

        return hook

    def _hook(self, name: str):
        def hook(module, inputs, output):
            for tensor in _tensors(output):
                if self.first_nonfinite_output is None and not torch.isfinite(tensor.detach()).all():
                    self.first_nonfinite_output = name
                if tensor.requires_grad:
                    tensor.register_hook(self._output_grad_hook(name))

        return hook

    def _output_grad_hook(self, name: str):
        def hook(grad):
            finite = bool(torch.isfinite(grad).all())
            self._output_grad_finite[name] = self._output_grad_finite.get(name, True) and finite

        return hook

    def _input_grad_hook(self, name: str):
        def hook(grad):
            if not torch.isfinite(grad).all() and self._output_grad_finite.get(name, True):
                self._candidates.append(name)

        return hook

    def backward_culprit(self) -> str | None:
        """The first candidate in backward order, preferring its innermost submodule on the same tensor."""
        if not self._candidates:
            return None
        culprit = self._candidates[0]
        for name in self._candidates[1:]:
            if culprit == "" or name.startswith(culprit + "."):
                culprit = name
        return culprit

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def _tensors(value: Any):
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _has_nonfinite(batch: Any) -> bool:
    return any(not torch.isfinite(tensor).all() for tensor in _tensors(batch))


def _report(phase: str, module: str | None, detail: str) -> dict[str, Any]:
    return {"phase": phase, "module": None if module is None else (module or ROOT_MODULE_NAME), "detail": detail}


def _display(name: str) -> str:
    return f"module {name!r}" if name else "the model's top level"


def _qualified(module_name: str, param_name: str) -> str:
    return f"{module_name}.{param_name}" if module_name else param_name
