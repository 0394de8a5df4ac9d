"""Mixed precision as small objects: the loop calls the same hooks whatever the mode.

``make_precision`` is the one place where the string ``"fp16"`` becomes behaviour; it refuses modes the
device cannot run, with the reason. The fp16 GradScaler is created when fp16 is first chosen and then
kept by the trainer (and saved in checkpoints), so switching fp16 off and on again keeps its scale.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import ContextManager

import torch

from torchlab.core.wire.options import OptionRefused


class Precision:
    """Full precision: every hook is the plain PyTorch call."""

    name = "off"
    #: fp16 overflow is routine (the scaler skips the step); in other modes NaN/Inf is an error.
    tolerates_nonfinite = False

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def autocast(self) -> ContextManager:
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients to their true scale before they are measured or clipped."""

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Take the optimizer step; return False when it was skipped."""
        optimizer.step()
        return True


class BF16Precision(Precision):
    name = "bf16"

    def autocast(self) -> ContextManager:
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)


class FP16Precision(Precision):
    name = "fp16"
    tolerates_nonfinite = True

    def __init__(self, device: torch.device, scaler: torch.amp.GradScaler) -> None:
        super().__init__(device)
        self.scaler = scaler

    def autocast(self) -> ContextManager:
        return torch.autocast(device_type=self.device.type, dtype=torch.float16)

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


def make_precision(
    name: str, device: torch.device, get_scaler: Callable[[], torch.amp.GradScaler]
) -> Precision:
    """Build the precision for ``name`` on ``device``, or raise OptionRefused with the reason."""
    if name == "off":
        return Precision(device)
    if name == "bf16":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise OptionRefused(f"bf16 is not supported by {torch.cuda.get_device_name(device)}; use fp16")
        return BF16Precision(device)
    if name == "fp16":
        if device.type != "cuda":
            raise OptionRefused(
                f"fp16 needs CUDA (its GradScaler and fast fp16 kernels); this run is on {device.type}: use bf16"
            )
        return FP16Precision(device, get_scaler())
    raise OptionRefused(f"amp must be one of off, bf16, fp16, got {name!r}")
