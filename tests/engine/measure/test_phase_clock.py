"""A step's clock (core/engine/measure/step_phases.py) on marks whose times the test sets: each phase is the time
between its marks, what is not the step's is left out, ``other`` is the rest; on a stream, a step is read only once
the device has passed its last mark (no sync of its own), the run's last row waits for it, and steps are timed
while their events cost the host under its share of the training time."""

from __future__ import annotations

import pytest

from torchlab.core.engine.measure.flops import Counted
from torchlab.core.engine.measure.step_phases import STREAM_SHARE, HostMarks, PhaseClock, PhaseTotals, StreamMarks
from torchlab.core.wire.payloads import PHASES


class Device:
    """What the fake marks read: the time now, and how far the device has run (the events recorded before it)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.recorded = 0
        self.reached = 0  # events the device has passed
        self.waited = 0


class FakeEvent:
    """A CUDA event as the stream's marks use it, on the test's clock and its device's progress."""

    def __init__(self, device: Device) -> None:
        self.device, self.at, self.order = device, 0.0, 0

    def record(self) -> None:
        self.device.recorded += 1
        self.at, self.order = self.device.now, self.device.recorded

    def query(self) -> bool:
        return self.order <= self.device.reached

    def synchronize(self) -> None:
        self.device.waited += 1
        self.device.reached = max(self.device.reached, self.order)

    def elapsed_time(self, later: FakeEvent) -> float:
        return (later.at - self.at) * 1000  # ms, as CUDA's


def host_marks(device: Device) -> HostMarks:
    marks = HostMarks()
    marks.recorded = lambda: device.now
    return marks


def one_step(clock: PhaseClock, device: Device) -> None:
    """A step: data 2 s, copy 1 s, forward 3 s, a gap of 1 s, backward 4 s, the row before sent (5 s, not the
    step's), probes 0.5 s, optimizer 2 s, then 0.5 s to its end."""
    for phase, seconds in (("data", 2), ("copy", 1), ("forward", 3), (None, 1), ("backward", 4), ("outside", 5),
                           ("probes", 0.5), ("optimizer", 2), (None, 0.5)):
        if phase is None:
            device.now += seconds
            continue
        with getattr(clock, phase):
            device.now += seconds
    clock.finish()


def test_a_steps_phases_are_their_marks_spans_and_other_is_the_rest_of_the_step_less_what_is_not_its():
    device = Device()
    totals = PhaseTotals(host_marks(device))
    clock = totals.clock()
    one_step(clock, device)
    seconds = dict(zip(PHASES, clock.read(wait=False)))
    assert seconds == {"data": 2, "copy": 1, "forward": 3, "backward": 4, "optimizer": 2, "communication": 0,
                       "probes": 0.5, "other": 1.5}
    assert sum(seconds.values()) == 14  # the step's 19 s less the 5 s that were not its own


def test_a_read_clock_and_its_events_are_used_again():
    device, made = Device(), []
    totals = PhaseTotals(StreamMarks(lambda: made.append(1) or FakeEvent(device)))
    first = totals.clock()
    one_step(first, device)
    device.reached = device.recorded
    totals.add(first, None)
    second = totals.clock()
    one_step(second, device)
    assert second is first and len(made) == device.recorded / 2  # the second step's events are the first's


def test_a_streams_steps_are_read_once_the_device_passed_them_and_the_last_row_waits_for_its_steps():
    device = Device()
    totals = PhaseTotals(StreamMarks(lambda: FakeEvent(device)))
    first = totals.clock()
    one_step(first, device)
    totals.add(first, Counted(flops=28, ops=3, convolution_flops=7))
    second = totals.clock()
    one_step(second, device)
    device.reached = device.recorded - 1  # the second step's last mark not reached yet (its optimizer runs)
    totals.add(second, None)
    shares = []
    phases = totals.take(lambda share: shares.append(share) or 100.0)
    assert phases.steps == 1 and phases.clock == "stream" and device.waited == 0  # read without a wait
    assert phases.flops == 28 and phases.flops_per_s == 28 / (14 - 0.5) and shares == [0.25] and phases.mfu == phases.flops_per_s / 100
    assert totals.take(lambda share: None) is None  # nothing read since
    last = totals.take(lambda share: None, wait=True)
    assert last.steps == 1 and last.forward_s == 3 and last.flops is None and device.waited == 1


def test_a_stream_times_steps_while_its_events_cost_the_host_under_their_share_of_training():
    totals = PhaseTotals(StreamMarks(lambda: FakeEvent(Device())))
    assert totals.due()  # the first step is timed
    totals.marks.cost_s = 0.01
    totals.trained_s = 0.01 / STREAM_SHARE - 1
    assert not totals.due()
    totals.trained_s += 2
    assert totals.due()
    host = PhaseTotals(HostMarks())
    host.trained_s = 0.0
    assert host.due()  # the host's clock costs a reading: every step is timed (its cost is the loop's, measured)


@pytest.mark.parametrize("attribute", ["data", "copy", "forward", "backward", "optimizer", "communication", "probes"])
def test_every_phase_but_other_has_its_span_on_the_clock(attribute):
    """A phase the step marks is one of ``PHASES``: the clock's spans and the payload's fields are one list."""
    device = Device()
    clock = PhaseClock(host_marks(device)).start()
    with getattr(clock, attribute):
        device.now += 1
    clock.finish()
    seconds = dict(zip(PHASES, clock.read(wait=False)))
    assert seconds[attribute] == 1 and sum(seconds.values()) == 1
