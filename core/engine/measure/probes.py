"""Probes that read the model while it trains, on the device, with one host transfer per report.

Gradient norms are read *after* backward (not from module backward hooks: those break on a following
in-place ReLU and may see ``weight.grad`` still None). One ``torch._foreach_norm`` call measures every
parameter; an ``index_add_`` sums squares per owning module; nothing leaves the device here. The
caller packs the results with the loss into one tensor and moves it to the host once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy
import torch
import torch.distributed as dist

from torchlab.core.engine.parallel.sharding import is_shard, local

ROOT_MODULE_NAME = "(root)"  # parameters owned directly by the top-level model


@dataclass
class GradNorms:
    """Device tensors: ``per_module`` [modules] (None: only the total was asked for), ``total`` [] (both fp32),
    plus the grads measured."""

    per_module: torch.Tensor | None
    total: torch.Tensor
    grads: list[torch.Tensor]


class GradNormProbe:
    """Per-module gradient norms for every module that owns parameters, keyed by qualified name.

    Tied parameters (GPT-2's ``lm_head.weight`` is ``transformer.wte.weight``) count once, for the first
    module that owns them; ``tied_names`` keeps the names of the other modules that hold them, so the app can
    say where ``lm_head`` went (a module whose every parameter is tied has no row of its own)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.module_names: list[str] = []
        self.param_counts: list[int] = []  # parameters each module owns, aligned with module_names
        #: per module (aligned with module_names): the other modules that hold some of its parameters
        self.tied_names: list[list[str]] = []
        self._params: list[torch.nn.Parameter] = []
        owners: list[int] = []
        first_owner: dict[int, int] = {}  # id(parameter) -> index of the module it counts for
        for name, module in model.named_modules():
            name = name or ROOT_MODULE_NAME
            trainable = [p for p in module.parameters(recurse=False) if p.requires_grad]
            for parameter in trainable:
                owner = first_owner.get(id(parameter))
                if owner is not None and name not in self.tied_names[owner]:
                    self.tied_names[owner].append(name)
            owned = [p for p in trainable if id(p) not in first_owner]
            if not owned:
                continue
            index = len(self.module_names)
            first_owner.update((id(p), index) for p in owned)
            owners.extend([index] * len(owned))
            self.module_names.append(name)
            self.param_counts.append(sum(p.numel() for p in owned))
            self.tied_names.append([])
            self._params.extend(owned)
        self._owner_index_cpu = torch.tensor(owners, dtype=torch.long)
        self._owner_index: torch.Tensor | None = None
        #: the parameters are FSDP2's shards: each rank measures its own, and the squares are summed over the ranks
        self.sharded = any(is_shard(parameter) for parameter in self._params)

    def measure(self, per_module: bool = True) -> GradNorms | None:
        """Norms of the current gradients, on the device; None when no parameter has a gradient. ``per_module``
        False: the total alone, as clipping between the probe's steps needs (the module sums are 3 more kernels).
        The total is the same arithmetic either way, so a clipped step does not depend on whether it was probed.
        Sharded (FSDP2), each rank measures its shards and one all-reduce sums the squares: every rank then holds
        the norms of the whole gradients (a shard's norm alone under-reports by up to √ranks)."""
        present = [i for i, p in enumerate(self._params) if p.grad is not None]
        if not present:
            return None
        grads = [local(self._params[i].grad) for i in present]  # the shards' local tensors, scaled in place by clipping
        norms = torch.stack(torch._foreach_norm(grads)).float()
        some = present if len(present) < len(self._params) else None
        if self.sharded:
            squares = norms.square()
            sums = torch.cat([self.module_sums(squares, some) if per_module else squares[:0], squares.sum().reshape(1)])
            dist.all_reduce(sums)
            roots = sums.sqrt()
            return GradNorms(per_module=roots[:-1] if per_module else None, total=roots[-1], grads=grads)
        total = torch.linalg.vector_norm(norms)  # one kernel (as clip_grad_norm_ does), not a square, a sum and a root
        if not per_module:
            return GradNorms(per_module=None, total=total, grads=grads)
        return GradNorms(per_module=self.module_sums(norms.square(), some).sqrt(), total=total, grads=grads)

    @property
    def params(self) -> list[torch.nn.Parameter]:
        """The parameters measured, each once, in the order of ``module_sums``'s values."""
        return self._params

    def module_squares(self, tensors: list[torch.Tensor], present: list[int] | None = None, ord: float = 2) -> torch.Tensor:
        """The ``ord``-norm of each tensor (one per parameter of ``params``, or of those at ``present``; this rank's
        shard where sharded), combined per owning module as one vector's 2-norm would be, on the device, before its
        root: [modules]. ``ord`` 1 of non-negative tensors (Adam's v) gives each module's sum, whose root is the norm
        of their square roots. Sharded, ``across_shards`` sums the ranks' before the root is taken."""
        norms = torch.stack(torch._foreach_norm([local(tensor) for tensor in tensors], ord)).float()
        return self.module_sums(norms.square() if ord == 2 else norms, present)

    def across_shards(self, sums: torch.Tensor) -> torch.Tensor:
        """``sums`` (of squares, per module) summed over the ranks where the parameters are sharded: one all-reduce,
        which every rank calls; as it is otherwise."""
        if self.sharded:
            dist.all_reduce(sums)
        return sums

    def module_sums(self, values: torch.Tensor, present: list[int] | None = None) -> torch.Tensor:
        """A value per parameter (of ``params``, or of those at the indices ``present``) summed per owning module, on
        the device: [modules], zero for a module none of whose parameters is present."""
        device = values.device
        if present is None:
            if self._owner_index is None or self._owner_index.device != device:
                self._owner_index = self._owner_index_cpu.to(device)
            owner_index = self._owner_index
        else:  # some parameters only (no gradient this step: an unused branch; no Adam state)
            owner_index = self._owner_index_cpu[present].to(device)
        return torch.zeros(len(self.module_names), device=device).index_add_(0, owner_index, values)


def clip_by_total_norm(norms: GradNorms, max_norm: float, total: float) -> None:
    """Scale the measured gradients so their global norm, ``total`` (``norms.total`` as the step's transfer read it),
    is at most ``max_norm``, reusing the norms.

    Same arithmetic as ``clip_grad_norm_(foreach=True)``, its coefficient ``max_norm / (total + 1e-6)`` in float32 as
    the device would take it, without reading the gradients a second time; decided on the host, which reads the
    total anyway: a step below the limit multiplies nothing (clip_grad_norm_ multiplies by 1), and no kernel computes
    the coefficient (on a CPU the two were a third of clipping's cost: 35 of 105 us on resnet_small's 25 tensors).
    A total that is not finite is left to what follows (fp16's scaler skips the step; otherwise it stops the run).
    """
    if not math.isfinite(total):
        return
    coefficient = numpy.float32(max_norm) / (numpy.float32(total) + numpy.float32(1e-6))
    if coefficient < 1.0:
        torch._foreach_mul_(norms.grads, float(coefficient))


def clipped(total_norm: float | None, max_norm: float | None) -> bool | None:
    """Whether clipping to ``max_norm`` scaled a step's gradients, from their total norm; None where it did not clip
    (no limit, or no gradient)."""
    if max_norm is None or total_norm is None:
        return None
    return total_norm > max_norm


class ProbeCadence:
    """Decides on which steps the gradient-norm probe runs.

    ``every`` fixed (0 = never) or ``"auto"``: the probe times itself and runs every N steps with N the
    smallest that keeps its cost under ``budget`` of the step time. On steps where clipping is on, the
    norms are computed anyway, so the probe is free and always reports.

    The budget is a quarter of the 1 % the probes may cost, because the probe's own timing sees only
    part of what it costs: on ``benchmarks/resnet_small.py`` (CPU) a probe timed itself at 0.35-0.42 ms
    while steps with it took 0.57-1.4 ms longer than steps without (1.6-3.5x; the per-module figures'
    transfer, their record and its encoding come on top), so 0.25 % timed is 0.4-0.9 % of the training.
    At 10 ms a step that is a probe every ~10 steps: 10 tables a second, more than a screen shows.
    """

    def __init__(self, every: int | str, budget: float = 0.0025) -> None:
        self.fixed = None if every == "auto" else int(every)
        self.budget = budget
        self._probe_cost_s: float | None = None
        self._step_time_s: float | None = None
        self._last_probe_step = 0

    @property
    def interval(self) -> int:
        if self.fixed is not None:
            return self.fixed
        if self._probe_cost_s is None or not self._step_time_s:
            return 1
        return max(1, min(100, math.ceil(self._probe_cost_s / (self.budget * self._step_time_s))))

    @property
    def probe_cost_s(self) -> float | None:
        """The probe's measured cost per run (moving average), or None before it first ran."""
        return self._probe_cost_s

    def should_probe(self, step: int) -> bool:
        interval = self.interval
        return interval > 0 and step - self._last_probe_step >= interval

    def record_probe(self, step: int, cost_s: float) -> None:
        self._last_probe_step = step
        self._probe_cost_s = _ema(self._probe_cost_s, cost_s)

    def record_step(self, step_time_s: float) -> None:
        self._step_time_s = _ema(self._step_time_s, step_time_s)


def _ema(previous: float | None, value: float, weight: float = 0.1) -> float:
    return value if previous is None else (1 - weight) * previous + weight * value


class ActivationStatsProbe:
    """Opt-in mean / std / max|x| of every parameter-owning module's output, sampled every N steps.

    Hooks are attached only for a sampled step and removed after it (hooks on every module every step
    cost ~37 % on a small GPT). Statistics come from a strided subsample of at most ``max_values``
    elements, on the device. Under activation checkpointing forward hooks fire again in the recompute;
    only the first call per module in a step counts.
    """

    def __init__(self, model: torch.nn.Module, module_names: list[str], max_values: int = 65536) -> None:
        self.module_names = module_names
        self._modules = [
            model if name == ROOT_MODULE_NAME else model.get_submodule(name) for name in module_names
        ]
        self.max_values = max_values
        self._handles: list = []
        self._stats: dict[int, torch.Tensor] = {}

    def attach(self) -> None:
        self._stats = {}
        self._handles = [
            module.register_forward_hook(self._hook_for(index)) for index, module in enumerate(self._modules)
        ]

    def detach(self) -> torch.Tensor | None:
        """Remove the hooks; return [modules, 3] stats on the device (NaN where a module did not run)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if not self._stats:
            return None
        device = next(iter(self._stats.values())).device
        table = torch.full((len(self._modules), 3), math.nan, device=device)
        for index, stats in self._stats.items():
            table[index] = stats
        return table

    def _hook_for(self, index: int):
        def hook(module, inputs, output):
            if index in self._stats:
                return
            tensor = output[0] if isinstance(output, (tuple, list)) and output else output
            if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point() or tensor.numel() == 0:
                return
            with torch.no_grad():
                flat = tensor.detach().reshape(-1)
                stride = max(1, flat.numel() // self.max_values)
                sample = flat[::stride].float()
                mean = sample.mean()
                std = (sample.square().mean() - mean.square()).clamp_min(0).sqrt()
                self._stats[index] = torch.stack((mean, std, sample.abs().max()))

        return hook
