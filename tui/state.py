"""What the app knows about the run: a plain model fed by protocol events, with no Textual in it.

The app's timer drains the link, hands every event to ``RunState.apply`` and then redraws whatever
changed (each part has a version counter that ``apply`` bumps). Keeping this separate from the widgets
makes the rules testable without a terminal: how an acknowledgement is worded, when a gradient is
flagged, what a resumed run does to the curves.

Events come from another process. The protocol validates every field of every message, the payloads
nested in them included (the run, its modules, system samples, rank figures, impact segments), so those
are read as they are. What it leaves open is read defensively: the metrics columns, the gradient norms'
length against the module list, the options, a state name; a surprising value there becomes a warning in
the event log, never an exception that takes the app down.

``RunState`` is one class written in seven modules, one job each, and each part declares the fields it owns in
an ``_init_<part>`` method that ``RunState.__init__`` calls. This one holds the reducer (``_dispatch``: a
``match`` on each message's class), the event log and the handlers of the run's course (welcome, state,
acknowledgements, checkpoints, failures). The others fold one kind of news: ``state_metrics`` the curves and
gradient norms, ``state_measurements`` telemetry, memory, profiles, impact and trials, ``state_ranks`` the
ranks and a relaunch, ``state_requests`` the app's requests until the trainer answers them, ``state_forecast`` the memory predicted for
the settings in force and the changes worth weighing; ``state_figures``
reads the fields to work out what the app shows but is not told (an ETA, why a value would be refused).
Numbers from fields the protocol leaves open go through ``unchecked_numbers``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from torchlab.core.errors import printable
from torchlab.core.wire import protocol
from torchlab.core.wire.compile_report import CompileReport
from torchlab.core.wire.hang import Hang
from torchlab.core.wire.straggler import Straggler
from torchlab.core.wire.events import FlopsCounted, LongestBatch, MemoryPredicted, SpikeGuarded, describe
from torchlab.core.options import OPTION_NAMES, RELAUNCHED_BY, format_option_value
from torchlab.core.wire.protocol import LogLevel
from torchlab.core.wire.run_status import RunStatus
from torchlab.tui.formatting import short_workload
from torchlab.tui.log_levels import EntryLevel
from torchlab.tui.state_figures import ENDED, RunFigures
from torchlab.tui.state_forecast import Forecasts
from torchlab.tui.state_measurements import Measurements
from torchlab.tui.state_metrics import MetricsFolding, ModuleStats
from torchlab.tui.state_ranks import RanksAndRelaunch
from torchlab.tui.state_requests import AppRequests
from torchlab.tui.unchecked_numbers import int_or_none

#: The states the trainer reports, plus "connecting" before its Welcome arrives, "relaunching" while the trainer
#: restarts its ranks for a new world size (the app's own: the trainer says "running" throughout) and "detached".
RUN_STATES = (RunStatus.CONNECTING, RunStatus.STARTING, RunStatus.RUNNING, RunStatus.PAUSED, RunStatus.RELAUNCHING,
              RunStatus.STOPPED, RunStatus.FINISHED, RunStatus.FAILED, RunStatus.DETACHED)


@dataclass(frozen=True)
class LogEntry:
    """One line of the event log. ``notify`` marks the ones worth a toast (acknowledgements, errors)."""

    level: EntryLevel
    text: str
    step: int | None = None
    notify: bool = False
    toast: str | None = None  # a shorter text for the toast, where the log line is long (None: the same)


@dataclass(frozen=True)
class Failure:
    """Why the run stopped: an exception in the workload or a non-finite loss/gradient."""

    kind: RunStatus  # FAILED (an error) or NONFINITE
    message: str
    detail: str  # the traceback, or the non-finite report
    step: int | None
    checkpoint: str | None = None


class RunState(MetricsFolding, Measurements, RanksAndRelaunch, AppRequests, Forecasts, RunFigures):
    """Everything the app draws, updated one protocol event at a time by ``apply``."""

    def __init__(self, workload: str | None = None) -> None:
        self._init_run(workload)
        self._init_event_log()
        self._init_requests()
        self._init_metrics()
        self._init_measurements()
        self._init_ranks()
        self._init_forecasts()

    def _init_run(self, workload: str | None) -> None:
        """The fields of the run's course: what the trainer's welcome describes, where the run stands, how it ended."""
        self.workload = workload or ""
        self.device = ""
        #: the global batch (0 until the trainer's welcome says it)
        self.batch_size = 0
        self.run_dir = ""
        #: the submodules activation checkpointing wraps (the trainer's choice, or the workload's)
        self.checkpoint_blocks: list[str] = []
        self.total_steps: int | None = None
        self.started: float | None = None
        self.state: str = RunStatus.CONNECTING
        self.state_detail = ""
        self.step = 0
        self.options: dict[str, Any] = {}
        #: option -> step its last acknowledged change took effect at
        self._applied_at: dict[str, int] = {}
        #: the step of the newest checkpoint the trainer reported (what a restart resumes from), if any
        self.checkpoint_step: int | None = None
        self.failure: Failure | None = None
        #: this app is a read-only view (``attach --view``): the header says so
        self.read_only = False
        self.detached = False
        #: the run was paused when this app detached: it waits, paused, for an app to attach and resume it
        self.detached_paused = False
        #: set by the app when it asks to detach: only then does a detach acknowledgement mean "leave"
        self.detach_requested = False
        # Version counters: the app redraws a part only when its counter moved (each part declares its own).
        self.header_version = 0
        self.options_version = 0
        self.failure_version = 0

    def _init_event_log(self) -> None:
        """The fields of the event log: the lines not yet taken, and what holds back the toasts of the run's past."""
        self._new_log: list[LogEntry] = []
        #: between a Welcome and its Replayed: the run's past is being folded (logged, never toasted)
        self._replaying = False
        #: toasts the past would have raised (one says instead where they are)
        self._past_toasts = 0
        #: the "connected" line, logged after the past so that the log ends with the newest events
        self._connected: LogEntry | None = None

    # ------------------------------------------------------------------ feeding

    def apply(self, event: protocol.Message) -> None:
        """Fold one event into the state. Never raises on a surprising payload; logs it instead."""
        self.apply_all((event,))

    def apply_all(self, events: Iterable[protocol.Message]) -> None:
        """Fold a poll's events in order, then work out what derives from them once.

        Gradient flags compare every module with the median and with its own recent trend: at 50k
        reports/s hundreds of norm messages arrive between two polls, and flagging after each one
        cost more than everything else the app did with them.
        """
        for event in events:
            self._fold(event)
        if self._flags_stale:
            self._flags_stale = False
            self._flag_modules()

    def _fold(self, event: protocol.Message) -> None:
        try:
            self._dispatch(event)
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as error:
            self.log(EntryLevel.WARNING, f"could not read a {event.type!r} message from the trainer: {error}")

    def _dispatch(self, event: protocol.Message) -> None:
        """The handler of each message the app takes (``_HANDLERS``), else ``_on_other_news``."""
        getattr(self, _HANDLERS.get(type(event), "_on_other_news"))(event)

    def _on_other_news(self, event: protocol.Message) -> None:
        """A message no handler takes: the trainer's news in words (a compile, a trial) where ``describe`` has them,
        else a warning that it was ignored (a newer trainer's message, say), never an exception."""
        sentence = describe(event)
        if sentence is None:
            self.log(EntryLevel.WARNING, f"ignored an unexpected message from the trainer: {type(event).__name__}")
            return
        self.log(EntryLevel.WARNING if sentence.warning else EntryLevel.INFO, sentence.text, event.step)

    def mark_restarting(self) -> None:
        """A new trainer is on its way after a failure: clear the failure, wait for its welcome."""
        self.failure = None
        self._set_state(RunStatus.STARTING, "restarting from the last checkpoint")
        self.welcomed, self.attaching = False, False  # requests now wait for the new trainer, which starts

    def log(self, level: EntryLevel, text: str, step: int | None = None, *, notify: bool = False, toast: str | None = None,
            ours: bool = False) -> None:
        """``ours``: an answer to this app's own request, news even amid the past (typed while the trainer started,
        answered before this app's stream began)."""
        if notify and self._replaying and not ours:  # old news: on an 80x24 screen a toast each covered the whole view
            notify, self._past_toasts = False, self._past_toasts + 1
        # the log's and the notices' one way in: the trainer's words, a workload's output, a path someone chose, with
        # their control characters escaped (Textual drops a bell but writes an ESC through to the terminal)
        toast = None if toast is None else printable(toast, keep_lines=True)
        self._new_log.append(LogEntry(level, printable(text, keep_lines=True), step, notify, toast))

    def take_log(self) -> list[LogEntry]:
        """Log entries added since the last call, oldest first."""
        entries, self._new_log = self._new_log, []
        return entries

    # ------------------------------------------------------------------ handlers (the run's course)

    def _on_welcome(self, event: protocol.Welcome) -> None:
        run = event.run
        self.workload = run.workload or self.workload
        self.device = run.device
        self.batch_size = run.batch_size
        self.run_dir = run.run_dir
        self.checkpoint_blocks = list(run.checkpoint_blocks)
        self.total_steps = run.steps
        self.started = run.started
        self.forecast_requested = False  # a new trainer (a restart) has its own forecaster; one asked again starts nothing
        modules = [ModuleStats(module.name, module.params, tuple(module.tied)) for module in event.modules]
        if [(m.name, m.tied) for m in modules] != [(m.name, m.tied) for m in self.modules]:
            self.modules = modules
            self.modules_version += 1
            self.health.clear()  # its columns are aligned with the modules
        self._set_options(event.options)
        self._start_ranks(run.ranks)
        if event.step > 0 and not len(self.loss) and run.run_dir:
            self.history_wanted, self._history_until = run.run_dir, event.step
        # Changes after the step it starts from are not in force in it (a run resumed from a checkpoint).
        self._applied_at = {name: step for name, step in self._applied_at.items() if step <= event.step}
        if event.step < self.step:
            self._forget_steps_after(event.step)
        self.step = event.step
        self._set_state(event.state, "")
        self.failure = None
        if self.welcomed:  # a new trainer: the old one will not answer (what was asked before this welcome is this one's)
            self._forget_requests()
        self.welcomed = True
        where = f" on {self.device}" if self.device else ""
        workload = short_workload(self.workload) or "the run"
        # The step is the line's own (its first column): "connected" fits 80 columns with a workload's file name.
        # It is logged once the run's past (which the trainer sends next) is in the log above it.
        self._connected = LogEntry(EntryLevel.INFO, f"connected to the trainer of {workload}{where}: {len(modules)} modules", event.step)
        self._replaying, self._past_toasts = True, 0
        self.header_version += 1

    def _on_replayed(self, event: protocol.Replayed) -> None:
        """The run's past is folded: log that this app connected, and say once where the past is."""
        self._replaying = False
        if self._connected is not None:
            self._new_log.append(self._connected)
            self._connected = None
        if self._past_toasts:
            self.log(EntryLevel.INFO, f"attached at step {self.step}: the run's {event.events} earlier events are above",
                     self.step, notify=True)

    def _on_state(self, event: protocol.State) -> None:
        previous = self.state
        self.step = max(self.step, event.step)
        self._set_state(event.state, event.detail)
        if event.state == RunStatus.DETACHED:
            self.detached = True
        if event.state == previous or event.state == RunStatus.FAILED:  # a failure is told by its Error event
            return
        if previous == RunStatus.RELAUNCHING and event.state == RunStatus.RUNNING:
            return  # the new ranks train: the world_size acknowledgement that follows says so, with its step
        if event.state == RunStatus.STARTING:  # the trainer's process says so before it knows the step it starts from
            self.log(EntryLevel.INFO, "starting the trainer")
            return
        if event.state == RunStatus.RUNNING:
            text = {RunStatus.PAUSED: "resumed", RunStatus.STARTING: "resuming" if event.step > 0 else "training"}.get(
                previous, "training")
        else:
            text = event.state
        detail = f": {event.detail}" if event.detail else ""
        notify = event.state in (RunStatus.PAUSED, RunStatus.FINISHED, RunStatus.STOPPED) or (
            event.state == RunStatus.RUNNING and previous == RunStatus.PAUSED)
        self.log(EntryLevel.INFO, f"{text} at step {event.step}{detail}", event.step, notify=notify)

    def _on_option_applied(self, event: protocol.OptionApplied) -> None:
        ours = self._answered(event.option, event.source)
        shown = format_option_value(event.option, event.value)
        if event.option in OPTION_NAMES:
            self.options[event.option] = event.value
            self._applied_at[event.option] = event.step
            self.options_version += 1
            previous = format_option_value(event.option, event.previous)
            text = (f"{event.option} = {shown} at step {event.step}: in force already, nothing changed"
                    if event.value == event.previous else f"{event.option} = {shown} applied at step {event.step} (was {previous})")
            if event.detail:
                text += f": {event.detail}"
            if event.option in RELAUNCHED_BY:
                self._relaunched(event)
            if event.option == "steps":
                self.total_steps = event.value
                self.header_version += 1
        else:
            text = f"{event.option} = {shown} applied at step {event.step}"
        self.log(EntryLevel.APPLIED, text, event.step, notify=True, ours=ours)

    def _on_detached(self, event: protocol.Detached) -> None:
        if not self.detach_requested:  # history replayed on attach: an earlier app's detach
            self.log(EntryLevel.INFO, f"an earlier app detached at step {event.step}", event.step)
            return
        self.detached = True
        self.detached_paused = self.state == RunStatus.PAUSED
        self.log(EntryLevel.APPLIED, f"detached at step {event.step}: {self.after_detach}", event.step, notify=True)

    def _on_option_refused(self, event: protocol.OptionRefused) -> None:
        ours = self._answered(event.option, event.source)
        shown = format_option_value(event.option, event.value)
        self.refused.add((event.option, shown))
        if event.option == "profile":
            self.profile_pending = False
            self.profiles_version += 1
        value = f" = {shown}" if event.value is not None or event.option in OPTION_NAMES else ""
        self.log(EntryLevel.REFUSED, f"{event.option}{value} refused: {event.reason}", event.step, notify=True, ours=ours)

    def _on_checkpoint(self, event: protocol.CheckpointSaved) -> None:
        self.checkpoint_step = event.step
        # The step is the line's own (its first column): the rest fits 80 columns.
        relaunch = event.reason in RELAUNCHED_BY
        why = f" ({event.reason.replace('_', '-')} change)" if relaunch else (f" ({event.reason})" if event.reason else "")
        self.log(EntryLevel.CHECKPOINT, f"checkpoint saved{why}: {self.within_run(event.path)}", event.step,
                 notify=event.reason == "requested")
        if relaunch:
            self._begin_relaunch(event.step, event.reason)

    def _on_log(self, event: protocol.Log) -> None:
        level = {LogLevel.WARNING: EntryLevel.WARNING, LogLevel.ERROR: EntryLevel.ERROR}.get(event.level, EntryLevel.INFO)
        step = int_or_none(event.step)
        self.log(level, event.text, step, notify=level == EntryLevel.ERROR)

    def _on_error(self, event: protocol.Error) -> None:
        self.failure = Failure(RunStatus.FAILED, event.message, event.traceback, event.step, event.checkpoint)
        self.failure_version += 1
        self._set_state(RunStatus.FAILED, event.message)
        self.log(EntryLevel.ERROR, f"the run failed at step {event.step}: {event.message}", event.step, notify=True)

    def _on_nonfinite(self, event: protocol.NonFinite) -> None:
        where = f" in {event.module}" if event.module else ""
        report = f"The {event.phase}{where} became non-finite at step {event.step}.\n\n{event.detail}".rstrip()
        message = event.message or f"non-finite {event.phase}{where} at step {event.step}"
        self.failure = Failure(RunStatus.NONFINITE, message, report, event.step)
        self.failure_version += 1
        self._set_state(RunStatus.FAILED, message)
        self.log(EntryLevel.ERROR, message, event.step, notify=True)

    def _on_refused(self, event: protocol.Refused) -> None:
        self.log(EntryLevel.REFUSED, f"the trainer refused a message: {event.reason}", notify=True)

    def _set_state(self, state: str, detail: str) -> None:
        if state not in RUN_STATES:
            self.log(EntryLevel.WARNING, f"the trainer reported an unknown state {state!r}")
        if state in ENDED:  # the requests it had not answered never will be
            self._forget_requests()
        self.state = state
        self.state_detail = detail
        if state in ENDED:
            self.hang_over(self.step)
        if state != RunStatus.RELAUNCHING:
            self.relaunch_to, self.relaunch_with = None, ""
        self.header_version += 1

    def _set_options(self, options: Any) -> None:
        if not isinstance(options, dict):
            self.log(EntryLevel.WARNING, f"ignored options that are not an object: {options!r}")
            return
        self.options = dict(options)
        self.options_version += 1


#: The handler of each message the app takes, by its type (``RunState._dispatch``).
_HANDLERS: dict[type, str] = {
    protocol.Metrics: "_on_metrics",
    protocol.GradNorms: "_on_grad_norms",
    protocol.Telemetry: "_on_telemetry",
    protocol.Memory: "_on_memory",
    protocol.Ranks: "_on_ranks",
    protocol.Impact: "_on_impact",
    protocol.TrialProgress: "_on_trial_progress",
    protocol.State: "_on_state",
    protocol.Welcome: "_on_welcome",
    protocol.Replayed: "_on_replayed",
    protocol.TrialResult: "_on_trial_result",
    protocol.OptionApplied: "_on_option_applied",
    protocol.OptionRefused: "_on_option_refused",
    protocol.Detached: "_on_detached",
    protocol.CheckpointSaved: "_on_checkpoint",
    protocol.Log: "_on_log",
    protocol.Error: "_on_error",
    protocol.NonFinite: "_on_nonfinite",
    protocol.Refused: "_on_refused",
    protocol.ProfileReady: "_on_profile_ready",
    MemoryPredicted: "_on_forecast",
    LongestBatch: "_on_forecast",
    FlopsCounted: "_on_flops_counted",
    CompileReport: "_on_compile_report",
    SpikeGuarded: "_on_spike_guarded",
    Straggler: "_on_straggler",
    Hang: "_on_hang",
}
