"""The wire protocol between the app and the trainer: typed, versioned messages as JSON lines.

Standard library only: the app imports this without torch. One message is one line of UTF-8 JSON,
``{"v": 5, "type": "<name>", ...fields}``, at most ``MAX_LINE_BYTES``. Nothing is ever unpickled.
``decode`` turns a line into a message object or raises ``ProtocolError`` with a reason fit to send
back (text that is not Unicode, half of a surrogate pair escaped alone, is such a line: every string of a
decoded message can be encoded and compared); a peer that receives garbage answers with a ``Refused`` event
and goes on (or closes only that connection), never crashes.

Commands go from the app to the trainer; events from the trainer to the app. Per-module gradient norms
travel as arrays aligned with the module names sent once in ``Welcome``. The payloads nested in events (the
run, its modules, a system sample, the ranks' figures, the impact table) are typed too
(``core/wire/payloads.py``), and ``decode`` validates them field by field: a reason names the path of what
is wrong, ``telemetry.sample.gpus[0].memory_used_bytes: expected int or null, got str``. Each field is declared
once, as its annotation: core/wire/typed_json.py reads a JSON value as the type the annotation names.

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

import json
import re
import time
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from torchlab.core.errors import SHOWN_CHARS, shown
from torchlab.core.wire import strict_json
from torchlab.core.wire.metrics_row import SET_ONLY, MetricsRow, columns_of
from torchlab.core.wire.payloads import CommunicationShare, ImpactSegment, MemoryBreakdown, ModuleInfo, RankFigures, RunInfo, TelemetrySample, TrialArm, TrialSpeed
from torchlab.core.wire.typed_json import JsonObject, JsonScalar, UnreadableValue, first_few, read_object, read_value

PROTOCOL_VERSION = 16  #: what each version added: docs/protocol-versions.md (a change to a message bumps it)
MAX_LINE_BYTES = 1 << 20
#: A live option's name, a command's source and a value typed for it are short; longer ones are refused
#: before anything echoes them.
MAX_OPTION_CHARS = 64
MAX_SOURCE_CHARS = 64
MAX_VALUE_CHARS = 256
#: No option or count is this large; a larger integer (JSON reads up to 4,300 digits) is refused as a
#: message, before float() of it can overflow or a record repeats it.
MAX_COMMAND_INT = 10**18



class ProtocolError(ValueError):
    """A line that is not a valid message; the text says why."""


class OtherVersion(ProtocolError):
    """A line of another version of the protocol (``version``, what its ``v`` says): its peer is a torchlab-tui of
    another release, a run started before an upgrade, which a client of this one can neither read nor command."""

    def __init__(self, version: Any) -> None:
        super().__init__(f"protocol version {shown(version)} is not supported; this side speaks version {PROTOCOL_VERSION}")
        self.version = version

    def sentence(self, name: str, what: str) -> str:
        """``name`` (a run) cannot be ``what`` (attached, stopped) from this release, and what can."""
        return (f"{name} was started by another version of torchlab-tui (it speaks protocol {shown(self.version)}, this "
                f"one {PROTOCOL_VERSION}): it cannot be {what} from this one; use the torchlab-tui that started it, or "
                f"stop its trainer with SIGTERM (kill PID), which ends it at its next step with a checkpoint.")


@dataclass(frozen=True)
class Message(JsonObject):
    """Base of every message; subclasses set ``type`` and declare their fields (each once, its annotation)."""

    type: ClassVar[str] = ""
    #: this protocol's messages by type. A subclass that declares its own registry is the base of another
    #: protocol (the rank channel's, core/engine/ranks/channel.py), whose lines ``decode`` reads apart from these.
    registry: ClassVar[dict[str, type[Message]]] = {}
    #: the longest line this protocol reads
    max_line_bytes: ClassVar[int] = MAX_LINE_BYTES
    #: the event's name in the run's journal, where it differs from ``type``
    journal_name: ClassVar[str] = ""
    #: whether the run's journal (``events.jsonl``) keeps it: False for news that is not history
    journalled: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.type:
            if cls.type in cls.registry:
                raise TypeError(f"two messages are named {cls.type!r}")
            cls.registry[cls.type] = cls

    def encode(self) -> bytes:
        """One line: the message as JSON, NaN/Inf as null, ending in a newline."""
        return (self.json_text() + "\n").encode("utf-8")

    def json_text(self) -> str:
        """The message as JSON text, without the newline: how a command travels inside another message
        (rank 0's broadcast to its ranks, a supervisor's command to rank 0), read back by ``decode``."""
        payload = {"v": PROTOCOL_VERSION, "type": self.type}
        payload.update({f.name: getattr(self, f.name) for f in fields(self)})
        return strict_json.dumps(payload)

    def validate(self) -> None:
        """Checks across fields, after each field's type was checked; raise ProtocolError."""

    def journal_record(self) -> dict[str, Any]:
        """The event as its line in ``events.jsonl``: ``event``, ``step``, the time it is written, its fields."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        step = values.pop("step", getattr(self, "step", None))
        return {"event": self.journal_name or self.type, "step": step, "time": time.time(), **values}


def fault(error: BaseException) -> str:
    """A fault of ours that one peer's line met, as the refusal that ends it says it: its kind and message, cut
    short (a message may repeat what the peer sent). Each socket answers such a fault with this, and goes on."""
    text = f"{type(error).__name__}: {error}".encode("utf-8", "backslashreplace").decode("utf-8")  # no half surrogate
    return text if len(text) <= 2 * SHOWN_CHARS else text[: 2 * SHOWN_CHARS - 3] + "..."


def decode(line: bytes | bytearray | str, protocol: type[Message] = Message) -> Message:
    """Parse one line into a message of ``protocol`` (the app's by default), validating version, type and
    every field."""
    if isinstance(line, (bytes, bytearray)):
        if len(line) > protocol.max_line_bytes:
            raise ProtocolError(f"message of {len(line)} bytes exceeds the limit of {protocol.max_line_bytes}")
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("message is not UTF-8") from None
    try:
        payload = json.loads(line)
    except (ValueError, RecursionError):  # ValueError: bad JSON, or an integer over Python's 4300-digit limit
        raise ProtocolError("message is not valid JSON (or holds a number too long to read, or nests too deep)") from None
    _require_unicode(line, payload)
    if not isinstance(payload, dict):
        raise ProtocolError("message must be a JSON object")
    version = payload.pop("v", None)
    if version != PROTOCOL_VERSION:
        raise OtherVersion(version)
    kind = payload.pop("type", None)
    cls = protocol.registry.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"unknown message type {shown(kind)}")
    try:
        message = read_object(cls, payload, kind, nested=False)
    except UnreadableValue as error:
        raise ProtocolError(str(error)) from None
    message.validate()
    return message


def read_payload(kind: Any, data: Any, path: str) -> Any:
    """A JSON value read as ``kind`` (a payload type of ``core/wire/payloads.py``, or ``list[`` one ``]``),
    validated field by field as ``decode`` reads one nested in a message; a ProtocolError names the ``path``
    of what is wrong."""
    try:
        return read_value(kind, data, path)
    except UnreadableValue as error:
        raise ProtocolError(str(error)) from None


#: A JSON escape of half of a surrogate pair: the only way a decoded line can hold text that is not Unicode.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _require_unicode(line: str, payload: Any) -> None:
    """ProtocolError if a string of ``payload`` (a name or a value, however deep) holds half of a surrogate pair.

    JSON may escape one half alone (``"\\ud800"``), and ``json.loads`` takes it: the str it makes fails only when
    it is encoded, far from the socket (the token's comparison killed an accept thread). Both halves in order are
    one character (strict_json escapes an emoji so), which the check lets through. Only a line with such an escape
    is checked, by encoding what it decoded to: the common line costs one regex scan."""
    if _SURROGATE_ESCAPE.search(line) is None:
        return
    try:
        json.dumps(payload, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ProtocolError("message holds text that is not Unicode (half of a surrogate pair, escaped alone)") from None
    except RecursionError:  # json.loads read this depth; its encoder may give up a little sooner
        raise ProtocolError("message is not valid JSON (or holds a number too long to read, or nests too deep)") from None


# ----------------------------------------------------------------------------- commands (app -> trainer)
# The trainer takes these objects as they are: from the app's socket (the worker stamps ``source="app"``),
# from ``--at`` and ``--profile-at``, from a signal handler, and, as these same lines, from rank 0 to the
# other ranks and from a supervisor to rank 0.


@dataclass(frozen=True)
class Hello(Message):
    """The first command on a connection: proves the client is the run's owner (the token). ``view``: a
    read-only viewer, any number of them beside the one app that controls the run."""

    type: ClassVar[str] = "hello"
    version: int
    token: str
    client: str = "torchlab-tui"
    view: bool = False


@dataclass(frozen=True)
class TrainerCommand(Message):
    """Base of what a trainer acts on at a step boundary (Hello and Detach are the connection's, not the trainer's)."""


@dataclass(frozen=True)
class PauseCommand(TrainerCommand):
    type: ClassVar[str] = "pause"


@dataclass(frozen=True)
class ResumeCommand(TrainerCommand):
    type: ClassVar[str] = "resume"


@dataclass(frozen=True)
class StopCommand(TrainerCommand):
    """Stop at the next step boundary, write a final checkpoint, exit; ``reason`` goes to the run's outcome."""

    type: ClassVar[str] = "stop"
    reason: str = "requested"

    def validate(self) -> None:
        _check_length("stop.reason", self.reason, MAX_VALUE_CHARS)


@dataclass(frozen=True)
class SetCommand(TrainerCommand):
    """Change a live option at the next step boundary; answered by OptionApplied or OptionRefused."""

    type: ClassVar[str] = "set"
    option: str
    value: JsonScalar
    source: str = "app"

    def validate(self) -> None:
        _check_option_command(self)


@dataclass(frozen=True)
class TrialCommand(TrainerCommand):
    """Try ``option`` = ``value`` for ``steps`` steps against as many as it is, from the same state on the same
    batches, then go on as if nothing was tried; answered by TrialResult (which says why, if it could not run)."""

    type: ClassVar[str] = "trial"
    option: str
    value: JsonScalar
    steps: int
    source: str = "app"

    def validate(self) -> None:
        _check_option_command(self)


def _check_option_command(command: SetCommand | TrialCommand) -> None:
    """Bounded, so that no command can echo a huge value into the refusal and the run's journal."""
    _check_length(f"{command.type}.option", command.option, MAX_OPTION_CHARS)
    _check_length(f"{command.type}.source", command.source, MAX_SOURCE_CHARS)
    if isinstance(command.value, str):
        _check_length(f"{command.type}.value", command.value, MAX_VALUE_CHARS)
    _check_magnitude(f"{command.type}.value", command.value)


#: Steps a profiler snapshot records unless told: ``--profile-steps``, the app's ``p`` and a profile message's default.
DEFAULT_PROFILE_STEPS = 5


@dataclass(frozen=True)
class ProfileCommand(TrainerCommand):
    """Profile the next ``steps`` optimizer steps (after one warm-up step)."""

    type: ClassVar[str] = "profile"
    steps: int = DEFAULT_PROFILE_STEPS
    source: str = "app"

    def validate(self) -> None:
        _check_magnitude("profile.steps", self.steps)
        _check_length("profile.source", self.source, MAX_SOURCE_CHARS)


def _check_length(field_name: str, text: str, limit: int) -> None:
    if len(text) > limit:
        raise ProtocolError(f"{field_name}: longer than {limit} characters")


def _check_magnitude(field_name: str, value: Any) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_COMMAND_INT:
        raise ProtocolError(f"{field_name}: {shown(value)} is out of range (at most 1e18 in size)")


@dataclass(frozen=True)
class SaveCheckpointCommand(TrainerCommand):
    type: ClassVar[str] = "save_checkpoint"


@dataclass(frozen=True)
class DetachCommand(Message):
    """The app leaves on purpose; the trainer keeps training. Answered by Detached."""

    type: ClassVar[str] = "detach"


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


@dataclass(frozen=True)
class Log(Message):
    """A line for the app's event log: trainer.log output, warnings, notices."""

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


COMMANDS = (Hello, PauseCommand, ResumeCommand, StopCommand, SetCommand, ProfileCommand, SaveCheckpointCommand, TrialCommand, DetachCommand)
EVENTS = (Welcome, Replayed, State, Metrics, GradNorms, Memory, TrialResult, Telemetry, OptionApplied, OptionRefused, Detached, CheckpointSaved, Log, Error, NonFinite, ProfileReady, Impact, Ranks, Refused)


# The trainer's own events (core/wire/events.py) are messages of this protocol too, and join ``Message.registry``
# when their module runs. Imported here, last, so that whatever imports this module decodes every event a trainer
# sends: ``torchlab-tui stop`` imported this module alone, and a run's ``stop_requested`` ended it in "unknown
# message type". events.py imports this module first; by then every name it takes from here is defined.
from torchlab.core.wire import events as _every_event  # noqa: E402,F401
