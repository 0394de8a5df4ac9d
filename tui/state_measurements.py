"""What the run measured besides its curves: system samples, the memory breakdown, profiler snapshots, the impact
table and the controlled trials, and the event-log lines they are worth.

A part of ``RunState`` (state.py), which dispatches each message here; this part declares the fields it fills
(``_init_measurements``).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from torchlab.core.analysis.trial_words import describe_trial, trial_label
from torchlab.core.wire import protocol
from torchlab.core.wire.communication import communication_sentence
from torchlab.core.wire.payloads import ImpactSegment, MemoryBreakdown, TelemetrySample
from torchlab.tui.log_levels import EntryLevel

if TYPE_CHECKING:
    from torchlab.tui.profiles import ProfileSnapshot

#: A segment's verdict goes to the event log once it has this many steps (its medians have settled).
IMPACT_SETTLE_STEPS = 20
#: Telemetry samples kept for the system panel's memory history (about 1 Hz: five minutes).
TELEMETRY_HISTORY = 300


class Measurements:
    """How ``RunState`` takes telemetry, memory, profiles, impact segments and trials."""

    def _init_measurements(self) -> None:
        """The fields of this part: nothing is measured before the trainer's first sample, snapshot or segment."""
        #: the newest system sample (None until the first arrives)
        self.telemetry: TelemetrySample | None = None
        #: the last TELEMETRY_HISTORY samples, oldest first (the system panel's memory history)
        self.telemetry_history: deque[TelemetrySample] = deque(maxlen=TELEMETRY_HISTORY)
        self.telemetry_version = 0
        #: the newest memory breakdown by kind (None until a step measured it)
        self.memory: MemoryBreakdown | None = None
        self.memory_version = 0
        #: profiler snapshots of this run, in order of arrival
        self.profiles: list[ProfileSnapshot] = []
        #: a snapshot was asked for and has not arrived (nor been refused) yet
        self.profile_pending = False
        self.profiles_version = 0
        #: the impact table: one row per option segment (``ImpactTracker.table()``), newest message wins
        self.impact: list[ImpactSegment] = []
        #: (first step, change) of each segment whose verdict went to the log -> whether it was a clear one
        self._impact_logged: dict[tuple[int, str], bool] = {}
        #: the controlled trials of this run, in order (each one's two arms)
        self.trials: list[protocol.TrialResult] = []
        #: the running trial's progress; None when none runs (see ``running_trial``)
        self.trial_progress: protocol.TrialProgress | None = None
        self.impact_version = 0

    def _on_telemetry(self, event: protocol.Telemetry) -> None:
        self.telemetry = event.sample
        self.telemetry_history.append(event.sample)
        self.telemetry_version += 1
        self.header_version += 1

    def _on_trial_progress(self, event: protocol.TrialProgress) -> None:
        last = self.trials[-1] if self.trials else None
        if last is not None and last.step == event.step and trial_label(last) == event.label:
            return  # the trial's result is in: this progress was sent before it and came after it
        self.trial_progress = event
        self.header_version += 1

    def _on_trial_result(self, event: protocol.TrialResult) -> None:
        self.trial_progress = None
        self.header_version += 1
        self.trials.append(event)
        self.impact_version += 1  # the impact view lists them
        first, *rest = describe_trial(event)
        level = EntryLevel.WARNING if event.error is not None or rest else EntryLevel.IMPACT
        self.log(level, first, event.step, notify=True, toast=first)
        for line in rest:
            self.log(EntryLevel.WARNING, line.strip(), event.step)

    def _on_memory(self, event: protocol.Memory) -> None:
        self.memory = event.breakdown
        self.memory_version += 1

    def _on_profile_ready(self, event: protocol.ProfileReady) -> None:
        from torchlab.tui.profiles import ProfileSnapshot  # with the first snapshot, not at start-up

        rows = [row for row in event.rows if isinstance(row, dict)]
        rows_by_shape = [row for row in event.rows_by_shape if isinstance(row, dict)]
        snapshot = ProfileSnapshot(
            number=len(self.profiles) + 1, first_step=event.first_step, last_step=event.last_step, dir=event.dir,
            rows=rows, rows_by_shape=rows_by_shape, sort=event.sort, build_s=float(event.build_s), error=event.error,
            communication=communication_sentence(event.communication),
        )
        self.profiles.append(snapshot)
        self.profile_pending = False
        self.profiles_version += 1
        if event.error:
            self.log(EntryLevel.WARNING, f"profile {snapshot.label} failed: {event.error} (P lists the snapshots)", event.last_step,
                     notify=True, toast=f"profile {snapshot.label} failed (P lists the snapshots)")
            return
        self.log(
            EntryLevel.PROFILE,
            f"profile {snapshot.label} ready: P opens the table · {self.within_run(event.dir)}/",
            event.last_step,
            notify=True,
            toast=f"profile {snapshot.label} ready: P opens the table",
        )

    def _on_impact(self, event: protocol.Impact) -> None:
        self.impact = list(event.segments)
        self.impact_version += 1
        # A segment's verdict, once its medians have settled, goes to the event log: the answer to "what
        # did that change do" lands where the change itself was acknowledged. Once; and once more if it
        # said "no clear difference" at first and the step times became clear later.
        for segment in self.impact[1:]:
            first, last = segment.first_step, segment.last_step
            key, clear = (first, segment.change), segment.speedup is not None
            if self._impact_logged.get(key) is True or (key in self._impact_logged and not clear):
                continue
            if last - first + 1 >= IMPACT_SETTLE_STEPS and (clear or segment.memory_change is not None):
                self._impact_logged[key] = clear
                self.log(EntryLevel.IMPACT, f"{segment.verdict} (steps {first}–{last}; i shows the impact table)", last,
                         notify=True, toast=segment.verdict)
