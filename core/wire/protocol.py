"""The wire protocol between the app and the trainer: its messages, each a typed, versioned line of JSON.

Commands go from the app to the trainer; events from the trainer to the app. Per-module gradient norms
travel as arrays aligned with the module names sent once in ``Welcome``. The payloads nested in events (the
run, its modules, a system sample, the ranks' figures, the impact table) are typed too
(``core/wire/payloads.py``), and ``decode`` validates them field by field.

How a message travels (``Message``, ``decode``, ``ProtocolError``, the version and the line's limit) is
core/wire/codec.py's. This module is the protocol's one vocabulary, imported as ``p`` (``p.decode``, ``p.SetCommand``):
it re-exports the codec's names (``__all__``) and imports the trainer's own events (core/wire/events.py) last, so
that whatever imports it decodes every message a peer sends.

Every process takes typed messages apart one way, a ``match`` on the message's class::

    match message:
        case MetricsReport(): ...
        case OptionApplied() | OptionRefused(): ...
        case ProfileReady() if message.error: ...
        case _: ...

Not a dict of handlers by type, nor a chain of ``isinstance``: a ``match`` reads top to bottom as the list of
what a process takes, with what it does beside each; it takes several types in one case and a condition
(``if message.error``) where a handler table needs a second dispatch inside the handler; its last case says
what happens to anything else. It costs at most about 1 µs a message among the app's 21 cases (a dict's lookup:
0.1 µs), nothing beside what the app does with the message; per-step reports travel in batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar

from torchlab.core.errors import shown
from torchlab.core.wire.codec import (
    MAX_LINE_BYTES, PROTOCOL_VERSION, Message, OtherVersion, ProtocolError, decode, fault, read_payload,
)
from torchlab.core.wire.commands import (
    DEFAULT_PROFILE_STEPS, MAX_COMMAND_INT, MAX_OPTION_CHARS, MAX_SOURCE_CHARS, MAX_VALUE_CHARS, DetachCommand,
    ForecastCommand, Hello, PauseCommand, ProfileCommand, ResumeCommand, SaveCheckpointCommand, SetCommand, StopCommand,
    TrainerCommand, TrialCommand,
)
from torchlab.core.wire.metrics_row import SET_ONLY, MetricsRow, columns_of
from torchlab.core.wire.communication import CommunicationShare
from torchlab.core.wire.payloads import ImpactSegment, MemoryBreakdown, ModuleInfo, RankFigures, RunInfo, TelemetrySample, TrialArm, TrialSpeed
from torchlab.core.wire.typed_json import JsonScalar, first_few

#: The vocabulary: the codec's names, the commands' (commands.py), with the events and limits of this module.
__all__ = [
    "MAX_LINE_BYTES", "PROTOCOL_VERSION", "Message", "OtherVersion", "ProtocolError", "decode", "fault", "read_payload",
    "MAX_OPTION_CHARS", "MAX_SOURCE_CHARS", "MAX_VALUE_CHARS", "MAX_COMMAND_INT", "DEFAULT_PROFILE_STEPS",
    "Hello", "TrainerCommand", "PauseCommand", "ResumeCommand", "StopCommand", "SetCommand", "TrialCommand",
    "ProfileCommand", "SaveCheckpointCommand", "ForecastCommand", "DetachCommand", "trainer_command",
    "Welcome", "Replayed", "State", "Metrics", "GradNorms", "TrialResult", "TrialProgress", "Memory", "Telemetry",
    "OptionApplied", "OptionRefused", "Detached", "CheckpointSaved", "Log", "LogLevel", "Error", "NonFinite", "ProfileReady",
    "Impact", "Ranks", "Refused", "COMMANDS", "EVENTS",
]

# ----------------------------------------------------------------------------- commands (app -> trainer): commands.py


def trainer_command(line: str) -> TrainerCommand:
    """One encoded trainer command (a line of this protocol) back as its object, or ProtocolError."""
    command = decode(line)
    if not isinstance(command, TrainerCommand):
        raise ProtocolError(f"{command.type} is not a command for the trainer")
    return command


# ----------------------------------------------------------------------------- events (trainer -> app)


@dataclass(frozen=True)
class Welcome(Message):
    """Answer to Hello: the run, its module tree (names once; later arrays follow this order)."""

    type: ClassVar[str] = "welcome"
    run: RunInfo
    modules: list[ModuleInfo]  # in the order of GradNorms.norms
    options: dict
    state: str
    step: int


@dataclass(frozen=True)
class Replayed(Message):
    """Sent once on each connection, right after the run's past (the reports and events held before the app
    connected): what follows is news. The app folds the past into its state and log, with one toast for it
    at most, and logs that it connected after the past, so that its log ends with the newest events."""

    type: ClassVar[str] = "replayed"
    journalled: ClassVar[bool] = False
    events: int  # how many of the past's messages were events (acknowledgements, states, checkpoints, logs)


@dataclass(frozen=True)
class State(Message):
    """The run's state: starting, running, paused, stopped, finished, failed."""

    type: ClassVar[str] = "state"
    state: str
    step: int
    detail: str = ""


@dataclass(frozen=True)
class Metrics(Message):
    """A batch of metrics rows (core/wire/metrics_row.py), oldest first, as columns: each key of a row's JSON
    object -> its values.

    Columns are the keys of ``MetricsRow.json_object`` (step, loss, lr, samples_per_s, step_time_s, the options...),
    all of one length, less those ``SENT_APART``; a value a row does not have (val_loss off eval steps) is null. One
    list per column, not one per row: at 50k rows/s the app decodes and garbage-collects ~20 lists a batch, not
    ~1000, and folds each column into its series in one call. So the app reads the columns (tui/state_metrics.py),
    and ``rows`` is for the rest (tests, tools): a ``MetricsRow`` built per row cost the app more than its share.
    """

    type: ClassVar[str] = "metrics"
    #: the fields of a row that travel in messages of their own (GradNorms, with the update's figures; Memory, Ranks:
    #: the newest wins) or not
    #: at all (activation statistics), and so are None in ``rows``
    SENT_APART: ClassVar[tuple[str, ...]] = ("grad_norms", "act_stats", "memory", "ranks", "update_ratios",
                                             "weight_norms", "adam")
    columns: dict

    @classmethod
    def from_rows(cls, rows: list[MetricsRow]) -> Metrics:
        return cls(columns=columns_of(rows, leave_out=cls.SENT_APART))

    @property
    def rows(self) -> list[MetricsRow]:
        """The rows, oldest first (see ``row``)."""
        return [self.row(index) for index in range(len(next(iter(self.columns.values()), [])))]

    def row(self, index: int) -> MetricsRow:
        """The row at ``index`` (-1: the newest), read as a line of ``metrics.jsonl`` is (``MetricsRow.from_json``:
        UnreadableValue for one that is not a row). A column holds null where a row lacks a field: a field a row
        has only where it is set (``val_loss``...) reads as absent there (an evaluation's loss that was not finite
        too)."""
        values = {name: column[index] for name, column in self.columns.items()}
        return MetricsRow.from_json({name: value for name, value in values.items() if value is not None or name not in SET_ONLY})

    def validate(self) -> None:
        lengths = {len(values) if isinstance(values, list) else -1 for values in self.columns.values()}
        if -1 in lengths:
            raise ProtocolError("metrics.columns: every column must be a list of values")
        if len(lengths) > 1:
            raise ProtocolError(f"metrics.columns: columns must be of one length, got lengths [{first_few([str(n) for n in sorted(lengths)])}]")


@dataclass(frozen=True)
class GradNorms(Message):
    """Per-module gradient norms at ``step``, aligned with Welcome.modules; null where not measured. On a step whose
    update was measured (core/engine/measure/update_probe.py), in the same order: ``ratios`` (‖Δθ‖/‖θ‖) and ``weights`` (‖θ‖),
    the heatmap's and the gradient flags' (Adam's moments stay in the run's files: the app shows none)."""

    type: ClassVar[str] = "grad_norms"
    step: int
    norms: list
    total: float | None = None
    ratios: list | None = None
    weights: list | None = None

    @classmethod
    def from_row(cls, row: MetricsRow) -> GradNorms:
        """The message of a row the probe measured (``row.grad_norms`` set): each figure in its modules' order."""
        names = list(row.grad_norms or {})

        def aligned(figures: dict | None) -> list | None:
            return [figures.get(name) for name in names] if figures is not None else None

        return cls(step=row.step, norms=list((row.grad_norms or {}).values()), total=row.grad_norm_total,
                   ratios=aligned(row.update_ratios), weights=aligned(row.weight_norms))


@dataclass(frozen=True)
class TrialResult(Message):
    """A controlled trial of ``option`` = ``value`` from ``step`` (core/engine/trials.py): its two arms, the
    changed one first, or ``error`` when it could not run at all (then ``arms`` is empty). Training went on
    from ``step`` as if no trial had run. ``speed``: the changed arm's step time over the other's, with its interval
    and verdict; None where the arms ran too few blocks to pair (or one stopped), and in a trial recorded before
    its arms were interleaved (protocol 9's ``trials.jsonl`` lines): their speed is read off the arms, as then."""

    type: ClassVar[str] = "trial_result"
    step: int
    option: str
    value: JsonScalar
    steps: int
    arms: list[TrialArm]
    error: str | None = None
    source: str = ""
    speed: TrialSpeed | None = None


@dataclass(frozen=True)
class TrialProgress(Message):
    """How far the trial begun at ``step`` is: ``done`` of ``steps`` steps of its arm ``arm`` (1: ``label``, the
    option changed; 2: as it is). ``timing``: past the trial's K steps, timing on until its speed's interval is
    narrow, ``steps`` then the most it may run. The newest replaces an unsent older one; the journal keeps the
    trial's start and its result, not this."""

    type: ClassVar[str] = "trial_progress"
    journalled: ClassVar[bool] = False
    step: int
    label: str
    arm: int
    done: int
    steps: int
    timing: bool = False

    def validate(self) -> None:
        if self.arm not in (1, 2):
            raise ProtocolError(f"trial_progress: arm must be 1 or 2, got {shown(self.arm)}")
        if not 0 <= self.done <= self.steps:
            raise ProtocolError(f"trial_progress: done must be from 0 to steps ({shown(self.steps)}), got {shown(self.done)}")


@dataclass(frozen=True)
class Memory(Message):
    """The bytes training holds in tensors, by kind, on the newest step that measured them; the newest replaces
    an unsent older one."""

    type: ClassVar[str] = "memory"
    breakdown: MemoryBreakdown


@dataclass(frozen=True)
class Telemetry(Message):
    """A system sample (host, GPUs, allocator); the newest replaces an unsent older one."""

    type: ClassVar[str] = "telemetry"
    sample: TelemetrySample


@dataclass(frozen=True)
class OptionApplied(Message):
    type: ClassVar[str] = "option_applied"
    option: str
    value: JsonScalar
    previous: JsonScalar
    step: int
    source: str = ""
    display: str = ""  # the value as the user would type it back ("off", "on")
    detail: str = ""  # what the change did besides, where it says something ("the data loader starts again at sample 640 of epoch 1")


@dataclass(frozen=True)
class OptionRefused(Message):
    type: ClassVar[str] = "option_refused"
    option: str
    value: JsonScalar
    reason: str
    step: int
    source: str = ""


@dataclass(frozen=True)
class Detached(Message):
    """The answer to DetachCommand: from ``step`` on, the app may leave and the trainer trains on."""

    type: ClassVar[str] = "detached"
    step: int


@dataclass(frozen=True)
class CheckpointSaved(Message):
    type: ClassVar[str] = "checkpoint"
    step: int
    path: str
    reason: str = ""


class LogLevel(StrEnum):
    """A ``Log`` line's level: information, a warning, or an error (a notice in the app)."""

    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True)
class Log(Message):
    """A line for the app's event log: trainer.log output, warnings, notices. ``level``: a ``LogLevel`` (read as text:
    a level this app does not know is shown as information)."""

    type: ClassVar[str] = "log"
    level: str
    text: str
    step: int | None = None


@dataclass(frozen=True)
class Error(Message):
    """The run failed: the message, the traceback, and where the last checkpoint is."""

    type: ClassVar[str] = "error"
    message: str
    traceback: str
    step: int
    checkpoint: str | None = None
    rank: int | None = None  # with ranks: the one it happened on, and how its process ended
    exitcode: int | None = None


@dataclass(frozen=True)
class NonFinite(Message):
    """NaN/Inf stopped the run: where it began (phase, module) and the step."""

    type: ClassVar[str] = "nonfinite"
    step: int
    phase: str
    module: str | None
    detail: str
    message: str = ""
    loss: float | None = None  # the step's loss and total gradient norm, as far as they were measured
    grad_norm_total: float | None = None


@dataclass(frozen=True)
class ProfileReady(Message):
    """A profiler snapshot's tables: top rows by op, and by op and input shape; files in ``dir``."""

    type: ClassVar[str] = "profile_ready"
    journal_name: ClassVar[str] = "profile"
    first_step: int
    last_step: int
    dir: str
    rows: list = field(default_factory=list)
    rows_by_shape: list = field(default_factory=list)
    sort: str = "self_cpu_us"
    build_s: float = 0.0
    error: str | None = None
    #: with ranks, how long collectives ran within these steps, in all and per kind; None without ranks
    communication: CommunicationShare | None = None

    @property
    def step(self) -> int:
        """The step it is reported at: its last."""
        return self.last_step


@dataclass(frozen=True)
class Impact(Message):
    """The impact table so far: one row per option segment (``ImpactTracker.table()``); newest wins."""

    type: ClassVar[str] = "impact"
    segments: list[ImpactSegment]


@dataclass(frozen=True)
class Ranks(Message):
    """Per-rank figures at ``step`` when training data-parallel (gathered on report steps, at most once a
    second), in rank order; the newest replaces an unsent older one. A rank much slower than the others (a
    straggler) holds every rank back at each all-reduce."""

    type: ClassVar[str] = "ranks"
    step: int
    ranks: list[RankFigures]


@dataclass(frozen=True)
class Refused(Message):
    """A protocol-level refusal: wrong token, wrong version, malformed message. Says why."""

    type: ClassVar[str] = "refused"
    reason: str


COMMANDS = (Hello, PauseCommand, ResumeCommand, StopCommand, SetCommand, ProfileCommand, SaveCheckpointCommand, TrialCommand, ForecastCommand,
            DetachCommand)
EVENTS = (Welcome, Replayed, State, Metrics, GradNorms, Memory, TrialResult, Telemetry, OptionApplied, OptionRefused, Detached, CheckpointSaved, Log, Error, NonFinite, ProfileReady, Impact, Ranks, Refused)


# The trainer's own events (core/wire/events.py) are messages of this protocol too, and join ``Message.registry``
# when their module runs. Imported here, last, so that whatever imports this module decodes every event a trainer
# sends: ``torchlab-tui stop`` imported this module alone, and a run's ``stop_requested`` ended it in "unknown
# message type". events.py imports this module first; by then every name it takes from here is defined.
from torchlab.core.wire import events as _every_event  # noqa: E402,F401
