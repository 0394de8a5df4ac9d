"""A step's FLOPs and the device's peak: what fraction of the hardware a run uses (MFU).

The FLOPs are counted with PyTorch's own formulas (``torch.utils.flop_counter``) on a training step itself, the model
uncompiled, by a dispatch mode that only reads (each op runs with its kernels and random numbers): its matrix
products, convolutions and attention (all of its scores, causal or not, as torch counts them), forward and backward,
and under activation checkpointing the forward ops that backward runs again, as such: counted apart and left out of
the MFU, which is of the model's FLOPs (elementwise ops count none, as in every MFU). A count is made once for each kind of step: the shapes of its first batch, and the settings that
change its work (checkpointing, split, accum); a step of a kind counted before is known without counting it.
Counting makes a step slower (each op passes through Python): a kind not yet counted is counted only while counting
has taken under ``COUNT_SHARE`` of the run's training time, and a counted step is left out of the step times (its
phases, as a compile's are). The same count says where the FLOPs are, by module (measure/module_flops.py) and by op;
each kind counted is announced (``flops_counted``).

The peak is the device's for the step's dtype (the precision's ``compute_dtype``: float32, or amp's bf16 or fp16): on
a CPU measured once for each, as the best FLOP/s of a matrix product repeated for 0.3 s (``measured_cpu_peak``); on
CUDA the vendor's figure for the GPU by its name (measure/device_peaks.py), convolutions' FLOPs held to their own
where it differs (float32's TF32 switches); or the one the run is given (``--peak-tflops``), for a device the table
lacks. Where none is known the FLOPs and FLOP/s are still counted, and the MFU is left out.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

from torchlab.core.engine.measure.device_peaks import cuda_peak
from torchlab.core.engine.measure.module_flops import BACKWARD, FORWARD, RECOMPUTE, ModuleFlopTracker
from torchlab.core.wire.events import FlopsCounted
from torchlab.core.wire.payloads import ModuleFlops, OpFlops


def _attention_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> int:
    return sdpa_flop_count(query.shape, key.shape, value.shape)


def _attention_backward(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any,
                        **kwargs: Any) -> int:
    return sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)


#: torch's FLOP formulas by op (each given the op's arguments and ``out_val``), and attention's kernels on a CPU, which
#: its table lacks (it has the CUDA ones): counted as those are.
_FORMULAS = {**flop_registry, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _attention_forward,
             torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _attention_backward}
#: Counting takes at most this share of the run's training time (the first count is always made).
COUNT_SHARE = 0.02
#: The matrix product that measures a CPU's peak: its side, and how long it is repeated.
_PEAK_SIDE = 512
_PEAK_SECONDS = 0.3


def step_kind(first_batch_shapes: tuple | None, options: Any) -> Any:
    """What a step's FLOPs depend on: the shapes of its first batch (its others are alike, but an epoch's last) and
    the settings that change its work: checkpointing (recompute), split, accum."""
    return first_batch_shapes, options.checkpointing, options.split, options.accum


#: Convolutions' ops: on CUDA their float32 runs as TF32 by cuDNN's own switch, a matrix product's by another's.
_CONVOLUTIONS = {torch.ops.aten.convolution, torch.ops.aten._convolution, torch.ops.aten.convolution_backward}


@dataclass(frozen=True)
class Counted:
    """One kind of step's FLOPs, of them its convolutions', and the ops it dispatched (each an op's fixed cost on
    the host: views too)."""

    flops: int  # the ops' all, checkpointing's recompute included
    ops: int
    convolution_flops: int = 0
    #: of ``flops``, the forward ops activation checkpointing ran again in backward: work the hardware did that the
    #: model needs none of, left out of the MFU (model FLOPs utilisation, as PaLM defined it: recompute is not counted)
    recompute_flops: int = 0
    #: by the module each op ran for: name -> {"forward", "backward", "recompute"} -> FLOPs (measure/module_flops.py)
    by_module: dict[str, dict[str, int]] = field(default_factory=dict)
    #: by op, as the profiler names them ("aten::mm"): where a profile's times give FLOP/s by op
    by_op: dict[str, int] = field(default_factory=dict)


class _FlopsAndOps(TorchDispatchMode):
    """Counts a step's FLOPs with torch's own formulas (``flop_registry``; the CPU's attention kernels with ours) and
    every op it dispatches (each an op's fixed cost on the host). Not ``FlopCounterMode``: its module tracking adds
    backward hooks that a model taking ``autograd.grad`` inside its forward (a gradient penalty) cannot run under.
    It only reads: each op runs as it would, with the same kernels and random numbers."""

    def __init__(self, modules: ModuleFlopTracker) -> None:
        super().__init__()
        self.flops = 0
        self.convolution_flops = 0
        self.recompute_flops = 0
        self.ops = 0
        self.modules = modules
        self.by_op: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops += 1
        packet = func._overloadpacket
        formula = _FORMULAS.get(packet)
        if formula is not None:
            flops = int(formula(*args, **kwargs, out_val=out))
            self.flops += flops
            if packet in _CONVOLUTIONS:
                self.convolution_flops += flops
            if flops:
                if self.modules.charge(flops) == RECOMPUTE:
                    self.recompute_flops += flops
                name = packet._qualified_op_name
                self.by_op[name] = self.by_op.get(name, 0) + flops
        return out

    def counted(self) -> Counted:
        return Counted(self.flops, self.ops, self.convolution_flops, self.recompute_flops, self.modules.by_module,
                       self.by_op)


class StepFlops:
    """The FLOPs of each kind of step counted so far, and when to count one more."""

    def __init__(self, model: torch.nn.Module, device: torch.device, given_peak: float | None = None) -> None:
        self.model, self.device = model, device
        #: the peak FLOP/s the run was given (``--peak-tflops``): every dtype's, in place of the table's or a measure
        self.given_peak = given_peak
        self._counted: dict[Any, Counted] = {}
        self._counting_s = 0.0
        self.last_kind: Any = None  # the kind of the last training step: the next is expected to be of it
        self._peaks: dict[torch.dtype, float] = {}
        self._gpu_name: str | None = None

    def counted(self, kind: Any) -> Counted | None:
        """The FLOPs and ops of a step of ``kind``, where one was counted."""
        return self._counted.get(kind)

    def due(self, compiled: bool, trained_s: float) -> bool:
        """Whether the next step, expected to be of the last one's kind, is counted: a kind not counted yet, while
        counting has taken under ``COUNT_SHARE`` of ``trained_s``, the training time (the first count is made at once). Not while
        the model is compiled: the count runs a step eagerly, whose numbers differ from the compiled graph's in the
        last bits (a resume would not be bit-exact); a kind counted before compile came on holds for it, the same
        FLOPs."""
        if self.last_kind in self._counted or compiled:
            return False
        return not self._counted or self._counting_s < COUNT_SHARE * trained_s

    @contextlib.contextmanager
    def counting(self) -> Iterator[Callable[[], Counted]]:
        """Around a step's forward and backward passes: its FLOPs and ops counted; yields what gives them, once the
        step is through (``record`` then files them)."""
        started = time.perf_counter()
        counter = _FlopsAndOps(ModuleFlopTracker(self.model))
        try:
            with counter.modules, counter:
                yield counter.counted
        finally:
            self._counting_s += time.perf_counter() - started

    def record(self, kind: Any, counted: Counted) -> None:
        self._counted[kind] = counted

    def peak(self, dtype: torch.dtype, convolution_share: float = 0.0) -> float | None:
        """The device's peak FLOP/s for steps of ``dtype``, ``convolution_share`` of whose FLOPs are convolutions':
        the one given, a CPU's measured once a dtype, a GPU's from the table; None where it is not known."""
        if self.given_peak is not None:
            return self.given_peak
        if self.device.type == "cuda":
            if self._gpu_name is None:  # asked once: a row of the probe's asks for the peak
                self._gpu_name = torch.cuda.get_device_name(self.device)
            return cuda_peak(self._gpu_name, dtype, convolution_share)
        if self.device.type != "cpu":
            return None
        if dtype not in self._peaks:
            self._peaks[dtype] = measured_cpu_peak(dtype)
        return self._peaks[dtype]


def measured_cpu_peak(dtype: torch.dtype = torch.float32) -> float:
    """A CPU's FLOP/s on matrix products of ``dtype``, with the threads torch uses: the best of repeated products of
    ``_PEAK_SIDE`` square matrices over ``_PEAK_SECONDS``, the most this CPU does on the ops a model's FLOPs are in."""
    a, b = (torch.full((_PEAK_SIDE, _PEAK_SIDE), 0.5, dtype=dtype) for _ in range(2))  # no random numbers: the run's
    flops = 2 * _PEAK_SIDE ** 3
    best = 0.0
    deadline = time.perf_counter() + _PEAK_SECONDS
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        torch.mm(a, b)
        best = max(best, flops / (time.perf_counter() - started))
    return best


def flops_counted(step: int, kind: Any, counted: Counted) -> FlopsCounted:
    """The event of a kind of step counted on ``step`` (``step_kind``'s ``kind``): by module and by op, largest first."""
    shapes, checkpointing, split, accum = kind
    by_module = [ModuleFlops(name, passes[FORWARD], passes[BACKWARD], passes[RECOMPUTE])
                 for name, passes in counted.by_module.items()]
    return FlopsCounted(step=step, flops=counted.flops - counted.recompute_flops, recomputed=counted.recompute_flops,
                        ops=counted.ops, shapes=[list(shape) for shape in shapes or ()],
                        settings={"checkpointing": checkpointing, "split": split, "accum": accum},
                        by_module=sorted(by_module, key=lambda entry: -entry.total),
                        by_op=[OpFlops(op, flops) for op, flops in sorted(counted.by_op.items(), key=lambda item: -item[1])])
