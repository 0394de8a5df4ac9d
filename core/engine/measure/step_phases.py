"""Where a step's time goes: each training step timed by phase, their means carried by the probe's rows
(``StepPhases``, in the metrics row).

The phases are the step's own (core/engine/step.py): the wait for the loader and the batch's copy to the device
(core/engine/data.py marks both on the step's clock), each micro-batch's forward and backward, the optimizer's step
with zero_grad and the schedule, the engine's own collectives, the probes' own work; ``other`` is the rest of the
step's time (bookkeeping, the step's one transfer), so the phases add up to the step. A phase is timed between two
marks, one where it starts and one where it ends; the step's first mark is at its start, its last at its end, and
what falls between them but is not the step's (the row of the step before, sent meanwhile) is marked too and left
out. A row of the probe's cadence carries the mean of the steps timed since the last: a window over the steps, where
the probe's own steps alone (a few in a hundred on a fast model) would say little, and would say the probe's cost.
A step that compiled (torch.compile) is left out, as the impact table leaves it out.

**Where a mark is.** On a CPU each op runs as it is called: a mark is the host's clock (``HostMark``), and every step
is timed (about 3 us a step). On CUDA the host only queues kernels, and its clock would time the queueing: a mark is
an event on the stream (``StreamMark``), reached when the device has run everything queued before it, so a phase is
the device's time from its first kernel's turn to its last's end, the device's idle time waiting for the host within
it included (a loader's wait shows as the device idle between the data's marks, where nothing else was queued to
run meanwhile: the exposed wait, not the host's). Events are read without a sync of their own: a step's marks are
read once the device has passed its last (``query``), which the step's one transfer ensures at each report; the run's
last row waits for its last step. Recording an event costs the host microseconds: steps are timed while the events
have cost under ``STREAM_SHARE`` of the training time (a timed step is no different from the others).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

import torch

from torchlab.core.engine.measure.flops import Counted
from torchlab.core.wire.payloads import PHASES, StepPhases

#: The devices whose steps are timed: a CPU's on the host's clock, CUDA's with events on the stream.
TIMED_DEVICES = ("cpu", "cuda")
#: On CUDA, steps are timed while recording their events has taken under this share of the training time.
STREAM_SHARE = 0.005


class Mark(Protocol):
    """A point of a step: where the work queued before it was done."""

    def record(self) -> None: ...
    def done(self) -> bool: ...
    def wait(self) -> None: ...
    def seconds_to(self, later: Mark) -> float: ...


class HostMark:
    """A point of a step on the host's clock: on a CPU, where each op runs as it is called, when those before it ran."""

    __slots__ = ("at",)

    def __init__(self) -> None:
        self.at = 0.0

    def record(self) -> None:
        self.at = time.perf_counter()

    def done(self) -> bool:
        return True

    def wait(self) -> None:
        return None

    def seconds_to(self, later: HostMark) -> float:  # type: ignore[override]
        return later.at - self.at


class StreamMark:
    """A point of a step on the CUDA stream: an event, reached when the device has run what was queued before it."""

    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = torch.cuda.Event(enable_timing=True)

    def record(self) -> None:
        self.event.record()

    def done(self) -> bool:
        return self.event.query()

    def wait(self) -> None:
        self.event.synchronize()

    def seconds_to(self, later: StreamMark) -> float:  # type: ignore[override]
        return self.event.elapsed_time(later.event) / 1e3


class Marks:
    """The marks of a device's steps, each kind's made once and used again once read; and, for events on a stream,
    what recording them has cost the host (``cost_s``)."""

    def __init__(self, make: Callable[[], Mark], stream: bool) -> None:
        self._make, self.stream = make, stream
        self._free: list[Mark] = []
        self.cost_s = 0.0

    @classmethod
    def of(cls, device: torch.device) -> Marks:
        """A CUDA device's events on its stream, or the host's clock."""
        return cls(StreamMark, stream=True) if device.type == "cuda" else cls(HostMark, stream=False)

    def recorded(self) -> Mark:
        """A mark, recorded now; on a stream, what recording it cost the host is added up."""
        if not self.stream:
            mark = self._free.pop() if self._free else self._make()
            mark.record()
            return mark
        started = time.perf_counter()
        mark = self._free.pop() if self._free else self._make()
        mark.record()
        self.cost_s += time.perf_counter() - started
        return mark

    def give_back(self, marks: list[Mark]) -> None:
        self._free.extend(marks)


class _Phase:
    """A phase of a step's clock: marked where each time it is entered (each micro-batch's forward) starts and ends."""

    __slots__ = ("_clock", "_index", "_start")

    def __init__(self, clock: PhaseClock, index: int) -> None:
        self._clock, self._index = clock, index
        self._start: Mark | None = None

    def __enter__(self) -> _Phase:
        self._start = self._clock.marks.recorded()
        return self

    def __exit__(self, *exc_info: object) -> bool:
        self._clock.spans.append((self._index, self._start, self._clock.marks.recorded()))  # type: ignore[arg-type]
        return False


_PROBES = PHASES.index("probes")
_OUTSIDE = len(PHASES)  # a span inside the step's marks that is not the step's


class PhaseClock:
    """One step's marks: its start and end, and a span for each time a phase ran (``data`` and ``copy`` are the
    batch stream's, the others the step's own); ``outside``: inside the step's marks, not the step's."""

    def __init__(self, marks: Marks) -> None:
        self.marks = marks
        self.spans: list[tuple[int, Mark, Mark]] = []
        self.data, self.copy, self.forward, self.backward, self.optimizer, self.communication, self.probes = (
            _Phase(self, index) for index in range(_PROBES + 1))
        self.outside = _Phase(self, _OUTSIDE)
        self._start = marks.recorded()
        self._end: Mark | None = None

    def finish(self) -> None:
        """The step's last mark: its end."""
        self._end = self.marks.recorded()

    def read(self, wait: bool) -> list[float] | None:
        """The step's seconds by phase (``PHASES``), ``other`` the rest of the step's; None while the device has not
        reached the step's end (unless ``wait``: then once it has). Its marks are used again."""
        end = self._end
        assert end is not None, "a step's clock is read once it is finished"
        if not end.done():
            if not wait:
                return None
            end.wait()
        seconds = [0.0] * (_OUTSIDE + 1)  # the timed phases', "other"'s (none: the rest), outside's
        for index, start, stop in self.spans:
            seconds[index] += start.seconds_to(stop)
        total = self._start.seconds_to(end) - seconds.pop()
        seconds.pop()
        self.marks.give_back([self._start, end, *(mark for _, start, stop in self.spans for mark in (start, stop))])
        return [*seconds, total - sum(seconds)]


class PhaseTotals:
    """The phases of the steps timed since the last row that carried them, added up (a step's once its clock can be
    read); and the FLOPs of those whose kind was counted (measure/flops.py), with their time less the probes'."""

    def __init__(self, marks: Marks) -> None:
        self.marks = marks
        self.trained_s = 0.0  # training's steps' time in this process: the stream's events' share is of it
        self._waiting: deque[tuple[PhaseClock, Counted | None]] = deque()
        self._reset()

    def _reset(self) -> None:
        self._seconds = [0.0] * len(PHASES)
        self._steps = 0
        self._flops, self._convolution_flops, self._ops, self._flops_s, self._flops_steps = 0, 0, 0, 0.0, 0

    def due(self) -> bool:
        """Whether the next step is timed: every step on the host's clock; on a stream, while its events have cost
        under ``STREAM_SHARE`` of the training time (the first step is timed)."""
        return not self.marks.stream or self.marks.cost_s <= STREAM_SHARE * self.trained_s

    def add(self, clock: PhaseClock, counted: Counted | None) -> None:
        """A finished step's clock, read as soon as its marks are reached (on the host, at once)."""
        self._waiting.append((clock, counted))
        self._read(wait=False)

    def _read(self, wait: bool) -> None:
        while self._waiting:
            clock, counted = self._waiting[0]
            seconds = clock.read(wait)
            if seconds is None:
                return
            self._waiting.popleft()
            self._seconds = [total + step for total, step in zip(self._seconds, seconds)]
            self._steps += 1
            if counted is not None:
                self._flops += counted.flops
                self._convolution_flops += counted.convolution_flops
                self._ops += counted.ops
                self._flops_s += sum(seconds) - seconds[_PROBES]
                self._flops_steps += 1

    def take(self, peak: Callable[[float], float | None], wait: bool = False) -> StepPhases | None:
        """Their means, for a row; None where no step was read since the last. ``wait``: the steps still running on
        the device are waited for (the run's last row). ``peak``: the device's peak FLOP/s for the steps' share of
        FLOPs in convolutions, asked where the steps' FLOPs are known."""
        self._read(wait)
        if not self._steps:
            return None
        means = [total / self._steps for total in self._seconds]
        known = self._flops_steps > 0 and self._flops_s > 0
        phases = StepPhases(*means, steps=self._steps, clock="stream" if self.marks.stream else "host",
                            flops=self._flops / self._flops_steps if known else None,
                            flops_per_s=self._flops / self._flops_s if known else None,
                            peak_flops_per_s=peak(self._convolution_flops / self._flops) if known and self._flops else None,
                            ops=self._ops / self._flops_steps if known else None)
        self._reset()
        return phases


