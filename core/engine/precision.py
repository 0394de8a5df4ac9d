"""Mixed precision as small objects: the loop calls the same hooks whatever the mode.

As in Lightning Fabric's precision plugins, the hooks of ``Precision`` are the plain PyTorch calls and
each mixed mode overrides what it must; the loop never branches on a mode, and never sees the fp16
GradScaler. ``make_precision`` is the one place where the string ``"fp16"`` becomes behaviour; it
refuses modes the device cannot run, with the reason (``precision_refusal``: the same checks, nothing made). ``Precisions`` is the trainer's precision part: the
mode in force (``current``), and the one GradScaler: created when fp16 is first chosen, kept while another
mode runs (switching fp16 off and on again keeps its scale), saved in checkpoints and restored from them
(``state_dict``, ``load_state_dict``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, ContextManager

import torch

from torchlab.core.options import OptionChangeError

_NOTHING = contextlib.nullcontext()  # reusable: one for every step


class Precision:
    """Full precision: every hook is the plain PyTorch call."""

    name = "off"
    #: fp16 overflow is routine (the scaler skips the step); in other modes NaN/Inf is an error.
    tolerates_nonfinite = False
    #: the dtype FSDP2 gathers a sharded model's parameters in (its MixedPrecisionPolicy): None, their own
    param_dtype: torch.dtype | None = None
    #: the dtype autocast runs matrix products in: the device's peak FLOP/s an MFU is held to (measure/flops.py)
    compute_dtype: torch.dtype = torch.float32

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def autocast(self) -> ContextManager:
        return _NOTHING

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients to their true scale before they are measured or clipped."""

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Take the optimizer step; return False when it was skipped."""
        optimizer.step()
        return True

    def skipped_step(self) -> dict[str, Any]:
        """Why the last ``step`` was skipped, as the ``step_skipped`` event's fields (only fp16 skips)."""
        return {"reason": f"amp={self.name} skipped the optimizer step", "scale": None}


class BF16Precision(Precision):
    name = "bf16"
    compute_dtype = torch.bfloat16

    def autocast(self) -> ContextManager:
        return torch.autocast(device_type=self.device.type, dtype=self.compute_dtype)


class ShardedBF16Precision(BF16Precision):
    """bf16 on a model FSDP2 shards (``parallel=fsdp``): autocast as in one process and under DDP, so the same ops run
    in bf16 and the same stay fp32 (a BatchNorm, a float buffer, the loss), and the losses are DDP's with autocast to
    the reductions' rounding; besides, each unit whose parameters autocast would cast at every use (linear layers,
    convolutions) is gathered in bf16, half the communication and gathered memory of fp32, its gradients reduced in
    fp32 (core/engine/parallel/sharding.py ``unit_policy``). That policy is fixed where the ranks shard the model
    (``Precisions.shard``), so a change of amp there relaunches them (core/engine/option_hooks.py)."""

    param_dtype = torch.bfloat16


class FP16Precision(Precision):
    """fp16 autocast with loss scaling: ``scaler`` is lent by ``Precisions``, which keeps it across modes."""

    name = "fp16"
    tolerates_nonfinite = True
    compute_dtype = torch.float16

    def __init__(self, device: torch.device, scaler: torch.amp.GradScaler) -> None:
        super().__init__(device)
        self.scaler = scaler

    def autocast(self) -> ContextManager:
        return torch.autocast(device_type=self.device.type, dtype=self.compute_dtype)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        scale_before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        # The scaler lowers its scale exactly when it found Inf/NaN and skipped the step.
        return self.scaler.get_scale() >= scale_before

    def skipped_step(self) -> dict[str, Any]:
        return {"reason": "fp16 overflow: the scaler lowered its scale", "scale": self.scaler.get_scale()}


def make_precision(
    name: str, device: torch.device, get_scaler: Callable[[], torch.amp.GradScaler], sharded: bool = False
) -> Precision:
    """Build the precision for ``name`` on ``device`` (``sharded``: for a model FSDP2 shards), or raise OptionChangeError
    with the reason.

    ``get_scaler`` is called only once fp16 is accepted, so a refused fp16 creates no GradScaler."""
    refusal = precision_refusal(name, device, sharded)
    if refusal is not None:
        raise OptionChangeError(refusal)
    if name == "off":
        return Precision(device)
    if name == "bf16":
        return ShardedBF16Precision(device) if sharded else BF16Precision(device)
    return FP16Precision(device, get_scaler())


def precision_refusal(name: str, device: torch.device, sharded: bool = False) -> str | None:
    """Why ``name`` cannot run on ``device`` (``sharded``: a model FSDP2 shards), or None; nothing is made."""
    if name == "off":
        return None
    if name == "bf16":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            return f"bf16 is not supported by {torch.cuda.get_device_name(device)}; use fp16"
        return None
    if name == "fp16":
        if device.type != "cuda":
            # Short enough for one line of the app's event log at 80 columns, after "amp = fp16 refused: ".
            return f"fp16 needs CUDA; this run is on {device.type}: use bf16"
        if sharded:
            return "fp16 with parallel=fsdp is not supported yet (loss scaling of sharded gradients); use bf16"
        return None
    return f"amp must be one of off, bf16, fp16, got {name!r}"


class Precisions:
    """The precision of one run on ``device``: the mode in force (``current``, full precision until the amp
    option is enacted), and the state that outlives a mode: the GradScaler.

    Its ``state_dict`` is the GradScaler's, in checkpoints under ``"grad_scaler"`` (None until fp16 was first
    chosen)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._grad_scaler: torch.amp.GradScaler | None = None
        self.current: Precision = Precision(device)
        self.sharded = False  # the model is FSDP2's: amp is its mixed precision policy

    def make(self, name: str) -> Precision:
        """The precision for ``name``, or OptionChangeError with the reason (nothing changes then)."""
        return make_precision(name, self.device, self._get_grad_scaler, self.sharded)

    def in_place_refusal(self, name: str) -> str | None:
        """Why amp cannot become ``name`` in this process, with nothing made: a mode this device cannot run, or a
        change on a sharded model, whose mixed precision policy is fixed while its ranks live (a change relaunches
        them). A trial asks before it spends anything (core/engine/trials.py)."""
        refusal = precision_refusal(name, self.device, self.sharded)
        if refusal is None and self.sharded and name != self.current.name:
            return (f"the ranks sharded this model with amp={self.current.name}'s mixed precision policy, fixed while "
                    f"they live: amp={name} takes new ranks (a relaunch); a changes it for good")
        return refusal

    def shard(self) -> None:
        """The model is about to be sharded: the mode in force becomes its sharded form (``ShardedBF16Precision``),
        or OptionChangeError where it has none (fp16)."""
        self.sharded = True
        self.current = self.make(self.current.name)

    def state_dict(self) -> dict[str, Any] | None:
        return self._grad_scaler.state_dict() if self._grad_scaler is not None else None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore a saved GradScaler into the one the fp16 mode holds; None (saved before fp16 was first chosen)
        leaves none: a scaler made since (a trial of fp16) is dropped."""
        if state is None:
            self._grad_scaler = None
        else:
            self._get_grad_scaler().load_state_dict(state)

    def _get_grad_scaler(self) -> torch.amp.GradScaler:
        if self._grad_scaler is None:
            self._grad_scaler = torch.amp.GradScaler(self.device.type)
        return self._grad_scaler
