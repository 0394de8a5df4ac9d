"""The channel between the supervisor and rank 0: typed messages over a Unix socket, as the app's are.

Rank 0 reports (metrics, events, telemetry, and at the end its outcome) and the supervisor sends it
commands, which rank 0 broadcasts to the other ranks at its next step boundary. The supervisor serves
a socket (0600, in the 0700 runtime directory) and rank 0 connects, proving with a token (inherited in
the environment, never on a command line) that it is the rank this supervisor launched.

The guarantees are the app socket's: every line is one message of this protocol (``RankMessage``,
decoded and validated by ``protocol.decode``; nothing is unpickled); a line that is not one is answered
with ``ChannelRefused`` and journalled (``line_refused``, at most a burst a minute), and the reading goes
on; a line over the length cap is skipped to its newline and refused the same way, and so is a line that a
fault of ours meets (a stranger's hello, a report an observer fails on): one refused line, and the channel serves
on. When the channel
breaks (rank 0 gone without its outcome, or the supervisor gone), neither side goes on silently: rank 0
stops at its next step boundary, and the supervisor reports the run as failed with the reason
(``RankChannel.broken``), unless the launcher names a rank that failed first.
"""

from __future__ import annotations

import hmac
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from torchlab.core.engine.outcome import RunOutcome
from torchlab.core.engine.ranks.channel_messages import (
    MAX_LINE_BYTES, ChannelRefused, CommandMessage, EventReport, MetricsReport, Outcome, RankHello, RankMessage, RowsFirst,
    RowsWritten, TelemetryReport,
)
from torchlab.core.errors import HangEnded, StorageError
from torchlab.core.wire.run_status import RunStatus
from torchlab.core.wire.line_reader import LineReader
from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.wire.observer import TrainerObserver
from torchlab.core.wire.payloads import TelemetrySample
from torchlab.core.wire.protocol import decode, fault, Message, ProtocolError, StopCommand, TrainerCommand
from torchlab.core.wire.runtime import listen_privately, runtime_dir
from torchlab.core.wire.throttle import RefusedLines

#: How long the supervisor waits for rank 0 to connect and say hello (its imports came before).
HELLO_TIMEOUT_S = 30.0
#: How long rank 0, its trainer built, waits for commands already on their way before its first step (those sent at
#: its hello have long arrived: this only covers one in flight).
ARRIVED_WAIT_S = 0.05

#: The environment variable that carries the launch's token to rank 0 (never its command line).
TOKEN_VARIABLE = "TORCHLAB_SUPERVISOR_TOKEN"


def _how_it_ended(error: BaseException) -> str:
    return "closed by the other side" if isinstance(error, EOFError) else f"{type(error).__name__}: {error}"


def _send(connection: socket.socket, message: RankMessage) -> None:
    connection.sendall(message.encode())


# ---------------------------------------------------------------------- the supervisor's end


class RankChannel:
    """The supervisor's end: serves rank 0 and passes its reports to ``observer``.

    ``step`` says the run's step (for the journal's records of refused lines). After the ranks ended,
    ``close()`` returns the commands rank 0 never took; ``outcome`` is rank 0's last word, ``broken``
    why the channel ended without one (empty when it did not), ``storage_failure`` a write that failed.
    """

    def __init__(self, observer: TrainerObserver, step: Callable[[], int]) -> None:
        self.observer = observer
        self.token = secrets.token_hex(16)
        self.path = runtime_dir() / f"ranks-{secrets.token_hex(6)}.sock"
        self.outcome: Outcome | None = None
        self.broken = ""
        #: a record rank 0 sent could not be written to the run directory: the ranks were asked to stop
        self.storage_failure: StorageError | None = None
        self._step = step
        self._refusals = RefusedLines("rank channel")
        self._lock = threading.Lock()
        self._connection: socket.socket | None = None
        self._queued: list[TrainerCommand] = []
        self._closed = False
        self._listener = listen_privately(self.path, 4)
        self._listener.settimeout(0.25)
        self._thread = threading.Thread(target=self._serve, name="torchlab-rank-channel", daemon=True)
        self._thread.start()

    def send(self, command: TrainerCommand) -> None:
        """To rank 0 now, or as soon as it connects."""
        with self._lock:
            if self._connection is None:
                self._queued.append(command)
                return
            try:
                _send(self._connection, CommandMessage.of(command))
            except OSError:
                self._queued.append(command)  # rank 0 is going away; handed to the next trainer

    def close(self) -> list[TrainerCommand]:
        """After the ranks ended: read what rank 0 sent last, stop serving; return commands never delivered."""
        self._thread.join(timeout=10.0)
        self._closed = True
        self._listener.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        unrecorded = self._refusals.unrecorded(self._step())
        if unrecorded:
            try:
                self.observer.on_event(unrecorded)
            except StorageError as error:
                self.storage_failure = self.storage_failure or error
        with self._lock:
            queued, self._queued = self._queued, []
        return queued + (self.outcome.unhandled_commands() if self.outcome is not None else [])

    def _serve(self) -> None:
        while not self._closed:
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            reader = self._hello(connection)
            if reader is not None:
                self._welcome(connection, reader)  # then relays rank 0's reports until the end
                return  # one rank 0 per launch

    def _hello(self, connection: socket.socket) -> LineReader | None:
        """The reader of a connection that said rank 0's hello with this launch's token; anything else is refused
        and that connection closed (None)."""
        reader = LineReader(connection, MAX_LINE_BYTES)
        try:
            hello = decode(reader.next_line(deadline=time.monotonic() + HELLO_TIMEOUT_S), RankMessage)
            if not isinstance(hello, RankHello) or not hmac.compare_digest(hello.token.encode(), self.token.encode()):
                raise ProtocolError("expected rank 0's hello with this launch's token")
        except (ProtocolError, EOFError, OSError) as error:
            reason = str(error)
        except Exception as error:  # a fault of ours that this peer's line met: it is refused, the channel serves on
            reason = f"this connection failed: {fault(error)}"
        else:
            return reader
        self._refuse(connection, reason, before_hello=True)
        _close(connection)
        return None

    def _welcome(self, connection: socket.socket, reader: LineReader) -> None:
        connection.settimeout(None)
        with self._lock:
            self._connection = connection
            queued, self._queued = self._queued, []
        for command in queued:
            self.send(command)
        self._relay(connection, reader)

    def _relay(self, connection: socket.socket, reader: LineReader) -> None:
        """Rank 0's reports until it closes the channel; ``broken`` says how it ended if no outcome came."""
        while True:
            try:
                line = reader.next_line()
            except ProtocolError as error:  # over the length cap: skipped to its newline
                self._refuse(connection, str(error), before_hello=False)
                continue
            except (EOFError, OSError) as error:
                ended_by = _how_it_ended(error)
                break
            try:
                self._dispatch_or_stop(decode(line, RankMessage), connection)
            except ProtocolError as error:
                self._refuse(connection, str(error), before_hello=False)
            except Exception as error:  # a fault of ours passing this report on: refused, and the next one read
                self._refuse(connection, f"this report failed: {fault(error)}", before_hello=False)
        with self._lock:
            self._connection = None
        if self.outcome is None:
            self.broken = f"the channel from rank 0 ended before it reported how its run ended ({ended_by})"
        _close(connection)

    def _refuse(self, connection: socket.socket, reason: str, *, before_hello: bool) -> None:
        try:
            _send(connection, ChannelRefused(reason=reason))
        except OSError:
            pass  # rank 0 is gone; the journal still says what came
        self._journal_refusal(reason, before_hello=before_hello, by="supervisor")

    def _journal_refusal(self, reason: str, *, before_hello: bool, by: str) -> None:
        record = self._refusals.record(self._step(), reason, before_hello=before_hello, refused_by=by)
        if record is None:
            return
        try:
            self.observer.on_event(record)
        except StorageError as error:
            self._storage_failed(error)
        except Exception:  # an observer that fails on every call (a terminal gone): the line stays refused, and read on
            pass

    def _dispatch_or_stop(self, message: RankMessage, connection: socket.socket) -> None:
        """Pass a report on; if the run directory cannot take it (a full disk), stop the ranks at their next
        step boundary rather than let them train on with nothing written."""
        try:
            self._dispatch(message, connection)
        except StorageError as error:
            self._storage_failed(error)

    def _storage_failed(self, error: StorageError) -> None:
        if self.storage_failure is None:
            self.storage_failure = error
            self.send(StopCommand("a file of the run could not be written"))

    def _dispatch(self, message: RankMessage, connection: socket.socket) -> None:
        match message:
            case MetricsReport():
                self.observer.on_metrics(message.as_reported())
            case EventReport():
                self.observer.on_event(message.as_event())
            case TelemetryReport():
                self.observer.on_telemetry(message.sample)
            case Outcome():
                self.outcome = message
            case RowsFirst():
                self._write_rows_first(message.step, connection)
            case ChannelRefused():  # rank 0 could not read a command we sent
                self._journal_refusal(message.reason, before_hello=False, by="rank 0")
            case _:
                self._refuse(connection, f"{message.type} is not a report", before_hello=False)


    def _write_rows_first(self, step: int, connection: socket.socket) -> None:
        """The rows up to ``step`` written, then said to rank 0, which waits for it to write its checkpoint; a failed
        write is said too (the run stops as for any record it cannot write), so that rank 0 writes none."""
        failure = ""
        try:
            self.observer.before_checkpoint(step)
        except StorageError as error:
            failure = str(error)
            self._storage_failed(error)
        except Exception:  # a fault of an observer after the journal (a terminal gone): answered all the same, or rank 0
            pass  # would wait for ever, and its ranks with it
        with self._lock:
            try:
                _send(connection, RowsWritten(step=step, failure=failure))
            except OSError:
                pass  # rank 0 is gone: nothing waits for the answer


def _close(connection: socket.socket) -> None:
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    connection.close()


# ---------------------------------------------------------------------- rank 0's end


class SupervisorLink(TrainerObserver):
    """Rank 0's end: sends its trainer's records to the supervisor; queues the supervisor's commands
    into the trainer. If the channel breaks, the run stops at the next step boundary, and says why on
    rank 0's stderr (its log in the run's ranks/ folder)."""

    def __init__(self, path: Path, token: str) -> None:
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket.connect(str(path))
        self._lock = threading.Lock()
        self.trainer = None
        self.broken = ""
        self._closing = False
        self._rows_written = threading.Condition()  # the supervisor's answer to RowsFirst, from the reading thread
        self._rows_answer: RowsWritten | None = None
        self._send(RankHello(token=token))

    def attach(self, trainer) -> None:
        """Start taking commands for ``trainer`` (anything with ``submit`` and ``request_stop``): first, at once,
        those that came while it was built (typed ahead in the app, sent when this rank said hello, seconds ago),
        so that they are its first boundary's, as they would be in one process; then the rest, on a thread. (Read
        only by the thread, they raced the first step: a pause typed ahead landed a step late, or died with ranks
        an out-of-memory step at that boundary had the rescue start again.)"""
        self.trainer = trainer
        reader = LineReader(self._socket, MAX_LINE_BYTES)
        deadline = time.monotonic() + ARRIVED_WAIT_S
        while True:
            try:
                line = reader.next_line(deadline)
            except TimeoutError:
                break  # all that had come
            except ProtocolError as error:  # an over-long line
                self._answer_refused(str(error))
                continue
            except (EOFError, OSError):
                break  # the thread meets the end again, and says so
            try:
                self._take(line)
            except ProtocolError as error:
                self._answer_refused(str(error))
        self._socket.settimeout(None)
        threading.Thread(target=self._read_commands, args=(reader,), name="torchlab-supervisor-link", daemon=True).start()

    def on_metrics(self, row: MetricsRow) -> None:
        self._send(MetricsReport.of(row))

    def on_event(self, event: Message) -> None:
        self._send(EventReport.of(event))

    def on_telemetry(self, sample: TelemetrySample) -> None:
        self._send(TelemetryReport(sample=sample))

    def before_checkpoint(self, step: int) -> None:
        """Wait until the supervisor has written the rows up to ``step`` (``RowsFirst``; its answer is read by the
        thread ``attach`` starts). A StorageError where it could not, or where the channel broke: a checkpoint of
        ``step`` written then would hold steps whose rows a resume never writes again."""
        with self._rows_written:
            self._rows_answer = None
        self._send(RowsFirst(step=step))
        with self._rows_written:
            while self._rows_answer is None and not self.broken:
                self._rows_written.wait()
            answer = self._rows_answer
        if answer is None:
            raise StorageError(f"the rows of the steps up to {step} could not reach the supervisor, which writes them "
                               f"({self.broken}): no checkpoint of step {step} is written.")
        if answer.failure:
            raise StorageError(answer.failure)

    def send_outcome(self, outcome: RunOutcome, unhandled: list[TrainerCommand] = ()) -> None:
        self._send(Outcome.of(outcome, unhandled))

    def leaving(self, status: str, step: int, message: str) -> None:
        """Rank 0 leaves without its run returning (a hang it ended: the one way it does): the run's end is its outcome,
        sent before it goes."""
        self.send_outcome(RunOutcome(RunStatus(status), step, message, error=HangEnded))
        self.close()

    def close(self) -> None:
        """After the outcome: the end of the channel is no longer news."""
        self._closing = True
        _close(self._socket)

    def _send(self, message: RankMessage) -> None:
        with self._lock:
            if self.broken:
                return
            try:
                _send(self._socket, message)
            except OSError as error:
                self._break(f"could not send to the supervisor ({type(error).__name__}: {error})")

    def _break(self, reason: str) -> None:
        if self._closing:
            return
        if not self.broken:
            self.broken = reason
            print(f"torchlab rank 0: the channel to the supervisor broke: {reason}; stopping at the next step boundary",
                  file=sys.stderr, flush=True)
        if self.trainer is not None:
            self.trainer.request_stop("the supervisor went away")
        with self._rows_written:  # a checkpoint waiting for its rows' answer waits no more
            self._rows_written.notify_all()

    def _read_commands(self, reader: LineReader) -> None:
        while True:
            try:
                self._take(reader.next_line())
            except ProtocolError as error:
                self._answer_refused(str(error))
                continue
            except (EOFError, OSError) as error:
                self._break(_how_it_ended(error))
                return

    def _take(self, line: bytes) -> None:
        """One line from the supervisor; ProtocolError where it is none of ours."""
        match decode(line, RankMessage):
            case CommandMessage() as message:
                self.trainer.submit(message.as_command())
            case RowsWritten() as message:
                with self._rows_written:
                    self._rows_answer = message
                    self._rows_written.notify_all()
            case ChannelRefused() as message:  # the supervisor could not read a report of ours
                print(f"torchlab rank 0: the supervisor refused a report: {message.reason}", file=sys.stderr, flush=True)
            case message:
                self._answer_refused(f"{message.type} is not a command")

    def _answer_refused(self, reason: str) -> None:
        with self._lock:
            try:
                _send(self._socket, ChannelRefused(reason=reason))
            except OSError:
                pass  # the reader sees the end of the channel next
