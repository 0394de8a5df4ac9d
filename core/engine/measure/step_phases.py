"""Where a step's time goes: each training step timed by phase, their means carried by the probe's rows
(``StepPhases``, in the metrics row).

The phases are the step's own (core/engine/step.py): the wait for the loader and the batch's copy to the device
(core/engine/data.py times both), each micro-batch's forward and backward, the optimizer's step with zero_grad and
the schedule, the engine's own collectives, the probes' own work; ``other`` is the rest of the step's time
(bookkeeping, the step's one transfer), so the phases add up to the step. Every step is timed (two clock readings
a phase: about 3 us a step), and a row of the probe's cadence carries the mean of the steps since the last: a
window over every step, where the probe's own steps alone (a few in a hundred on a fast model) would say little, and
would say the probe's cost. A step that compiled (torch.compile) is left out, as the impact table leaves it out.

Timed on the host's clock, where it is the truth: on a CPU each op runs as it is called, so the clock between two
points of the step is the time of the ops between them. On CUDA the host only queues kernels, and its clock would
time the queueing, not the work: there the phases are to be read from CUDA events on the stream, and until then a
CUDA run's rows carry none (``times_phases``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from torchlab.core.engine.measure.flops import Counted
from torchlab.core.wire.payloads import PHASES, StepPhases


def times_phases(device: torch.device) -> bool:
    """Whether this device's steps are timed by phase: where the host's clock times the work (a CPU)."""
    return device.type == "cpu"


class PhaseTimer:
    """A phase's seconds over a step, added up each time it is entered (each micro-batch's forward)."""

    __slots__ = ("seconds", "_started")

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0

    def __enter__(self) -> PhaseTimer:
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc_info: object) -> bool:
        self.seconds += time.perf_counter() - self._started
        return False


class PhaseClock:
    """One step's timers of the phases it times itself (the data's are the stream's)."""

    __slots__ = ("forward", "backward", "optimizer", "communication")

    def __init__(self) -> None:
        self.forward, self.backward = PhaseTimer(), PhaseTimer()
        self.optimizer, self.communication = PhaseTimer(), PhaseTimer()

    def seconds(self, step_time_s: float, data_s: float, copy_s: float, probes_s: float) -> list[float]:
        """The step's seconds by phase (``PHASES``), ``other`` the rest of ``step_time_s``: the loader's wait
        ``data_s`` holds its copy ``copy_s`` (the stream times them together), counted once, as the copy;
        ``probes_s``, the probes' own time, is outside the phases it fell in (the update probe's copy is not the
        optimizer's)."""
        timed = [data_s - copy_s, copy_s, self.forward.seconds, self.backward.seconds, self.optimizer.seconds,
                 self.communication.seconds, probes_s]
        return [*timed, step_time_s - sum(timed)]


class PhaseTotals:
    """The phases of the steps since the last row that carried them, added up; and the FLOPs of those whose kind was
    counted (measure/flops.py), with their time less the probes'."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._seconds = [0.0] * len(PHASES)
        self._steps = 0
        self._flops, self._ops, self._flops_s, self._flops_steps = 0, 0, 0.0, 0

    def add(self, seconds: list[float], counted: Counted | None) -> None:
        self._seconds = [total + step for total, step in zip(self._seconds, seconds)]
        self._steps += 1
        if counted is not None:
            self._flops += counted.flops
            self._ops += counted.ops
            self._flops_s += sum(seconds) - seconds[_PROBES]
            self._flops_steps += 1

    def take(self, peak: Callable[[], float | None]) -> StepPhases | None:
        """Their means, for a row; None where no step was timed since the last. ``peak``: the device's peak FLOP/s,
        asked where the steps' FLOPs are known."""
        if not self._steps:
            return None
        means = [total / self._steps for total in self._seconds]
        known = self._flops_steps > 0 and self._flops_s > 0
        phases = StepPhases(*means, steps=self._steps, flops=self._flops / self._flops_steps if known else None,
                            flops_per_s=self._flops / self._flops_s if known else None,
                            peak_flops_per_s=peak() if known else None,
                            ops=self._ops / self._flops_steps if known else None)
        self._reset()
        return phases


_PROBES = PHASES.index("probes")
