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

``RunState`` is one class written in five modules, one job each. This one holds its fields, the reducer
(``_dispatch``: a ``match`` on each message's class) and the handlers of the run's course (welcome, state,
acknowledgements, checkpoints, failures) and of the app's requests. The others fold one kind of news:
``state_metrics`` the curves and gradient norms, ``state_measurements`` telemetry, memory, profiles, impact
and trials, ``state_ranks`` the ranks and a relaunch; ``state_figures`` reads the fields to work out what
the app shows but is not told (an ETA, why a value would be refused). Numbers from fields the protocol
leaves open go through ``unchecked_numbers``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torchlab.core.errors import printable
from torchlab.core.wire import protocol
from torchlab.core.wire.events import LET_THROUGH, SpikeGuarded, describe
from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.wire.options import AMP, OPTION_NAMES, OPTIONS_BY_NAME, PARALLEL, RELAUNCHED_BY, SPIKE_GUARD, format_option_value
from torchlab.core.wire.payloads import ImpactSegment, MemoryBreakdown, TelemetrySample
from torchlab.core.wire.run_status import RunStatus
from torchlab.tui.formatting import short_workload
from torchlab.tui.state_figures import ENDED, RunFigures
from torchlab.tui.state_measurements import Measurements
from torchlab.tui.health_history import HealthHistory
from torchlab.tui.state_metrics import MetricsFolding
from torchlab.tui.state_ranks import RanksAndRelaunch
from torchlab.tui.stragglers import ComparedRank
from torchlab.tui.thinning import Series
from torchlab.tui.unchecked_numbers import int_or_none

if TYPE_CHECKING:
    from torchlab.tui.profiles import ProfileSnapshot

#: The states the trainer reports, plus "connecting" before its Welcome arrives, "relaunching" while the trainer
#: restarts its ranks for a new world size (the app's own: the trainer says "running" throughout) and "detached".
RUN_STATES = (RunStatus.CONNECTING, RunStatus.STARTING, RunStatus.RUNNING, RunStatus.PAUSED, RunStatus.RELAUNCHING,
              RunStatus.STOPPED, RunStatus.FINISHED, RunStatus.FAILED, RunStatus.DETACHED)

#: Gradient-norm trend length kept per module (the sparkline in the table).
TREND_LENGTH = 16
#: How many recent records the ETA averages step time over.
ETA_WINDOW = 20
#: Telemetry samples kept for the system panel's memory history (about 1 Hz: five minutes).
TELEMETRY_HISTORY = 300



@dataclass(frozen=True)
class LogEntry:
    """One line of the event log. ``notify`` marks the ones worth a toast (acknowledgements, errors)."""

    level: str  # info, applied, refused, checkpoint, warning, error, trainer, profile, impact
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


@dataclass
class ModuleStats:
    """One module's gradient-norm history; ``flag`` is recomputed on every report."""

    name: str
    params: int
    #: the other modules that hold some of its parameters (tied: counted here once)
    tied: tuple[str, ...] = ()
    norm: float | None = None
    trend: deque[float] = field(default_factory=lambda: deque(maxlen=TREND_LENGTH))
    ratio: float | None = None
    #: ‖Δθ‖/‖θ‖ of the last measured step (core/engine/measure/update_probe.py), where it was measured
    update_ratio: float | None = None
    flag: str = ""  # "", "vanishing", "exploding", "non-finite", "frozen", "thrashed"


class RunState(MetricsFolding, Measurements, RanksAndRelaunch, RunFigures):
    """Everything the app draws, updated one protocol event at a time by ``apply``."""

    def __init__(self, workload: str | None = None) -> None:
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
        self.modules: list[ModuleStats] = []
        #: the recent measured steps' figures per module, for the heatmap
        self.health = HealthHistory()
        self.grad_step: int | None = None
        self.grad_total: float | None = None
        self.loss = Series()
        self.val_loss = Series()
        self.lr = Series()
        self.samples_per_s = Series()
        self.step_time = Series()
        #: the steps whose loss or grad norm spiked (the spike guard's events, the rows' ``spike``), in order: marks
        #: on the loss chart, whose line leaves out the steps the guard held back
        self.spikes: list[int] = []
        #: each parameter group's LR by the group's name, where the workload's optimizer has several
        self.group_lrs: dict[str, Series] = {}
        #: the workload's own metrics (loss_fn's mapping) by name: (training, validation)
        self.workload_metrics: dict[str, tuple[Series, Series]] = {}
        #: moves when a group or a metric appears (the charts then show it)
        self.named_series_version = 0
        #: the newest metrics row (the last of its batch), None before the first
        self.last_row: MetricsRow | None = None
        self.elapsed_s: float | None = None
        #: when ``elapsed_s`` arrived, by ``clock``: the header's clock runs on from it between reports
        self.elapsed_at = 0.0
        #: seconds that only go forward (tests stop or move it)
        self.clock: Callable[[], float] = time.monotonic
        self.recent_step_times: deque[float] = deque(maxlen=ETA_WINDOW)
        #: the newest system sample (None until the first arrives)
        self.telemetry: TelemetrySample | None = None
        #: the last TELEMETRY_HISTORY samples, oldest first (the system panel's memory history)
        self.telemetry_history: deque[TelemetrySample] = deque(maxlen=TELEMETRY_HISTORY)
        #: the newest memory breakdown by kind (None until a step measured it)
        self.memory: MemoryBreakdown | None = None
        #: profiler snapshots of this run, in order of arrival
        self.profiles: list[ProfileSnapshot] = []
        #: a snapshot was asked for and has not arrived (nor been refused) yet
        self.profile_pending = False
        #: the impact table: one row per option segment (``ImpactTracker.table()``), newest message wins
        self.impact: list[ImpactSegment] = []
        #: (first step, change) of each segment whose verdict went to the log -> whether it was a clear one
        self._impact_logged: dict[tuple[int, str], bool] = {}
        #: the controlled trials of this run, in order (each one's two arms)
        self.trials: list[protocol.TrialResult] = []
        #: the running trial's progress; None when none runs (see ``running_trial``)
        self.trial_progress: protocol.TrialProgress | None = None
        self.failure: Failure | None = None
        #: this app is a read-only view (``attach --view``): the header says so
        self.read_only = False
        #: the trainer this app talks to has welcomed it: False while the link connects and while a restarted trainer
        #: starts, when requests wait (the link and the trainer keep them, in order) for its first step boundary
        self.welcomed = False
        #: the app attached to a trainer that trains already (set by the app from its link): a request made before
        #: its welcome takes effect at its next step boundary, not at a first one
        self.attaching = False
        #: option -> value the app asked for and the trainer has not answered yet (the newest request of
        #: those still unanswered: the trainer answers an option's commands in the order they were sent)
        self.pending: dict[str, Any] = {}
        #: option -> the app's requests not answered yet, oldest first
        self._unanswered: dict[str, deque[Any]] = {}
        #: (option, formatted value) pairs the trainer refused on this run, e.g. ("amp", "fp16") on CPU
        self.refused: set[tuple[str, str]] = set()
        self._new_log: list[LogEntry] = []
        #: between a Welcome and its Replayed: the run's past is being folded (logged, never toasted)
        self._replaying = False
        #: toasts the past would have raised (one says instead where they are)
        self._past_toasts = 0
        #: the "connected" line, logged after the past so that the log ends with the newest events
        self._connected: LogEntry | None = None
        #: option -> step its last acknowledged change took effect at
        self._applied_at: dict[str, int] = {}
        #: the step of the newest checkpoint the trainer reported (what a restart resumes from), if any
        self.checkpoint_step: int | None = None
        # Version counters: the app redraws a part only when its counter moved.
        self.header_version = 0
        self.metrics_version = 0
        self.modules_version = 0  # the module list itself changed (new Welcome)
        self.grads_version = 0
        self.options_version = 0
        self.failure_version = 0
        self.telemetry_version = 0
        self.profiles_version = 0
        self.impact_version = 0
        self.memory_version = 0
        #: per-rank figures of the newest ``Ranks`` message, compared, in rank order (empty at world size 1)
        self.ranks: list[ComparedRank] = []
        #: the step the rank figures were gathered at
        self.ranks_step: int | None = None
        #: rank -> host, from the trainer's welcome (shown when the ranks span several hosts)
        self.rank_hosts: dict[int, str] = {}
        #: the world size a relaunch is heading to, while ``state`` is "relaunching" (None: not known)
        self.relaunch_to: int | None = None
        #: what a relaunch that keeps the world size is for (" with parallel=fsdp"), while ``state`` is "relaunching"
        self.relaunch_with = ""
        self.ranks_version = 0
        self.detached = False
        #: the run was paused when this app detached: it waits, paused, for an app to attach and resume it
        self.detached_paused = False
        #: set by the app when it asks to detach: only then does a detach acknowledgement mean "leave"
        self.detach_requested = False
        #: the run directory, when the run has steps before this app connected that its reports may not bring
        #: (a resumed run's earlier process): the app reads them from its journals (``take_history``)
        self.history_wanted: str | None = None
        #: the step the run stood at when this app connected: the journals' steps after it the trainer reports
        self._history_until = 0
        self._flags_stale = False

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
            self.log("warning", f"could not read a {event.type!r} message from the trainer: {error}")

    def _dispatch(self, event: protocol.Message) -> None:
        """The handler of each message the app takes, the most frequent first."""
        match event:
            case protocol.Metrics():
                self._on_metrics(event)
            case protocol.GradNorms():
                self._on_grad_norms(event)
            case protocol.Telemetry():
                self._on_telemetry(event)
            case protocol.Memory():
                self._on_memory(event)
            case protocol.Ranks():
                self._on_ranks(event)
            case protocol.Impact():
                self._on_impact(event)
            case protocol.TrialProgress():
                self._on_trial_progress(event)
            case protocol.State():
                self._on_state(event)
            case protocol.Welcome():
                self._on_welcome(event)
            case protocol.Replayed():
                self._on_replayed(event)
            case protocol.TrialResult():
                self._on_trial_result(event)
            case protocol.OptionApplied():
                self._on_option_applied(event)
            case protocol.OptionRefused():
                self._on_option_refused(event)
            case protocol.Detached():
                self._on_detached(event)
            case protocol.CheckpointSaved():
                self._on_checkpoint(event)
            case protocol.Log():
                self._on_log(event)
            case protocol.Error():
                self._on_error(event)
            case protocol.NonFinite():
                self._on_nonfinite(event)
            case protocol.Refused():
                self._on_refused(event)
            case protocol.ProfileReady():
                self._on_profile_ready(event)
            case SpikeGuarded():
                self.mark_spikes([event.step])
                offered = event.action == LET_THROUGH  # the guard is off: its key, where it will be seen
                self.log("warning", describe(event).text, event.step, notify=offered,
                         toast=f"spike at step {event.step}: {SPIKE_GUARD.key} turns on the spike guard" if offered else None)
            case _ if (sentence := describe(event)) is not None:  # the trainer's news in words (a compile, a trial)
                self.log("warning" if sentence.warning else "info", sentence.text, event.step)
            case _:
                self.log("warning", f"ignored an unexpected message from the trainer: {type(event).__name__}")

    def skips(self, option: str, value: Any) -> bool:
        """A key that cycles ``option`` passes ``value`` by: the trainer refused it on this run, or would
        (``would_refuse``: fp16 on a CPU). The one rule of the main screen's keys and the error screen's."""
        return self.was_refused(option, value) or self.would_refuse(option, value) is not None

    def note_request(self, option: str, value: Any) -> None:
        """The app sent a SetCommand: remember it until the answer comes, and log that it is on its way."""
        self._unanswered.setdefault(option, deque()).append(value)
        self.pending[option] = value
        self.options_version += 1
        if self.queued is not None:
            self.log("info", f"{option} = {format_option_value(option, value)}: {self.queued}")
            return
        when = OPTIONS_BY_NAME[option].takes_effect
        if option == AMP.name and self.world_size > 1 and self.options.get(PARALLEL.name) == "fsdp":
            when = PARALLEL.takes_effect  # FSDP2's mixed precision is fixed while the ranks live
        self.log("info", f"requested {option} = {format_option_value(option, value)} ({when})")

    @property
    def queued(self) -> str | None:
        """How a request made before the trainer's welcome is said ("queued, applied at the first step boundary"),
        None once welcomed: the trainer takes it before its first step, in the order typed."""
        if self.welcomed:
            return None
        return "queued, applied at the next step boundary once attached" if self.attaching else \
            "queued, applied at the first step boundary"

    def _answered(self, option: str, source: str) -> bool:
        """The trainer answered (applied or refused) the oldest unanswered request of the app for ``option``:
        what stays pending is the newest request after it, or nothing. Answers to others (``--at``) are not ours.
        True when it was this app's request."""
        waiting = self._unanswered.get(option)
        if source != "app" or not waiting:
            return False
        waiting.popleft()
        if waiting:
            self.pending[option] = waiting[-1]
        else:
            del self._unanswered[option]
            self.pending.pop(option, None)
        self.options_version += 1
        return True

    def _forget_requests(self) -> None:
        """No trainer will answer what was asked of the one before (the run ended, or a new one welcomed us)."""
        if self.pending or self._unanswered:
            self.pending.clear()
            self._unanswered.clear()
            self.options_version += 1

    def note_profile_request(self) -> None:
        """The app asked for a profiler snapshot: the list says one is on its way until it arrives."""
        self.profile_pending = True
        self.profiles_version += 1

    def mark_restarting(self) -> None:
        """A new trainer is on its way after a failure: clear the failure, wait for its welcome."""
        self.failure = None
        self._set_state(RunStatus.STARTING, "restarting from the last checkpoint")
        self.welcomed, self.attaching = False, False  # requests now wait for the new trainer, which starts

    def log(self, level: str, text: str, step: int | None = None, *, notify: bool = False, toast: str | None = None,
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

    # ------------------------------------------------------------------ handlers (the run's course and the app's requests)

    def _on_welcome(self, event: protocol.Welcome) -> None:
        run = event.run
        self.workload = run.workload or self.workload
        self.device = run.device
        self.batch_size = run.batch_size
        self.run_dir = run.run_dir
        self.checkpoint_blocks = list(run.checkpoint_blocks)
        self.total_steps = run.steps
        self.started = run.started
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
        # A run resumed from a checkpoint re-trains the steps after it: drop them from the curves.
        if event.step < self.step:
            for series in (self.loss, self.val_loss, self.lr, self.samples_per_s, self.step_time, *self.group_lrs.values(),
                           *(line for pair in self.workload_metrics.values() for line in pair)):
                series.truncate_after(event.step)
            self.spikes[:] = [step for step in self.spikes if step <= event.step]  # in place: the loss chart holds it
            self.metrics_version += 1
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
        self._connected = LogEntry("info", f"connected to the trainer of {workload}{where}: {len(modules)} modules", event.step)
        self._replaying, self._past_toasts = True, 0
        self.header_version += 1

    def _on_replayed(self, event: protocol.Replayed) -> None:
        """The run's past is folded: log that this app connected, and say once where the past is."""
        self._replaying = False
        if self._connected is not None:
            self._new_log.append(self._connected)
            self._connected = None
        if self._past_toasts:
            self.log("info", f"attached at step {self.step}: the run's {event.events} earlier events are above",
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
            self.log("info", "starting the trainer")
            return
        if event.state == RunStatus.RUNNING:
            text = {RunStatus.PAUSED: "resumed", RunStatus.STARTING: "resuming" if event.step > 0 else "training"}.get(
                previous, "training")
        else:
            text = event.state
        detail = f": {event.detail}" if event.detail else ""
        notify = event.state in (RunStatus.PAUSED, RunStatus.FINISHED, RunStatus.STOPPED) or (
            event.state == RunStatus.RUNNING and previous == RunStatus.PAUSED)
        self.log("info", f"{text} at step {event.step}{detail}", event.step, notify=notify)

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
        self.log("applied", text, event.step, notify=True, ours=ours)

    def _on_detached(self, event: protocol.Detached) -> None:
        if not self.detach_requested:  # history replayed on attach: an earlier app's detach
            self.log("info", f"an earlier app detached at step {event.step}", event.step)
            return
        self.detached = True
        self.detached_paused = self.state == RunStatus.PAUSED
        self.log("applied", f"detached at step {event.step}: {self.after_detach}", event.step, notify=True)

    def _on_option_refused(self, event: protocol.OptionRefused) -> None:
        ours = self._answered(event.option, event.source)
        shown = format_option_value(event.option, event.value)
        self.refused.add((event.option, shown))
        if event.option == "profile":
            self.profile_pending = False
            self.profiles_version += 1
        value = f" = {shown}" if event.value is not None or event.option in OPTION_NAMES else ""
        self.log("refused", f"{event.option}{value} refused: {event.reason}", event.step, notify=True, ours=ours)

    def _on_checkpoint(self, event: protocol.CheckpointSaved) -> None:
        self.checkpoint_step = event.step
        # The step is the line's own (its first column): the rest fits 80 columns.
        relaunch = event.reason in RELAUNCHED_BY
        why = f" ({event.reason.replace('_', '-')} change)" if relaunch else (f" ({event.reason})" if event.reason else "")
        self.log("checkpoint", f"checkpoint saved{why}: {self.within_run(event.path)}", event.step,
                 notify=event.reason == "requested")
        if relaunch:
            self._begin_relaunch(event.step, event.reason)

    def _on_log(self, event: protocol.Log) -> None:
        level = event.level if event.level in ("warning", "error") else "info"
        step = int_or_none(event.step)
        self.log(level, event.text, step, notify=level == "error")

    def _on_error(self, event: protocol.Error) -> None:
        self.failure = Failure(RunStatus.FAILED, event.message, event.traceback, event.step, event.checkpoint)
        self.failure_version += 1
        self._set_state(RunStatus.FAILED, event.message)
        self.log("error", f"the run failed at step {event.step}: {event.message}", event.step, notify=True)

    def _on_nonfinite(self, event: protocol.NonFinite) -> None:
        where = f" in {event.module}" if event.module else ""
        report = f"The {event.phase}{where} became non-finite at step {event.step}.\n\n{event.detail}".rstrip()
        message = event.message or f"non-finite {event.phase}{where} at step {event.step}"
        self.failure = Failure(RunStatus.NONFINITE, message, report, event.step)
        self.failure_version += 1
        self._set_state(RunStatus.FAILED, message)
        self.log("error", message, event.step, notify=True)

    def _on_refused(self, event: protocol.Refused) -> None:
        self.log("refused", f"the trainer refused a message: {event.reason}", notify=True)

    def _set_state(self, state: str, detail: str) -> None:
        if state not in RUN_STATES:
            self.log("warning", f"the trainer reported an unknown state {state!r}")
        if state in ENDED:  # the requests it had not answered never will be
            self._forget_requests()
        self.state = state
        self.state_detail = detail
        if state != RunStatus.RELAUNCHING:
            self.relaunch_to, self.relaunch_with = None, ""
        self.header_version += 1

    def _set_options(self, options: Any) -> None:
        if not isinstance(options, dict):
            self.log("warning", f"ignored options that are not an object: {options!r}")
            return
        self.options = dict(options)
        self.options_version += 1
