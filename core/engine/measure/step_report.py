"""What one optimizer step reports, the one host transfer it is read from, and the metrics row made of it.

Everything a step reports is computed on the device (the loss, gradient norms, whether clipping fired,
activation statistics) and moved to the host together: one ``torch.cat(...).tolist()``. On CUDA that
transfer waits for the device, so it is the step's only synchronisation point. ``HostTransfer`` owns the
layout of the packed tensor, so the loop reads its results back by name, never by position.

``metrics_row`` is the one place a row of ``metrics.jsonl`` (and of the app's charts) is built: a ``MetricsRow``
(core/wire/metrics_row.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
import torch

from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.options import LiveOptions
from torchlab.core.wire.payloads import MemoryBreakdown, RankFigures, StepPhases


class HostTransfer:
    """Device tensors gathered under names, then moved to the host in one transfer (``to_host``)."""

    def __init__(self) -> None:
        self._parts: list[torch.Tensor] = []
        self._spans: dict[str, tuple[int, int]] = {}
        self._size = 0

    def add(self, name: str, tensor: torch.Tensor | None) -> None:
        """Queue ``tensor`` (any shape: flattened; any dtype: as fp32) under ``name``; None queues nothing."""
        if tensor is None:
            return
        if tensor.dtype != torch.float32:
            tensor = tensor.float()
        end = self._size + tensor.numel()
        self._parts.append(tensor)
        self._spans[name] = (self._size, end)
        self._size = end

    def to_host(self) -> HostValues:
        if len(self._parts) == 1:
            # A step that reports the loss alone (most steps, between probes): no concatenation, and a scalar is
            # read as it is (its reshape was a kernel call each step, as the copy of a concatenation is).
            only = self._parts[0]
            values = [only.tolist()] if only.dim() == 0 else only.reshape(-1).tolist()
        elif all(part.dim() == 0 for part in self._parts):  # the loss and the total norm of a clipped step
            values = torch.stack(self._parts).tolist()  # one kernel, where a reshape each and a cat are three
        else:
            values = torch.cat([part.reshape(-1) for part in self._parts]).tolist()
        return HostValues(values, self._spans)


class HostValues:
    """The host's copy of a ``HostTransfer``, read by name; a name that was not queued reads as None."""

    def __init__(self, values: list[float], spans: dict[str, tuple[int, int]]) -> None:
        self._values = values
        self._spans = spans

    def scalar(self, name: str) -> float | None:
        span = self._spans.get(name)
        return self._values[span[0]] if span is not None else None

    def vector(self, name: str) -> list[float] | None:
        span = self._spans.get(name)
        return self._values[span[0] : span[1]] if span is not None else None


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ is a C call per field, and one is made each step
class Update:
    """What a step's optimizer step did, as the host knows it: the loss and total norm it was judged by, the
    options it trained with (an OOM rescue's rung, where one was taken), the LRs it used, whether the precision
    stepped, and the spike guard's action where it spiked."""

    options: LiveOptions
    loss: float
    grad_norm_total: float | None
    clipped: bool | None
    stepped: bool
    lrs_used: list[float]
    spike: str | None = None


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ is a C call per field, and one is made each step
class StepReport:
    """One optimizer step as the host sees it after the step's transfer.

    ``lr`` is the LR the step used (the schedule has moved on since); ``stepped`` is False when the
    precision skipped the optimizer step (fp16 overflow). ``grad_norm_total`` and ``clipped`` are None
    on steps that did not measure or clip; ``grad_norms`` (per module) on steps the probe did not report;
    ``act_stats`` (per module: mean, std, max |x|) on steps that did not sample them; ``memory`` (by kind) on
    steps that did not measure it. ``compiling``: torch.compile compiled during the step; ``ran_eagerly``: the
    step ran the model uncompiled although compile is on (it sampled activation statistics). The impact table
    leaves the times of both out."""

    step: int
    options: LiveOptions  # in force for this step: commands change them only between steps
    loss: float
    lr: float
    stepped: bool
    grad_norm_total: float | None
    clipped: bool | None
    grad_norms: dict[str, float] | None
    act_stats: dict[str, list[float]] | None
    step_time_s: float
    data_wait_s: float
    memory: MemoryBreakdown | None = None
    metrics: dict[str, float] | None = None  # the workload's own (loss_fn's mapping), averaged over micro-batches and ranks
    lrs: dict[str, float] | None = None  # each parameter group's LR, where the workload's optimizer has several
    compiling: bool = False
    ran_eagerly: bool = False
    spike: str | None = None  # what the spike guard did with the step (core/engine/guards/spike_guard.py), where it spiked
    phases: StepPhases | None = None  # where its time went, on the probe's steps (core/engine/measure/step_phases.py)


def stats_by_module(module_names: list[str], table: list[float]) -> dict[str, list[float]]:
    """A flattened [modules, 3] statistics table as {module: [mean, std, max |x|]}, leaving out the
    modules that did not run this step (NaN rows)."""
    return {name: table[3 * i : 3 * i + 3] for i, name in enumerate(module_names) if not math.isnan(table[3 * i])}


def metrics_row(report: StepReport, *, elapsed_s: float, epoch: int, batch_size: int,
                rank_figures: list[RankFigures] | None,
                evaluate: Callable[[], tuple[float, dict[str, float] | None]] | None) -> MetricsRow:
    """The metrics row of a report step: ``report``, the run's training time and epoch, each rank's figures
    where they were gathered, and the validation loss (and metrics) where ``evaluate`` is given: called last, so
    that the row's time and elapsed time are those of the step, not of the evaluation after it. ``batch_size``
    is the global batch, all ranks together."""
    now = time.time()
    val_loss, val_metrics = evaluate() if evaluate is not None else (None, None)
    return MetricsRow(
        step=report.step,
        time=now,
        elapsed_s=round(elapsed_s, 3),
        epoch=epoch,
        loss=report.loss,
        lr=report.lr,
        samples_per_s=batch_size * report.options.accum / report.step_time_s,
        step_time_s=report.step_time_s,
        grad_norm_total=report.grad_norm_total,
        clipped=report.clipped,
        grad_norms=report.grad_norms,
        skipped=not report.stepped and report.spike is None,  # the precision's skip: the guard's is ``spike``
        data_wait_s=report.data_wait_s,
        options=report.options,
        lrs=report.lrs,
        metrics=report.metrics,
        compiling=report.compiling,
        eager=report.ran_eagerly,
        act_stats=report.act_stats,
        memory=report.memory,
        ranks=rank_figures,
        val_loss=val_loss,
        spike=report.spike,
        val_metrics=val_metrics,
        phases=report.phases,
    )
