"""Where the time goes, as a verdict with the change that tests it: from the phases of the last measured steps
(``StepPhases``, core/engine/measure/step_phases.py), each phase's share of a step, and what a share that large
says. One definition for every reader: the app's stats line and event log, and headless's lines.

A verdict names its figure and claims only what the phases show: a step that waits for its loader is input-bound
(``W`` raises the loader's workers, ``T`` trials it first); one whose batch copy to the device takes a large share
is copy-bound (``n`` pins memory); one whose engine collectives take it has its communication exposed (``m``
accumulates more micro-batches a step, whose ranks then meet once for all of them). A step whose time is in forward
and backward is launch-bound where its ops are as short as an op's own cost on the host (the ops and FLOPs of a
counted step: core/engine/measure/flops.py; ``C`` compiles them into fewer), else compute, with its MFU where its
FLOPs were counted; memory-bound is not claimed, which neither figure shows.

Standard library only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from torchlab.core.options import ACCUM, COMPILE, PIN_MEMORY, TRIAL_KEY, WORKERS, LiveOptions
from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.wire.payloads import PHASES, StepPhases

#: The steps a verdict is made from: the newest rows whose phases cover at least this many (a row of the probe's
#: carries the mean of the steps since the one before).
WINDOW_STEPS = 100
#: Fewer steps timed than this make no verdict yet.
MIN_STEPS = 10
#: A phase that takes this share of a step (of its time less the probes') names the step's bound.
BOUND_SHARE = 0.2
#: Forward and backward ops this short on average (their time over the ops a step dispatched) are mostly the host's
#: fixed cost of an op (dispatch, autograd: a few µs each on a CPU): the step is launch-bound.
LAUNCH_US_PER_OP = 50.0
#: ... while their FLOP/s are under this share of the device's peak (ops that short doing real work would be above).
LAUNCH_MFU = 0.05
#: The phases a step is bound by, the first above ``BOUND_SHARE`` named: what the user can change comes first.
_BOUND_BY = ("data", "copy", "communication")


@dataclass(frozen=True)
class Verdict:
    """``kind``: input-bound, copy-bound, communication-exposed, launch-bound, or compute; ``text`` says it with its figure and
    the change that tests it; ``shares``: each phase's share of the steps' time (the probes' left out); ``phase``:
    the one it is about (the largest, for compute); ``trial``: that change as a trial's ``OPTION=VALUE`` (what the
    app's trial prompt offers), None for compute."""

    kind: str
    text: str
    shares: dict[str, float]
    phase: str
    trial: str | None = None
    mfu: float | None = None  # the steps' FLOP/s over the device's peak, where their FLOPs were counted


def phase_shares(measured: Iterable[StepPhases]) -> dict[str, float] | None:
    """Each phase's share of the steps' time, over ``measured`` together, the probes' own time left out (a step the
    probe does not measure takes none of it). None where there is no time to share."""
    totals = dict.fromkeys(PHASES, 0.0)
    for phases in measured:
        for phase, seconds in phases.seconds().items():
            totals[phase] += seconds * phases.steps  # each a mean over its steps
    del totals["probes"]
    whole = sum(totals.values())
    if whole <= 0:
        return None
    return {phase: seconds / whole for phase, seconds in totals.items()}


def verdict(measured: list[StepPhases], options: LiveOptions | None = None) -> Verdict | None:
    """The bound of the steps ``measured`` (their rows' phases) under ``options``, or None for fewer than
    ``MIN_STEPS`` steps."""
    if sum(phases.steps for phases in measured) < MIN_STEPS:
        return None
    shares = phase_shares(measured)
    if shares is None:
        return None
    bound = next((phase for phase in _BOUND_BY if shares[phase] >= BOUND_SHARE), None)
    work = use_of_the_device(measured)
    mfu = work.mfu if work is not None else None
    match bound:
        case "data":
            return Verdict("input-bound", f"input-bound: {_percent(shares['data'])} of each step waits for data → "
                                          f"{WORKERS.key} to raise the loader's workers ({TRIAL_KEY} to trial it)", shares, bound,
                           _trial(WORKERS.name, max(2, 2 * options.workers) if options is not None else 2), mfu)
        case "copy":
            return Verdict("copy-bound", f"copy-bound: {_percent(shares['copy'])} of each step copies its batch to "
                                         f"the device → {PIN_MEMORY.key} to pin memory ({TRIAL_KEY} to trial it)", shares, bound,
                           _trial(PIN_MEMORY.name, "on"), mfu)
        case "communication":
            return Verdict("communication-exposed", f"communication {_percent(shares['communication'])} exposed: "
                                                    f"each step waits that long for the ranks' collectives (the "
                                                    f"slowest rank's arrival with them) → {ACCUM.key} to accumulate "
                                                    f"more micro-batches a step, whose ranks meet once a step (a "
                                                    f"larger batch; {TRIAL_KEY} to trial it)", shares, bound,
                           _trial(ACCUM.name, 2 * options.accum if options is not None else 2), mfu)
    compiled = options is not None and options.compile
    if work is not None and work.op_us <= LAUNCH_US_PER_OP and work.mfu < LAUNCH_MFU and not compiled:
        return Verdict("launch-bound", f"launch-bound: {work.ops:,.0f} ops a step of {work.op_us:.0f} µs each on "
                                       f"average (an op's own cost on the host is a few µs), {_percent(work.mfu, 2)} of "
                                       f"the device's peak FLOP/s → {COMPILE.key} to compile them into fewer "
                                       f"({TRIAL_KEY} to trial it)", shares, "forward", _trial(COMPILE.name, "on"), work.mfu)
    compute = shares["forward"] + shares["backward"] + shares["optimizer"]
    reached = f"; {_percent(mfu, 2)} of the device's peak FLOP/s (MFU)" if mfu is not None else ""
    return Verdict("compute", f"compute: forward {_percent(shares['forward'])}, backward "
                              f"{_percent(shares['backward'])}, optimizer {_percent(shares['optimizer'])} of each step "
                              f"({_percent(compute)} in all); data {_percent(shares['data'])}{reached}", shares,
                   max(shares, key=shares.__getitem__), mfu=mfu)


@dataclass(frozen=True)
class DeviceUse:
    """What the steps ``measured`` did with the device, where their FLOPs were counted: the FLOP/s achieved over the
    device's peak (``mfu``), and the ops a step dispatched with the time of forward and backward each took."""

    mfu: float
    ops: float
    op_us: float


def use_of_the_device(measured: list[StepPhases]) -> DeviceUse | None:
    counted = [phases for phases in measured if phases.flops and phases.flops_per_s and phases.peak_flops_per_s
               and phases.ops]
    if not counted:
        return None
    steps = sum(phases.steps for phases in counted)
    flops = sum(phases.flops * phases.steps for phases in counted)
    seconds = sum(phases.flops / phases.flops_per_s * phases.steps for phases in counted)
    ops = sum(phases.ops * phases.steps for phases in counted) / steps
    passes_s = sum((phases.forward_s + phases.backward_s) * phases.steps for phases in counted) / steps
    return DeviceUse(flops / seconds / counted[-1].peak_flops_per_s, ops, passes_s / ops * 1e6)


class BottleneckWatch:
    """The verdict of a run's last ``WINDOW_STEPS`` steps under the settings in force, followed row by row: ``add``
    returns it where its kind changed, or the settings did (said once, not at every row), else None."""

    def __init__(self) -> None:
        self.measured: deque[StepPhases] = deque()
        self.current: Verdict | None = None
        self._options: LiveOptions | None = None

    def add(self, row: MetricsRow) -> Verdict | None:
        phases = row.phases
        if phases is None:
            return None
        if row.options != self._options:  # another setting's steps: a verdict of their own (the change's answer),
            self.measured.clear()  # from the row after this one, whose steps paid the change's start (workers
            self.current, self._options = None, row.options  # starting, a compile) as much as its steady state
            return None
        self.measured.append(phases)
        while sum(kept.steps for kept in self.measured) - self.measured[0].steps >= WINDOW_STEPS:
            self.measured.popleft()  # the rest cover the window without it
        found = verdict(list(self.measured), self._options)
        if found is None:
            return None
        said = self.current is not None and found.kind == self.current.kind
        self.current = found  # its figures, newer
        return None if said else found


def _trial(option: str, value: object) -> str:
    return f"{option}={value}"


def _percent(share: float, digits: int = 0) -> str:
    """``41 %``; with ``digits``, that many significant ones for a small share (``0.027 %``)."""
    if digits and share < 0.1:
        return f"{share * 100:.{digits}g} %"
    return f"{share * 100:.0f} %"
