"""What the app's trainer process (core/launch/worker.py) tells the app about its run: the trainer's observer that
puts the trainer's news in the Outbox, which the control server sends to the app.

It owns how the trainer's events become the app's messages: the run's changes of state become the State the app's
header shows (a compile's wait included), the memory, gradient norms and ranks a metrics row carries go as the
latest of their kind, the impact table at most once per ``IMPACT_INTERVAL_S`` (or when a segment starts), and the
other events as they are (the app says them in words with ``events.describe``, as headless does). The worker builds
its Welcome from the RunStarted this observer passes on.
"""

from __future__ import annotations

import time

from torchlab.core.analysis.impact import ImpactTracker
from torchlab.core.wire.compile_report import CompileReport
from torchlab.core.wire.hang import Hang
from torchlab.core.wire.straggler import Straggler
from torchlab.core.wire import events
from torchlab.core.wire import protocol as p
from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.wire.observer import TrainerObserver
from torchlab.core.options import STEPS
from torchlab.core.wire.outbox import Outbox
from torchlab.core.wire.payloads import TelemetrySample
from torchlab.core.wire.run_status import RunStatus

IMPACT_INTERVAL_S = 1.0

class OutboxReporter(TrainerObserver):
    """Trainer observer that puts the trainer's events in the Outbox: the run's changes of state as the State the
    app shows, the others as they are (the app says them in words with ``events.describe``, as headless does).

    Given the run's ImpactTracker (an observer placed before this one), it also sends the impact
    table: when a segment starts and otherwise at most once per ``IMPACT_INTERVAL_S``.
    """

    def __init__(self, outbox: Outbox, impact: ImpactTracker | None = None, on_run_started=None, on_leaving=None) -> None:
        self.outbox = outbox
        self.impact = impact
        self.on_run_started = on_run_started  # called with each RunStarted (the Welcome is built from it)
        self.on_leaving = on_leaving  # called as the process leaves without its run returning: the app gets the rest
        self.state = RunStatus.STARTING
        self.step = 0
        self.total_steps: int | None = None  # as the trainer says it (RunStarted, then a live steps change)
        self.compiling = False  # between a CompileStarted and the answer to the change that asked for it
        self._impact_sent_at = 0.0
        self._impact_segments = 0

    def on_telemetry(self, sample: TelemetrySample) -> None:
        self.outbox.add_latest(p.Telemetry(sample=sample))

    def on_metrics(self, row: MetricsRow) -> None:
        self.step = row.step
        self._send_impact()
        self.outbox.add_metrics(row)  # the Metrics message leaves out what is sent apart here (p.Metrics.SENT_APART)
        if row.memory is not None:  # on the steps that measured it
            self.outbox.add_latest(p.Memory(breakdown=row.memory))
        if row.grad_norms is not None:
            self.outbox.add_latest(p.GradNorms.from_row(row))
        if row.ranks is not None:  # from the ranks' collectives
            self.outbox.add_latest(p.Ranks(step=row.step, ranks=row.ranks))

    def on_event(self, event: p.Message) -> None:
        match event:
            case events.RunStarted():
                self.total_steps = event.steps
                if self.on_run_started is not None:
                    self.on_run_started(event)
                self.set_state(RunStatus.RUNNING, event.step)
            case events.Paused():
                self.set_state(RunStatus.PAUSED, event.step)
            case events.Resumed():
                self.set_state(RunStatus.RUNNING, event.step)
            case events.RunEnded():
                self._send_impact(force=True)
                self.set_state(event.status, event.step)
            case p.NonFinite() | p.Error():
                self._send_impact(force=True)  # the failed process's last segment, as a run that ended sends it
                self.outbox.add_event(event)
                self.set_state(RunStatus.FAILED, event.step, event.message)
            case p.OptionApplied() | p.OptionRefused() | p.CheckpointSaved() | p.ProfileReady() | p.TrialResult():
                if isinstance(event, p.OptionApplied) and event.option == STEPS.name:
                    self.total_steps = event.value
                self.outbox.add_event(event)
                if self.compiling and isinstance(event, (p.OptionApplied, p.OptionRefused)):  # the change compiled for
                    self.compiling = False
                    self.set_state(self.state, self.step)
            case events.CompileStarted():
                self.outbox.add_event(event)
                self.compiling = True  # the app's header says so until the change's answer: no step comes meanwhile
                self.set_state(self.state, self.step, events.COMPILING)
            case p.TrialProgress():
                self.outbox.add_latest(event)
            case events.Relaunching():
                self.set_state(RunStatus.RELAUNCHING, event.step, event.change)
            case (events.TrialStarted() | events.StepSkipped() | events.OomRescued() | events.SpikeGuarded() | events.ProfileStarted() | events.ResumedFromCheckpoint()
                  | events.ResumeChangedSettings() | events.StopRequested() | events.MemoryPredicted() | events.PredictionChecked()
                  | events.LongestBatch() | Straggler() | Hang() | p.Log()):
                self.outbox.add_event(event)  # the app says it in words: events.describe
            case events.FlopsCounted() | CompileReport():
                self.outbox.add_event(event)  # the app's views show them (where the time goes; the log says compile's)

    def leaving(self, status: str, step: int, message: str) -> None:
        if self.on_leaving is not None:  # the error, said before, set the state the app shows
            self.on_leaving()

    def _send_impact(self, force: bool = False) -> None:
        if self.impact is None:
            return
        now = time.monotonic()
        segments = len(self.impact.segments)
        if force or segments != self._impact_segments or now - self._impact_sent_at >= IMPACT_INTERVAL_S:
            self._impact_sent_at, self._impact_segments = now, segments
            self.outbox.add_latest(p.Impact(segments=self.impact.table()))

    def set_state(self, state: str, step: int, detail: str = "") -> None:
        self.state, self.step = state, step
        self.outbox.add_event(p.State(state=state, step=step, detail=detail))
