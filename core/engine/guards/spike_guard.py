"""Spike guard (live option ``spike_guard``: off | skip | rollback; issue 30): a step whose loss or gradient norm
spikes, from one bad batch, is held back instead of ending the run.

**What a spike is.** A step's loss, or its gradients' total norm, above the recent steps' by more than
``--spike-threshold`` robust deviations: (value - median) / (1.4826 · MAD) over the last ``--spike-window`` steps
that were not spikes (the median absolute deviation, scaled to a normal distribution's sigma), of the values'
logarithms where all are positive (a norm always, a loss nearly always: their noise is a factor, and a gradient
norm's steps late in training spread over a factor of three, which in differences were spikes every few dozen
steps), of the values themselves where not. The deviation is never taken below 1 % (of the median, in
differences), so that a loss that barely moves is not judged by its rounding. One-sided: a loss far below the
recent ones is good news. Judged once the window holds ``MIN_HISTORY`` values. A loss must also rise above the median
by ``ABSOLUTE_FLOOR`` of the run's loss scale (the median of its first window): a converged loss at 0.0008 that moves
to 0.00185 is 2.19 times its median, many deviations of a quiet window, yet nothing beside a loss that began at 2.3
(issue 45: the notice fired on it; the guard, on, held such steps back); a norm must be ``NORM_FACTOR_FLOOR`` times its
median or more (a norm 1.22 times its median in a quiet window was called a spike). With the guard on, a loss or norm
that is not finite is a spike too (except under fp16, whose scaler skips those steps itself). The loss and norm are
the step's report's, on the host already: the guard adds no transfer; on, it has the total norm measured every
step (one ``vector_norm`` over the per-parameter norms, as clipping does).

**What is done with it.**
- ``off``: the step is applied; a one-line notice names it and how far out it was (the first of a run of spikes),
  and the key that turns the guard on. A loss that is not finite stops the run, as it did. Each such spike is marked
  in its metrics row (``spike``: ``let_through``); its notice reaches the journal (and the app, and a headless run's
  lines) for the run's first, then at most once per ``OFF_NOTICE_EVERY_S``, each carrying the count of those held
  back since the one before (``held_back``), and at the run's end the latest one held back: a noisy loss's notices
  of a guard that is off were 507 events in 5,000 steps (issue 46), saying nothing a person could act on 506 times.
- ``skip``: its update is not applied: the optimizer and the schedule stay as they were (as the GradScaler skips
  fp16's overflows), and training goes on with the next batch.
- ``rollback``: the weights and the optimizer's and schedule's state go back to the older of two copies kept in
  host memory (core/engine/host_copy.py), taken every ``ROLLBACK_EVERY`` steps: 10 to 20 steps back. The batches
  since are not trained on again (the data goes on). A second rollback within a window of steps halves the LR scale
  for a cool-down of a window of steps, then puts it back, each said as the option's change.
A guarded step is a step that did not update: step numbers go on, and the run ends at its last step as before.

**A new level, not a spike.** ``SHIFT_STEPS`` spikes in a row are a change of level (of the data, of the LR a
person set): the guard takes the last of them as it is and starts its window again from them. If they are not
finite, the run stops as it would without the guard.

Not in a trial's arm, where a spike is the arm's result; with ranks, every rank judges the same loss (averaged
over the ranks) and the same norm (of the averaged gradients), so all decide alike, at the same step.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import deque
from dataclasses import dataclass

from torchlab.core.engine.host_copy import HostCopy
from torchlab.core.engine.option_hooks import enact
from torchlab.core.engine.parts import TrainingParts
from torchlab.core.wire import protocol as p
from torchlab.core.wire.events import LET_THROUGH, MAX_SPIKE_SAMPLES, NEW_LEVEL, ROLLED_BACK, SKIPPED, SpikeGuarded
from torchlab.core.options import LR_SCALE, OptionChangeError
from torchlab.core.wire.throttle import Throttle

#: Values the window holds before the guard judges a step: fewer, and a median says little.
MIN_HISTORY = 20
#: Spikes in a row that are a new level, not a spike.
SHIFT_STEPS = 5
#: Steps between the host copies a rollback goes back to (two are kept: 10 to 20 steps back).
ROLLBACK_EVERY = 10
#: Spikes whose batches shared the same few samples (at most ``MAX_SUSPECTS``) before the guard names them.
SUSPECT_AFTER, MAX_SUSPECTS = 3, 3
#: The window's median and deviation are taken again after it gains this many values.
REFRESH_EVERY = 5
#: A normal distribution's sigma, from its median absolute deviation.
MAD_TO_SIGMA = 1.4826
#: The deviation's floor, as a share of the median: a loss that barely moves is not judged by its rounding.
RELATIVE_FLOOR = 0.01
#: The least rise above the median that is a loss's spike, as a share of the run's loss scale (its first window's
#: median): a loss tiny beside where it began is no spike, however many times its converged median.
ABSOLUTE_FLOOR = 0.01
#: The least factor above the median that is a gradient norm's spike: a norm 1.22 times its median, 6.2 deviations of
#: a quiet window, was called a spike of a transformers Trainer's GPT-2 with clipping at 1.0 (issue 45, as a user).
NORM_FACTOR_FLOOR = 1.5
#: With the guard off, its notices after the run's first reach the journal at most once per this long (the others
#: are counted in the next one's ``held_back``, the last of them said at the run's end).
OFF_NOTICE_EVERY_S = 60.0



@dataclass(frozen=True)
class Spike:
    """A step's ``measure`` (``loss`` or ``grad_norm``) at ``value``: ``z`` robust deviations above ``median``
    (infinite where the value is not finite), against ``window`` recent values."""

    measure: str
    value: float
    median: float | None
    z: float
    window: int


class SpikeDetector:
    """The recent steps' losses and norms, and the robust z-score of a new one against them. The window's median and
    deviation are taken again each ``REFRESH_EVERY`` values it gains, not at every step: 13 µs a step (25 with the
    norm) were 1 % of a millisecond step, with the guard off; a window of 50 moves little in five."""

    def __init__(self, window: int, threshold: float) -> None:
        self.window, self.threshold = window, threshold
        self.history: dict[str, deque[float]] = {"loss": deque(maxlen=window), "grad_norm": deque(maxlen=window)}
        self._robust: dict[str, _Robust | None] = {"loss": None, "grad_norm": None}
        #: the median of the run's first ``MIN_HISTORY`` losses, its size where training began (``ABSOLUTE_FLOOR``)
        self.loss_scale: float | None = None

    def judge(self, loss: float, grad_norm: float | None, nonfinite_is_spike: bool) -> Spike | None:
        """The spike in this step's loss or norm (the loss's first), or None."""
        for measure, value in (("loss", loss), ("grad_norm", grad_norm)):
            if value is None:
                continue
            history = self.history[measure]
            if not math.isfinite(value):
                if nonfinite_is_spike:
                    return Spike(measure, value, statistics.median(history) if history else None, math.inf, len(history))
                continue
            if len(history) < MIN_HISTORY:
                continue
            robust = self._robust[measure]
            if robust is None or robust.gained >= REFRESH_EVERY:
                robust = self._robust[measure] = _Robust.of(history)
            z = robust.z(value)
            if z > self.threshold:
                median = statistics.median(history)
                if measure == "loss" and self.loss_scale is not None and value - median < ABSOLUTE_FLOOR * abs(self.loss_scale):
                    continue  # far out in a quiet window, but tiny beside the loss the run began with
                if measure == "grad_norm" and value < NORM_FACTOR_FLOOR * median:
                    continue  # far out in a quiet window, but a norm's ordinary sway
                return Spike(measure, value, median, z, len(history))
        return None

    def accept(self, loss: float, grad_norm: float | None) -> None:
        """A step that was not a spike: its values join the window."""
        for measure, value in (("loss", loss), ("grad_norm", grad_norm)):
            if value is not None and math.isfinite(value):
                self.history[measure].append(value)
                robust = self._robust[measure]
                if robust is not None:
                    robust.gained += 1
        if self.loss_scale is None and len(self.history["loss"]) >= MIN_HISTORY:
            self.loss_scale = statistics.median(self.history["loss"])

    def load(self, loss: list[float], grad_norm: list[float], loss_scale: float | None) -> None:
        """The window and the loss scale as a checkpoint kept them."""
        for measure, values in (("loss", loss), ("grad_norm", grad_norm)):
            self.history[measure].clear()
            self.history[measure].extend(values)
            self._robust[measure] = None
        self.loss_scale = loss_scale

    def restart(self, values: list[tuple[float, float | None]]) -> None:
        """The window from these steps' values alone: a new level."""
        for measure, history in self.history.items():
            history.clear()
            self._robust[measure] = None
        for loss, grad_norm in values:
            self.accept(loss, grad_norm)


@dataclass
class _Robust:
    """A window's centre and robust deviation: of the values' logarithms where all are positive (a norm always; a
    loss nearly always), where noise is a factor, not a difference (a gradient norm's steps spread over a factor of
    three late in training); of the values themselves otherwise. ``gained``: values the window took since."""

    logarithms: bool
    centre: float
    deviation: float
    gained: int = 0

    @classmethod
    def of(cls, history: deque[float]) -> _Robust:
        logarithms = min(history) > 0
        values = [math.log(past) for past in history] if logarithms else list(history)
        centre = statistics.median(values)
        floor = RELATIVE_FLOOR if logarithms else RELATIVE_FLOOR * abs(centre)  # a factor of 1.01, or 1 % of it
        deviation = max(MAD_TO_SIGMA * statistics.median([abs(value - centre) for value in values]), floor, 1e-12)
        return cls(logarithms, centre, deviation)

    def z(self, value: float) -> float:
        """How many deviations ``value`` lies above the centre (a value at or below 0 in logarithms: far below)."""
        if self.logarithms:
            return (math.log(value) - self.centre) / self.deviation if value > 0 else -math.inf
        return (value - self.centre) / self.deviation


@dataclass
class _Cooldown:
    until: int  #: the last step at the lowered scale
    scale: float  #: the scale the guard set
    restore: float  #: the scale before the first rollback's cool-down


class SpikeGuard:
    """The spike guard of one run (see the module docstring): ``judge`` each step, ``hold_back`` a spike the guard
    acts on, ``before_update`` before the optimizer step, ``after_step`` at the boundary."""

    def __init__(self, parts: TrainingParts) -> None:
        self.parts = parts
        self.detector = SpikeDetector(parts.config.spike_window, parts.config.spike_threshold)
        self._in_a_row: list[tuple[float, float | None]] = []  # the spikes of the steps just before, their values
        self._copies: list[HostCopy] = []  # at most two, oldest first
        self._spare: HostCopy | None = None
        self._last_rollback: int | None = None
        self._cooldown: _Cooldown | None = None
        self._suspects: set[int] = set()  # the samples the last spikes' batches shared
        self._suspect_spikes = 0  # how many spikes they were in
        self._off_notices = Throttle(burst=1, window_s=OFF_NOTICE_EVERY_S)  # a guard that is off: its notices
        self._held_notice: SpikeGuarded | None = None  # the latest of them held back, said at the run's end

    @property
    def on(self) -> bool:
        return self.parts.options.spike_guard != "off"

    def state_dict(self) -> dict:
        """What a resumed run needs to judge as this one would have, a checkpoint's ``spike_guard``: the window (else
        the guard is blind for ``MIN_HISTORY`` steps after a resume, when a spike that stopped a run is likeliest), the
        spikes in a row, the last rollback, and a cool-down in force (whose end puts the LR scale back: without it the
        halved scale would stay). Not the host copies: a rollback before the first copy after a resume is a skip,
        said so. The loss scale, which a window taken again at a new level keeps."""
        cooldown = self._cooldown
        return {
            "loss": list(self.detector.history["loss"]),
            "grad_norm": list(self.detector.history["grad_norm"]),
            "loss_scale": self.detector.loss_scale,
            "in_a_row": [[loss, grad_norm] for loss, grad_norm in self._in_a_row],
            "last_rollback": self._last_rollback,
            "cooldown": dataclasses.asdict(cooldown) if cooldown is not None else None,
        }

    def load_state_dict(self, state: dict) -> None:
        # a checkpoint written before the scale was kept has none: taken again from the window it fills next
        self.detector.load(state["loss"], state["grad_norm"], state.get("loss_scale"))
        self._in_a_row = [(loss, grad_norm) for loss, grad_norm in state["in_a_row"]]
        self._last_rollback = state["last_rollback"]
        self._cooldown = _Cooldown(**state["cooldown"]) if state["cooldown"] is not None else None

    def judge(self, step: int, loss: float, grad_norm: float | None) -> SpikeGuarded | None:
        """The guard's verdict on training's step ``step`` (its values on the host, before its update): None for an
        ordinary step; else the event that says what it is and what is done: an action in ``HELD_BACK`` holds the
        update back (``hold_back`` then does it), the others let it through (``report`` then says so)."""
        mode = self.parts.options.spike_guard
        nonfinite_is_spike = mode != "off" and not self.parts.precisions.current.tolerates_nonfinite
        spike = self.detector.judge(loss, grad_norm, nonfinite_is_spike)
        if spike is None:
            self._in_a_row.clear()
            self.detector.accept(loss, grad_norm)
            return None
        self._in_a_row.append((loss, grad_norm))
        first = len(self._in_a_row) == 1
        if len(self._in_a_row) >= SHIFT_STEPS:
            if not math.isfinite(spike.value):
                return None  # not finite, again and again: the run stops as it would without the guard
            self.detector.restart(self._in_a_row)
            self._in_a_row.clear()
            return self._event(step, spike, NEW_LEVEL, loss, grad_norm) if mode != "off" else None
        if mode == "off":
            return self._event(step, spike, LET_THROUGH, loss, grad_norm) if first else None
        return self._event(step, spike, ROLLED_BACK if mode == "rollback" else SKIPPED, loss, grad_norm)

    def hold_back(self, verdict: SpikeGuarded) -> SpikeGuarded:
        """Hold back the update of the step ``verdict`` judged (its gradients are dropped already): skipped, or the
        state rolled back to the older host copy (skipped where there is none yet, said so). Reports the event."""
        if verdict.action == ROLLED_BACK:
            restored = self._roll_back(verdict.step)
            if restored is None:
                note = "; ".join(filter(None, ["rollback had no copy to go back to yet", verdict.note]))
                verdict = dataclasses.replace(verdict, action=SKIPPED, note=note)
            else:
                verdict = dataclasses.replace(verdict, rolled_back_to=restored)
                self._cool_down(verdict.step)
        self.parts.reporter.emit(verdict)
        return verdict

    def report(self, verdict: SpikeGuarded) -> None:
        """A spike let through (the guard off, or a new level): said; with the guard off, the run's first, then at most
        once per ``OFF_NOTICE_EVERY_S`` with the count of those held back since (``say_held_notice`` says the last)."""
        if verdict.action == LET_THROUGH:
            held_back = self._off_notices.admit()
            if held_back is None:
                self._held_notice = verdict
                return
            self._held_notice = None
            verdict = dataclasses.replace(verdict, held_back=held_back)
        self.parts.reporter.emit(verdict)

    def say_held_notice(self) -> None:
        """Where the run's training ends (finished, stopped, failed): the latest notice of a guard that is off that was
        held back, with the count of the others held back since the last one said, so that the journal's counts add
        up to every spike let through."""
        held, self._held_notice = self._held_notice, None
        if held is not None:
            self.parts.reporter.emit(dataclasses.replace(held, held_back=self._off_notices.flush() - 1))

    def before_update(self) -> None:
        """Before the optimizer step: the device waits for the copy taken at the last boundary, if on its way."""
        if self._copies:
            self._copies[-1].before_update()

    def after_step(self, step: int) -> None:
        """At the boundary after ``step``: a host copy where rollback is due one; the cool-down's end."""
        if self.parts.options.spike_guard != "rollback":
            self._copies, self._spare = [], None  # their host memory back
        elif not self._copies or step % ROLLBACK_EVERY == 0:
            self._capture(step)
        cooldown = self._cooldown
        if cooldown is not None and step >= cooldown.until:
            self._cooldown = None
            if self.parts.options.lr_scale == cooldown.scale:  # not changed since by a person
                self._set_lr_scale(step + 1, cooldown.restore, f"the cool-down after the spike guard's rollbacks ended "
                                                               f"at step {step}")

    @property
    def copies_bytes(self) -> int:
        """The host memory its copies hold."""
        return sum(copy.bytes for copy in self._copies)

    # ------------------------------------------------------------------ rollback
    def _state(self) -> dict:
        return {"model": self.parts.model.state_dict(), "optimization": self.parts.optimization.state_dict()}

    def _capture(self, step: int) -> None:
        if len(self._copies) == 2:
            copy = self._copies.pop(0)
        else:
            copy, self._spare = self._spare or HostCopy(self.parts.device), None
        buffers = {buffer.data_ptr() for buffer in self.parts.model.model.buffers()}
        copy.capture(self._state(), step, on_step_stream=buffers)
        self._copies.append(copy)

    def _roll_back(self, step: int) -> int | None:
        """The older copy's state loaded; it is then taken again as this step's end (a good state, from here on the
        older one). The step the state is of, or None without a copy."""
        if not self._copies:
            return None
        older = self._copies[0]
        state = older.state()
        self.parts.model.load_state_dict(state["model"])
        self.parts.optimization.load_state_dict(state["optimization"])
        restored = older.step
        self._spare = self._copies[1] if len(self._copies) > 1 else None
        self._copies = []
        self._capture(step)
        return restored

    def _cool_down(self, step: int) -> None:
        """A second rollback within a window: the LR scale halved until a window of steps from now."""
        last, self._last_rollback = self._last_rollback, step
        window = self.parts.config.spike_window
        if last is None or step - last > window:
            return
        previous = self.parts.options.lr_scale
        restore = self._cooldown.restore if self._cooldown is not None else previous
        try:
            self._set_lr_scale(step + 1, previous / 2, f"a second rollback within {window} steps (after step {last}'s): "
                                                       f"the LR at half until step {step + window}")
        except OptionChangeError:  # the scale's floor: the cool-down goes on at the scale there is
            return
        self._cooldown = _Cooldown(until=step + window, scale=self.parts.options.lr_scale, restore=restore)

    def _set_lr_scale(self, step: int, scale: float, why: str) -> None:
        parts = self.parts
        scale = LR_SCALE.parse(scale)
        previous = parts.options.lr_scale
        enact(parts, LR_SCALE, scale)
        parts.options = parts.options.with_value(LR_SCALE.name, scale)
        parts.reporter.emit(p.OptionApplied(step=step, option=LR_SCALE.name, value=scale, previous=previous,
                                            display=LR_SCALE.format(scale), source="spike guard", detail=why))

    def _event(self, step: int, spike: Spike, action: str, loss: float, grad_norm: float | None) -> SpikeGuarded:
        samples = self.parts.data.samples_of(self.parts.options.accum)
        return SpikeGuarded(step=step, measure=spike.measure, value=spike.value, median=spike.median, z=spike.z,
                            threshold=self.detector.threshold, window=spike.window, action=action, loss=loss,
                            grad_norm=grad_norm, note=self._suspected(samples),
                            samples=samples[:MAX_SPIKE_SAMPLES] if samples is not None else None)

    def _suspected(self, samples: list[int] | None) -> str:
        """Where the same few samples were in the batches of ``SUSPECT_AFTER`` spikes or more (those since the
        samples they shared last ran out): which, as a note. A bad record comes back every epoch; three random
        batches of 32 from 4,096 samples share one by chance about once in 500."""
        if samples is None:
            return ""
        shared = self._suspects & set(samples) if self._suspects else set()
        self._suspects, self._suspect_spikes = (shared, self._suspect_spikes + 1) if shared else (set(samples), 1)
        if self._suspect_spikes < SUSPECT_AFTER or len(shared) > MAX_SUSPECTS:
            return ""
        named = ", ".join(str(index) for index in sorted(shared))
        return (f"sample{'s' if len(shared) > 1 else ''} {named} {'were' if len(shared) > 1 else 'was'} in the batch of "
                f"each of the last {self._suspect_spikes} spikes: a bad record?")
