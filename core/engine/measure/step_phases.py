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

**Where a mark is.** On a CPU each op runs as it is called: a mark is a reading of the host's clock (``HostMarks``),
and every step is timed (about 7 us a step for ten spans, by ``timeit``). On CUDA the host only queues kernels, and
its clock would time the queueing: a mark is an event on the stream (``StreamMarks``), reached when the device has
run everything queued before it, so a phase is the device's time from its first kernel's turn to its last's end, the
device's idle time waiting for the host within it included (a loader's wait shows as the device idle between the
data's marks, where nothing else was queued to run meanwhile: the exposed wait, not the host's). Events are read
without a sync of their own: a step's marks are read once the device has passed its last (``query``), which the
step's one transfer ensures at each report; the run's last row waits for its last step. Recording an event costs the
host microseconds: steps are timed while the events have cost under ``STREAM_SHARE`` of the training time (a timed
step trains as any other).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from torchlab.core.engine.measure.flops import Counted
from torchlab.core.wire.payloads import PHASES, StepPhases

#: The devices whose steps are timed: a CPU's on the host's clock, CUDA's with events on the stream.
TIMED_DEVICES = ("cpu", "cuda")
#: On CUDA, steps are timed while recording their events has taken under this share of the training time.
STREAM_SHARE = 0.005


class HostMarks:
    """Marks on the host's clock: on a CPU, where each op runs as it is called, a mark is the time those before it
    ran (a float: a reading of the clock is all a mark costs)."""

    stream = False
    cost_s = 0.0

    def __init__(self) -> None:
        self.recorded: Callable[[], Any] = time.perf_counter

    def done(self, mark: Any) -> bool:
        return True

    def wait(self, mark: Any) -> None:
        return None

    def seconds(self, start: Any, end: Any) -> float:
        return end - start

    def give_back(self, marks: list[Any]) -> None:
        return None


class StreamMarks:
    """Marks on the CUDA stream: events with timing, each reached when the device has run what was queued before it,
    made once and used again once read; and what recording them has cost the host (``cost_s``)."""

    stream = True

    def __init__(self, make: Callable[[], Any] = lambda: torch.cuda.Event(enable_timing=True)) -> None:
        self._make = make
        self._free: list[Any] = []
        self.cost_s = 0.0

    def recorded(self) -> Any:
        started = time.perf_counter()
        event = self._free.pop() if self._free else self._make()
        event.record()
        self.cost_s += time.perf_counter() - started
        return event

    def done(self, mark: Any) -> bool:
        return mark.query()

    def wait(self, mark: Any) -> None:
        mark.synchronize()

    def seconds(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1e3

    def give_back(self, marks: list[Any]) -> None:
        self._free.extend(marks)


Marks = HostMarks | StreamMarks


def marks_of(device: torch.device) -> Marks:
    """A CUDA device's events on its stream, or the host's clock."""
    return StreamMarks() if device.type == "cuda" else HostMarks()


class _Phase:
    """A phase of a step's clock: marked where each time it is entered (each micro-batch's forward) starts and ends."""

    __slots__ = ("_spans", "_recorded", "_index", "_start")

    def __init__(self, clock: PhaseClock, index: int) -> None:
        self._spans, self._recorded, self._index = clock.spans, clock.marks.recorded, index
        self._start: Any = None

    def __enter__(self) -> _Phase:
        self._start = self._recorded()
        return self

    def __exit__(self, *exc_info: object) -> bool:
        self._spans.append((self._index, self._start, self._recorded()))
        return False


_PROBES = PHASES.index("probes")
_OUTSIDE = len(PHASES)  # a span inside the step's marks that is not the step's


class PhaseClock:
    """One step's marks: its start and end, and a span for each time a phase ran (``data`` and ``copy`` are the
    batch stream's, the others the step's own); ``outside``: inside the step's marks, not the step's. Used again
    for a later step once read (``start``)."""

    def __init__(self, marks: Marks) -> None:
        self.marks = marks
        self.spans: list[tuple[int, Any, Any]] = []
        self.data, self.copy, self.forward, self.backward, self.optimizer, self.communication, self.probes = (
            _Phase(self, index) for index in range(_PROBES + 1))
        self.outside = _Phase(self, _OUTSIDE)
        self._start: Any = None
        self._end: Any = None

    def start(self) -> PhaseClock:
        """The step's first mark: its start."""
        self.spans.clear()
        self._start, self._end = self.marks.recorded(), None
        return self

    def finish(self) -> None:
        """The step's last mark: its end."""
        self._end = self.marks.recorded()

    def read(self, wait: bool) -> list[float] | None:
        """The step's seconds by phase (``PHASES``), ``other`` the rest of the step's; None while the device has not
        reached the step's end (unless ``wait``: then once it has). Its marks are used again."""
        marks, end = self.marks, self._end
        assert end is not None, "a step's clock is read once it is finished"
        if not marks.done(end):
            if not wait:
                return None
            marks.wait(end)
        seconds = [0.0] * (_OUTSIDE + 1)  # the timed phases', "other"'s (none: the rest), outside's
        for index, start, stop in self.spans:
            seconds[index] += marks.seconds(start, stop)
        total = marks.seconds(self._start, end) - seconds.pop()
        seconds.pop()
        if marks.stream:
            marks.give_back([self._start, end, *(mark for _, start, stop in self.spans for mark in (start, stop))])
        return [*seconds, total - sum(seconds)]


class PhaseTotals:
    """The phases of the steps timed since the last row that carried them, added up (a step's once its clock can be
    read); and the FLOPs of those whose kind was counted (measure/flops.py), with their time less the probes'."""

    def __init__(self, marks: Marks) -> None:
        self.marks = marks
        self._read_clocks: list[PhaseClock] = []  # used again for a later step
        self.trained_s = 0.0  # training's steps' time in this process: the events' and FLOP counts' shares are of it
        self._waiting: deque[tuple[PhaseClock, Counted | None]] = deque()
        #: the phases since the ranks' figures were last gathered (``since_gathered``): their cadence is not the rows'
        self._gathered_seconds, self._gathered_steps = [0.0] * len(PHASES), 0
        self._reset()

    def _reset(self) -> None:
        self._seconds = [0.0] * len(PHASES)
        self._steps = 0
        self._flops, self._run_flops, self._convolution_flops, self._ops, self._flops_s, self._flops_steps = 0, 0, 0, 0, 0.0, 0

    def due(self) -> bool:
        """Whether the next step is timed: every step on the host's clock; on a stream, while its events have cost
        under ``STREAM_SHARE`` of the training time (the first step is timed)."""
        return not self.marks.stream or self.marks.cost_s <= STREAM_SHARE * self.trained_s

    def clock(self) -> PhaseClock:
        """A step's clock, started now."""
        return (self._read_clocks.pop() if self._read_clocks else PhaseClock(self.marks)).start()

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
            self._read_clocks.append(clock)
            self._seconds = [total + step for total, step in zip(self._seconds, seconds)]
            self._steps += 1
            self._gathered_seconds = [total + step for total, step in zip(self._gathered_seconds, seconds)]
            self._gathered_steps += 1
            if counted is not None:  # the model's FLOPs: checkpointing's recompute is not the model's (flops.py)
                self._flops += counted.flops - counted.recompute_flops
                self._run_flops += counted.flops  # what ran, recompute too: of them the convolutions'
                self._convolution_flops += counted.convolution_flops
                self._ops += counted.ops
                self._flops_s += sum(seconds) - seconds[_PROBES]
                self._flops_steps += 1

    def since_gathered(self) -> dict[str, float] | None:
        """The means by phase of the steps read since the last call (a rank's figures, gathered to rank 0 at their own
        cadence: core/engine/parallel/distributed.py), by name; None where none was read."""
        self._read(wait=False)
        steps, seconds = self._gathered_steps, self._gathered_seconds
        self._gathered_seconds, self._gathered_steps = [0.0] * len(PHASES), 0
        return {name: total / steps for name, total in zip(PHASES, seconds)} if steps else None

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
                            peak_flops_per_s=peak(self._convolution_flops / self._run_flops) if known and self._flops else None,
                            ops=self._ops / self._flops_steps if known else None)
        self._reset()
        return phases


