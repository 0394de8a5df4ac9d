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
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torchlab.core.wire import protocol
from torchlab.core.wire.events import COMPILING, describe
from torchlab.core.wire.options import OPTION_NAMES, OPTIONS_BY_NAME, format_option_value
from torchlab.core.wire.payloads import ImpactSegment, MemoryBreakdown, RankProcess, TelemetrySample
from torchlab.core.wire.run_status import RunStatus
from torchlab.core.wire.trials import describe_trial, trial_label
from torchlab.tui.formatting import short_workload
from torchlab.tui.gradient_flags import flag_for
from torchlab.tui.stragglers import ComparedRank, flag_stragglers
from torchlab.tui.thinning import Series

if TYPE_CHECKING:
    from torchlab.tui.profiles import ProfileSnapshot
    from torchlab.tui.run_history import RunHistory

#: The states the trainer reports, plus "connecting" before its Welcome arrives, "relaunching" while the trainer
#: restarts its ranks for a new world size (the app's own: the trainer says "running" throughout) and "detached".
RUN_STATES = (RunStatus.CONNECTING, RunStatus.STARTING, RunStatus.RUNNING, RunStatus.PAUSED, RunStatus.RELAUNCHING,
              RunStatus.STOPPED, RunStatus.FINISHED, RunStatus.FAILED, RunStatus.DETACHED)

#: The states in which no trainer is left to answer a key, and how the app says so (the same words for
#: every key: space, an option, a profile, a checkpoint).
ENDED = {
    RunStatus.FINISHED: "the run is finished",
    RunStatus.STOPPED: "the run is stopped",
    RunStatus.FAILED: "the run failed",
    RunStatus.DETACHED: "the app has detached from the run",
}

#: Gradient-norm trend length kept per module (the sparkline in the table).
TREND_LENGTH = 16
#: How many recent records the ETA averages step time over.
ETA_WINDOW = 20
#: Telemetry samples kept for the system panel's memory history (about 1 Hz: five minutes).
TELEMETRY_HISTORY = 300
#: The most LR groups and workload metrics kept as series (each is a chart line); names cut to this many characters.
MAX_NAMED_SERIES = 32
MAX_SERIES_NAME_CHARS = 40
#: A segment's verdict goes to the event log once it has this many steps (its medians have settled).
IMPACT_SETTLE_STEPS = 20



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
    flag: str = ""  # "", "vanishing", "exploding", "non-finite"


class RunState:
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
        self.grad_step: int | None = None
        self.grad_total: float | None = None
        self.loss = Series()
        self.val_loss = Series()
        self.lr = Series()
        self.samples_per_s = Series()
        self.step_time = Series()
        #: each parameter group's LR by the group's name, where the workload's optimizer has several
        self.group_lrs: dict[str, Series] = {}
        #: the workload's own metrics (loss_fn's mapping) by name: (training, validation)
        self.workload_metrics: dict[str, tuple[Series, Series]] = {}
        #: moves when a group or a metric appears (the charts then show it)
        self.named_series_version = 0
        self.last_record: dict[str, Any] = {}
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
            case _ if (sentence := describe(event)) is not None:  # the trainer's news in words (a compile, a trial)
                self.log("warning" if sentence.warning else "info", sentence.text, event.step)
            case _:
                self.log("warning", f"ignored an unexpected message from the trainer: {type(event).__name__}")

    def note_request(self, option: str, value: Any) -> None:
        """The app sent a SetCommand: remember it until the answer comes, and log that it is on its way."""
        self._unanswered.setdefault(option, deque()).append(value)
        self.pending[option] = value
        self.options_version += 1
        when = OPTIONS_BY_NAME[option].takes_effect
        self.log("info", f"requested {option} = {format_option_value(option, value)} ({when})")

    def _answered(self, option: str, source: str) -> None:
        """The trainer answered (applied or refused) the oldest unanswered request of the app for ``option``:
        what stays pending is the newest request after it, or nothing. Answers to others (``--at``) are not ours."""
        waiting = self._unanswered.get(option)
        if source != "app" or not waiting:
            return
        waiting.popleft()
        if waiting:
            self.pending[option] = waiting[-1]
        else:
            del self._unanswered[option]
            self.pending.pop(option, None)
        self.options_version += 1

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

    def log(self, level: str, text: str, step: int | None = None, *, notify: bool = False, toast: str | None = None) -> None:
        if notify and self._replaying:  # old news: on an 80x24 screen a toast each covered the whole view
            notify, self._past_toasts = False, self._past_toasts + 1
        self._new_log.append(LogEntry(level, text, step, notify, toast))

    def take_log(self) -> list[LogEntry]:
        """Log entries added since the last call, oldest first."""
        entries, self._new_log = self._new_log, []
        return entries

    # ------------------------------------------------------------------ derived figures

    def option(self, name: str) -> Any:
        """The value in force, or the one requested and not yet answered (so repeated keys cycle on)."""
        if name in self.pending:
            return self.pending[name]
        return self.options.get(name)

    @property
    def ended(self) -> str | None:
        """How the app says that no trainer is left to answer a key ("the run is finished"); None while one is."""
        return ENDED.get(self.state)

    def changed_since_checkpoint(self) -> dict[str, Any]:
        """The options in force whose last change came after the newest checkpoint: a restart from it would
        go back to their earlier values unless it is told these (the error screen shows these values)."""
        if self.checkpoint_step is None:
            return {}
        return {name: self.options[name] for name, step in self._applied_at.items()
                if step > self.checkpoint_step and name in self.options}

    def was_refused(self, option: str, value: Any) -> bool:
        """The trainer refused ``option = value`` on this run (a key that cycles skips it from then on)."""
        return (option, format_option_value(option, value)) in self.refused

    def elapsed_now(self) -> float | None:
        """The run's training time now: the last report's, and while it runs the time since that report came (a
        trial or a compile sends no report for minutes: the header held 3:22 for three, then jumped)."""
        if self.elapsed_s is None or self.state != RunStatus.RUNNING:
            return self.elapsed_s
        return self.elapsed_s + math.floor(self.clock() - self.elapsed_at)  # whole seconds: it shows seconds

    @property
    def compiling(self) -> bool:
        """torch.compile compiles the model at a step's boundary: training waits for it (seconds to minutes)."""
        return self.state == RunStatus.RUNNING and self.state_detail == COMPILING

    def would_refuse(self, option: str, value: Any) -> str | None:
        """Why the trainer would refuse ``option = value`` on this run, in its words, from what the app knows: the
        device and the batch (its welcome), the machine's cores and GPUs (its system samples). None when the app
        knows no reason; the trainer still checks what only it knows.

        The app asks before it sends: a key that cycles skips such a value, a switch and a prompt refuse it with
        this reason. The trainer's checks are core/engine/precision.py (fp16), trainer.py (pinned memory) and
        distributed.py's ``check_world_size``; its own refusals, once made, are ``was_refused``.
        """
        device = self.device.split(":")[0]
        if not device:  # before the welcome
            return None
        if option == "amp" and value == "fp16" and device != "cuda":
            return f"fp16 needs CUDA; this run is on {device}: use bf16"
        if option == "pin_memory" and value and device != "cuda":
            return (f"pinned memory speeds up copies of batches from the host to a CUDA device; this run trains on "
                    f"{device}, where batches are not copied")
        if option == "world_size" and isinstance(value, int):
            return self._world_size_refusal(value, device)
        return None

    def _world_size_refusal(self, size: int, device: str) -> str | None:
        """A batch the ranks cannot share equally, or more ranks than the machine has GPUs (CUDA) or cores (CPU).
        The machine's figures are all its GPUs and cores: a run may be allowed fewer, which the trainer refuses."""
        batch = self.batch_size
        if batch and batch % size:
            return (f"world size {size} does not divide the batch of {batch} (the global batch stays {batch} and "
                    f"each rank takes an equal share): choose a divisor of {batch}")
        sample = self.telemetry
        if sample is None:
            return None
        if device == "cuda":
            gpus = len(sample.gpus)
            if gpus and size > gpus:
                return f"{size} ranks need {size} GPUs, one each; this machine has {gpus}"
            return None
        cores = sample.host.cpu_count
        if cores and size > cores:
            return f"{size} ranks on the CPU need {size} cores, one each; this machine has {cores}"
        return None

    def eta_s(self) -> float | None:
        """Seconds to the last step at the recent pace, or None when unknown."""
        if self.total_steps is None or not self.recent_step_times or self.state not in (RunStatus.RUNNING, RunStatus.STARTING):
            return None
        remaining = self.total_steps - self.step
        if remaining <= 0:
            return 0.0
        return remaining * statistics.fmean(self.recent_step_times)

    def within_run(self, path: str) -> str:
        """A path of the run as the user finds it in its directory (``checkpoints/step-0000400.pt``), or as given
        when it lies elsewhere: a whole path does not fit an 80-column event log."""
        run_dir = self.run_dir.rstrip("/")
        return path[len(run_dir) + 1 :] if run_dir and path.startswith(run_dir + "/") else path

    @property
    def world_size(self) -> int:
        """The number of ranks training now, as the trainer last said (1 before it said)."""
        value = _int_or_none(self.options.get("world_size"))
        return value if value is not None and value > 0 else 1

    @property
    def has_ranks(self) -> bool:
        """Whether anything rank-related is worth its space: above world size 1, or relaunching to it."""
        return self.world_size > 1 or (self.state == RunStatus.RELAUNCHING and (self.relaunch_to or 1) > 1)

    def median_norm(self) -> float | None:
        values = [m.norm for m in self.modules if m.norm is not None and math.isfinite(m.norm)]
        return statistics.median(values) if values else None

    # ------------------------------------------------------------------ handlers

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
            self.metrics_version += 1
        self.step = event.step
        self._set_state(event.state, "")
        self.failure = None
        self._forget_requests()
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

    def take_history(self, history: RunHistory) -> None:
        """The run's steps before the first this app was sent, as its journals hold them (``history_wanted``):
        a resumed run's trainer reports only its own steps, so its chart started at the resume step."""
        until = self._history_until
        taken: list[float] = []
        for key, journal in history.by_step.items():
            series = self._journal_series(key)
            if series is None:
                continue
            first_reported = series.xs[0] if len(series) else math.inf
            xs, ys = journal.xs, journal.ys
            keep = [index for index, x in enumerate(xs) if x <= until and x < first_reported]
            if keep:
                _put_before(series, [xs[i] for i in keep], [ys[i] for i in keep])
                taken += (xs[keep[0]], xs[keep[-1]])
        if not taken:
            return
        changes = [change for step, change in zip(history.changed_at, history.changes) if step <= until]
        earlier = f"; option changes then: {', '.join(changes)}" if changes else ""
        self.log("info", f"steps {min(taken):.0f}–{max(taken):.0f} of this run read from its metrics.jsonl{earlier}",
                 int(max(taken)))
        self.metrics_version += 1
        self.named_series_version += 1

    def _journal_series(self, key: str) -> Series | None:
        """The series a figure of metrics.jsonl (run_history's key) is drawn from; None past MAX_NAMED_SERIES."""
        common = {"loss": self.loss, "val_loss": self.val_loss, "lr": self.lr, "samples_per_s": self.samples_per_s}
        if key in common:
            return common[key]
        kind, _, name = key.partition(".")
        name = name[:MAX_SERIES_NAME_CHARS]
        if name not in self.workload_metrics and len(self.workload_metrics) >= MAX_NAMED_SERIES:
            return None
        return self._metric_pair(name)[kind == "val_metrics"]

    def _on_metrics(self, event: protocol.Metrics) -> None:
        """A batch of reports as columns: each series grows by one column a message, no dict per report."""
        columns = event.columns
        if not isinstance(columns, dict) or not all(isinstance(values, list) for values in columns.values()):
            self.log("warning", "ignored a metrics batch that is not columns of values")
            return
        if "step" not in columns:
            self.log("warning", "ignored a metrics batch without a step column")
            return
        if len(set(map(len, columns.values()))) > 1:
            self.log("warning", f"ignored a metrics batch whose {len(columns)} columns differ in length")
            return
        steps = columns["step"]
        if not steps:
            return
        # The checks run per column too, in C where they can: a Python call per record per series cost
        # most of the app's time at 50k records/s; a per-value check still cost 2 us a record.
        if set(map(type, steps)) != {int}:
            checked = [_int_or_none(step) for step in steps]
            if None in checked:
                self.log("warning", f"ignored {checked.count(None)} metrics row(s) without a step")
                kept = [index for index, step in enumerate(checked) if step is not None]
                if not kept:
                    return
                columns = {name: [values[index] for index in kept] for name, values in columns.items()}
            steps = [step for step in checked if step is not None]
        self.step = max(self.step, max(steps))
        for key, series in (("loss", self.loss), ("lr", self.lr), ("samples_per_s", self.samples_per_s), ("step_time_s", self.step_time), ("val_loss", self.val_loss)):
            values = columns.get(key)
            if values is None:
                continue
            if _all_finite_numbers(values):
                series.extend(steps, values)
            elif set(map(type, values)) != {type(None)}:  # e.g. val_loss, present on a few steps only
                points = [(step, value) for step, value in zip(steps, values) if _is_finite_number(value)]
                if points:
                    series.extend([step for step, _ in points], [value for _, value in points])
        self._take_named(steps, columns.get("lrs"), self.group_lrs, lambda name: self.group_lrs.setdefault(name, Series()))
        self._take_named(steps, columns.get("metrics"), self.workload_metrics, lambda name: self._metric_pair(name)[0])
        self._take_named(steps, columns.get("val_metrics"), self.workload_metrics, lambda name: self._metric_pair(name)[1])
        times = columns.get("step_time_s")
        if times is not None:
            times = times[-self.recent_step_times.maxlen :]
            if not (_all_finite_numbers(times) and min(times) >= 0):
                times = [value for value in times if _is_finite_number(value) and value >= 0]
            self.recent_step_times.extend(times)
        skipped = columns.get("skipped")
        if skipped is not None and True in skipped:
            for step, was_skipped in zip(steps, skipped):
                if was_skipped is True:
                    self.log("warning", "optimizer step skipped (fp16 overflow: the scaler lowered its scale)", step)
        record = {name: values[-1] for name, values in columns.items()}
        self.last_record = record
        elapsed = _float_or_none(record.get("elapsed_s"))
        if elapsed is not None:
            self.elapsed_s, self.elapsed_at = elapsed, self.clock()
        # Reports also carry the options in force: they catch changes no acknowledgement told (--at).
        # A batch can arrive after an acknowledgement yet hold earlier steps: those must not undo it.
        last_step = _int_or_none(record.get("step")) or 0
        changed = {
            name: record[name]
            for name in OPTION_NAMES
            if name in record and self.options.get(name) != record[name] and last_step >= self._applied_at.get(name, 0)
        }
        if changed:
            self.options.update(changed)
            self.options_version += 1
            if isinstance(changed.get("steps"), int):  # the run's total, changed while it trains
                self.total_steps = changed["steps"]
        self.metrics_version += 1
        self.header_version += 1

    def _on_grad_norms(self, event: protocol.GradNorms) -> None:
        if len(event.norms) != len(self.modules):
            self.log("warning", f"gradient norms for {len(event.norms)} modules, but the trainer named {len(self.modules)}; ignored")
            return
        for module, value in zip(self.modules, event.norms):
            norm = _float_or_none(value)
            module.norm = norm
            if norm is not None:
                module.trend.append(norm)
        self.grad_step = event.step
        self.grad_total = _float_or_none(event.total)
        self._flags_stale = True
        self.grads_version += 1

    def _take_named(self, steps: list[int], rows: list | None, table: dict[str, Any], series_of: Callable[[str], Series]) -> None:
        """A column of {name: value} per row (``lrs``, ``metrics``, ``val_metrics``; null on rows without one)
        into ``table``'s series, one per name (at most ``MAX_NAMED_SERIES``); a new name makes the charts show it."""
        if rows is None:
            return
        known = len(table)
        points: dict[str, tuple[list[int], list[float]]] = {}
        for step, row in zip(steps, rows):
            if not isinstance(row, dict):
                continue
            for name, value in row.items():
                if not isinstance(name, str) or not _is_finite_number(value):
                    continue
                name = name[:MAX_SERIES_NAME_CHARS]
                if name not in points and name not in table and len(table) + len(points) >= MAX_NAMED_SERIES:
                    continue
                xs, ys = points.setdefault(name, ([], []))
                xs.append(step)
                ys.append(value)
        for name, (xs, ys) in points.items():
            series_of(name).extend(xs, ys)
        if len(table) != known:
            self.named_series_version += 1

    def _metric_pair(self, name: str) -> tuple[Series, Series]:
        return self.workload_metrics.setdefault(name, (Series(), Series()))

    def _flag_modules(self) -> None:
        median = self.median_norm()
        for module in self.modules:
            module.ratio = module.norm / median if module.norm is not None and median else None
            module.flag = flag_for(module.norm, module.ratio, list(module.trend))

    def _on_telemetry(self, event: protocol.Telemetry) -> None:
        self.telemetry = event.sample
        self.telemetry_history.append(event.sample)
        self.telemetry_version += 1
        self.header_version += 1

    def running_trial(self) -> protocol.TrialProgress | None:
        """The trial running now: its progress while training has not gone past the step it began at (progress
        is sent as the newest value, apart from the ordered events, so one may land after the trial's result)."""
        progress = self.trial_progress
        if progress is None or progress.step <= self.step or self.state != RunStatus.RUNNING:
            return None
        return progress

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
        level = "warning" if event.error is not None or rest else "impact"
        self.log(level, first, event.step, notify=True, toast=first)
        for line in rest:
            self.log("warning", line.strip(), event.step)

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
        )
        self.profiles.append(snapshot)
        self.profile_pending = False
        self.profiles_version += 1
        if event.error:
            self.log("warning", f"profile {snapshot.label} failed: {event.error} (P lists the snapshots)", event.last_step,
                     notify=True, toast=f"profile {snapshot.label} failed (P lists the snapshots)")
            return
        self.log(
            "profile",
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
                self.log("impact", f"{segment.verdict} (steps {first}–{last}; i shows the impact table)", last,
                         notify=True, toast=segment.verdict)

    def _on_option_applied(self, event: protocol.OptionApplied) -> None:
        self._answered(event.option, event.source)
        shown = format_option_value(event.option, event.value)
        if event.option in OPTION_NAMES:
            self.options[event.option] = event.value
            self._applied_at[event.option] = event.step
            self.options_version += 1
            previous = format_option_value(event.option, event.previous)
            text = f"{event.option} = {shown} applied at step {event.step} (was {previous})"
            if event.detail:
                text += f": {event.detail}"
            if event.option == "world_size":
                self._world_size_changed(event)
            if event.option == "steps":
                self.total_steps = event.value
                self.header_version += 1
        else:
            text = f"{event.option} = {shown} applied at step {event.step}"
        self.log("applied", text, event.step, notify=True)

    def _on_detached(self, event: protocol.Detached) -> None:
        if not self.detach_requested:  # history replayed on attach: an earlier app's detach
            self.log("info", f"an earlier app detached at step {event.step}", event.step)
            return
        self.detached = True
        self.detached_paused = self.state == RunStatus.PAUSED
        self.log("applied", f"detached at step {event.step}: {self.after_detach}", event.step, notify=True)

    @property
    def after_detach(self) -> str:
        """What the run does once this app has detached: "keeps training" would be a lie about a paused run,
        which waits, holding its memory, until someone attaches (a stop or SIGTERM still ends it)."""
        if self.detached_paused:
            return "the run stays paused: nothing trains until you attach and resume it (space)"
        return "the trainer keeps training"

    def _on_option_refused(self, event: protocol.OptionRefused) -> None:
        self._answered(event.option, event.source)
        shown = format_option_value(event.option, event.value)
        self.refused.add((event.option, shown))
        if event.option == "profile":
            self.profile_pending = False
            self.profiles_version += 1
        value = f" = {shown}" if event.value is not None or event.option in OPTION_NAMES else ""
        self.log("refused", f"{event.option}{value} refused: {event.reason}", event.step, notify=True)

    def _on_checkpoint(self, event: protocol.CheckpointSaved) -> None:
        self.checkpoint_step = event.step
        # The step is the line's own (its first column): the rest fits 80 columns.
        why = " (world-size change)" if event.reason == "world_size" else (f" ({event.reason})" if event.reason else "")
        self.log("checkpoint", f"checkpoint saved{why}: {self.within_run(event.path)}", event.step,
                 notify=event.reason == "requested")
        if event.reason == "world_size":
            self._begin_relaunch(event.step)

    # ---- world size and ranks

    def _begin_relaunch(self, step: int) -> None:
        """The trainer checkpointed for a new world size: it now stops every rank and starts the new ones
        (seconds: each imports torch and joins the rendezvous), during which no step is reported. The
        trainer says nothing between this checkpoint and the new ranks' first report, so the app says it."""
        target = _int_or_none(self.pending.get("world_size"))  # None: a scripted change (--at)
        self.relaunch_to = target
        current = self.world_size
        self._set_state(RunStatus.RELAUNCHING, f"{current} → {target}" if target is not None else "")
        self.ranks, self.ranks_step, self.rank_hosts = [], None, {}
        self.ranks_version += 1
        to = f" as {_processes(target)}" if target is not None else ""
        self.log("info", f"relaunching{to} from the checkpoint of step {step}…",
                 step, notify=True, toast=f"relaunching{to}…")

    def _world_size_changed(self, event: protocol.OptionApplied) -> None:
        """A new world size trains: figures from before the change describe ranks that are gone."""
        if self.state == RunStatus.RELAUNCHING:
            self._set_state(RunStatus.RUNNING, "")
        self.ranks, self.ranks_step = [], None
        self.ranks_version += 1

    def _start_ranks(self, described: list[RankProcess]) -> None:
        """A (new) trainer's welcome: forget the figures of any earlier one; note where each rank runs."""
        self.ranks, self.ranks_step = [], None
        self.rank_hosts = {process.rank: process.host for process in described}
        self.ranks_version += 1

    def _on_ranks(self, event: protocol.Ranks) -> None:
        """Per-rank figures (latest wins). Ignored at world size 1, and when gathered before the last
        world-size change (a latest-wins message of ranks that are gone)."""
        if self.world_size <= 1 or event.step < self._applied_at.get("world_size", 0):
            return
        in_order = sorted(event.ranks, key=lambda figures: figures.rank)
        self.ranks = flag_stragglers([ComparedRank(figures, self.rank_hosts.get(figures.rank, "")) for figures in in_order])
        self.ranks_step = event.step
        self.ranks_version += 1

    def _on_log(self, event: protocol.Log) -> None:
        level = event.level if event.level in ("warning", "error") else "info"
        step = _int_or_none(event.step)
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
            self.relaunch_to = None
        self.header_version += 1

    def _set_options(self, options: Any) -> None:
        if not isinstance(options, dict):
            self.log("warning", f"ignored options that are not an object: {options!r}")
            return
        self.options = dict(options)
        self.options_version += 1



def _processes(count: int) -> str:
    return f"{count} process" if count == 1 else f"{count} processes"


def _put_before(series: Series, xs: list[float], ys: list[float]) -> None:
    """``series`` with the points ``xs``, ``ys`` (all before its first) in front: built again, as Series grows at its
    end only (a few thousand points a run's journal holds, thinned by it as they go in)."""
    kept_xs, kept_ys = series.xs, series.ys
    series.clear()
    series.extend(xs, ys)
    series.extend(kept_xs, kept_ys)


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    return None


def _float_or_none(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    return None


def _all_finite_numbers(values: Sequence[Any]) -> bool:
    """True if every value is an int or float (not a bool) and finite; checked in C, not per value.

    A sum is finite only if every term is (a huge finite sum that overflows just takes the slow path).
    """
    return set(map(type, values)) <= {int, float} and math.isfinite(sum(values))


def _is_finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
