"""The lines rank 0 and its supervisor exchange over their channel (core/engine/ranks/channel.py): each one typed
message (``RankMessage``), decoded and validated as the app's are (``protocol.decode``; nothing is unpickled).

Rank 0 sends its hello (with the launch's token), its reports (a metrics row, an event, a telemetry sample) and
at the end its outcome; the supervisor sends commands. The two ``RowsFirst`` and ``RowsWritten`` keep a checkpoint
after the rows it covers (issue 46); ``ChannelRefused`` answers a line the other side could not read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from torchlab.core.engine.outcome import Relaunch, RunOutcome
from torchlab.core.errors import ConfigError, HangEnded, NonFiniteError, StorageError, WorkloadError, WorkloadExited
from torchlab.core.wire.events import TRAINER_EVENTS
from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.wire.payloads import TelemetrySample
from torchlab.core.wire.protocol import decode, Message, ProtocolError, trainer_command, TrainerCommand
from torchlab.core.wire.run_status import OUTCOMES, RunStatus
from torchlab.core.wire.typed_json import UnreadableValue

#: A report of a model with many thousands of modules is a long line (a name and a norm per module, twice);
#: longer than this is no report of ours.
MAX_LINE_BYTES = 64 << 20


@dataclass(frozen=True)
class RankMessage(Message):
    """Base of the rank channel's messages: a protocol of its own, which the app's socket does not read."""

    registry: ClassVar[dict[str, type[Message]]] = {}
    max_line_bytes: ClassVar[int] = MAX_LINE_BYTES


@dataclass(frozen=True)
class RankHello(RankMessage):
    """Rank 0's first line: the token the supervisor put in its environment."""

    type: ClassVar[str] = "hello"
    token: str


@dataclass(frozen=True)
class MetricsReport(RankMessage):
    """One metrics row, as rank 0's trainer reported it: its JSON object (``MetricsRow.json_object``)."""

    type: ClassVar[str] = "metrics"
    record: dict

    @classmethod
    def of(cls, row: MetricsRow) -> MetricsReport:
        return cls(record=row.json_object())

    def validate(self) -> None:
        self.as_reported()  # a row that does not read back (per-rank figures that are not RankFigures...) is refused here, as any bad line

    def as_reported(self) -> MetricsRow:
        """The row as rank 0's trainer made it, read back with its payloads (the per-rank figures as RankFigures,
        the memory as a MemoryBreakdown); a ProtocolError says why a record is not one."""
        try:
            return MetricsRow.from_json(self.record, "metrics.record")
        except UnreadableValue as error:
            raise ProtocolError(str(error)) from None


@dataclass(frozen=True)
class EventReport(RankMessage):
    """One of the trainer's typed events (core/wire/events.py, or an app protocol message), as its protocol text."""

    type: ClassVar[str] = "event"
    event: str

    def validate(self) -> None:
        self.as_event()  # a ProtocolError says what is wrong with it

    @classmethod
    def of(cls, event: Message) -> EventReport:
        return cls(event=event.json_text())

    def as_event(self) -> Message:
        event = decode(self.event)
        if not isinstance(event, TRAINER_EVENTS):
            raise ProtocolError(f"event: {event.type} is not an event a trainer reports")
        return event


@dataclass(frozen=True)
class TelemetryReport(RankMessage):
    type: ClassVar[str] = "telemetry"
    sample: TelemetrySample


#: The errors rank 0's outcome may name that its supervisor tells apart, by name: where the name that crossed the
#: channel becomes a class again, and the only place.
ERRORS_BY_NAME: dict[str, type[Exception]] = {
    kind.__name__: kind for kind in (ConfigError, WorkloadError, WorkloadExited, StorageError, NonFiniteError, HangEnded)
}


@dataclass(frozen=True)
class Outcome(RankMessage):
    """Rank 0's last line: how its run ended (a RunOutcome, whose error travels as its class's name), and the
    commands it never handled (for the next trainer)."""

    type: ClassVar[str] = "outcome"
    status: str
    step: int
    message: str = ""
    kind: str = ""  # the class of the error that ended it: the name of one of ``ERRORS_BY_NAME``, or of another
    relaunch: dict | None = None  # a Relaunch's fields
    unhandled: list = dataclasses.field(default_factory=list)  # trainer commands, each its protocol line
    stopped_by: str = ""  # RunOutcome's: the signal that asked for the stop, and the rank it reached

    def validate(self) -> None:
        if self.status not in OUTCOMES:
            raise ProtocolError(f"outcome.status: not one of {', '.join(OUTCOMES)}")
        try:
            self.relaunch_change()
            self.unhandled_commands()
        except (KeyError, TypeError, ValueError):
            raise ProtocolError("outcome: a relaunch or an unhandled command that is not one") from None

    @classmethod
    def of(cls, outcome: RunOutcome, unhandled: list[TrainerCommand]) -> Outcome:
        return cls(
            status=outcome.status, step=outcome.step, message=outcome.message,
            kind=outcome.error.__name__ if outcome.error is not None else "",
            relaunch=dataclasses.asdict(outcome.relaunch) if outcome.relaunch else None,
            unhandled=[command.json_text() for command in unhandled], stopped_by=outcome.stopped_by,
        )

    def as_run_outcome(self) -> RunOutcome:
        """The outcome as rank 0's trainer returned it; its error's class found again by name (None: another class
        than the supervisor acts on)."""
        return RunOutcome(RunStatus(self.status), self.step, self.message, self.relaunch_change(),
                          error=ERRORS_BY_NAME.get(self.kind), stopped_by=self.stopped_by)

    def relaunch_change(self) -> Relaunch | None:
        return None if self.relaunch is None else Relaunch(**self.relaunch)

    def unhandled_commands(self) -> list[TrainerCommand]:
        return [trainer_command(line) for line in self.unhandled]


@dataclass(frozen=True)
class CommandMessage(RankMessage):
    """A command for rank 0, from the supervisor: the trainer command as its own protocol line."""

    type: ClassVar[str] = "command"
    command: str

    def validate(self) -> None:
        try:
            self.as_command()
        except (KeyError, TypeError, ValueError):
            raise ProtocolError("command: not a command") from None

    @classmethod
    def of(cls, command: TrainerCommand) -> CommandMessage:
        return cls(command=command.json_text())

    def as_command(self) -> TrainerCommand:
        return trainer_command(self.command)


@dataclass(frozen=True)
class RowsFirst(RankMessage):
    """Rank 0 is about to write the checkpoint of ``step``: the supervisor writes the rows it holds of the steps up to
    it (``TrainerObserver.before_checkpoint``) and answers ``RowsWritten``, and only then is the checkpoint written.
    The rows travel here and land in metrics.jsonl in the supervisor's process while rank 0 writes the checkpoint:
    without the answer, a kill just after the checkpoint's rename lost the rows the supervisor still held (issue 46)."""

    type: ClassVar[str] = "rows_first"
    step: int


@dataclass(frozen=True)
class RowsWritten(RankMessage):
    """The supervisor's answer to ``RowsFirst``: the rows up to ``step`` are written, or ``failure`` says why not."""

    type: ClassVar[str] = "rows_written"
    step: int
    failure: str = ""


@dataclass(frozen=True)
class ChannelRefused(RankMessage):
    """The answer to a line the other side could not read; it goes on reading."""

    type: ClassVar[str] = "refused"
    reason: str
