"""The channel between the supervisor and rank 0 (issue 12): typed messages, a refusal for a bad line
(and reading on), a journal of refusals that a flood cannot fill, and a loud end when it breaks.

Both ends are real sockets; the other end of each is played by the test, as a buggy or hostile peer
would play it. The old channel read ``json.loads(line)`` in a loop ending in ``except (OSError,
ValueError): pass``: one bad line silently stopped relaying rank 0's reports for the rest of the run.
"""

from __future__ import annotations

import io
import socket
import sys
import threading
import time

import pytest

from metrics_rows import metrics_row
from torchlab.core.engine.ranks import channel as rc
from torchlab.core.engine.outcome import Relaunch, RunOutcome
from torchlab.core.errors import ConfigError, StorageError, WorkloadError
from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.wire.observer import TrainerObserver
from torchlab.core.wire.payloads import MemoryBreakdown, ModuleBytes, RankFigures
from torchlab.core.wire.protocol import PROTOCOL_VERSION, Hello, ProtocolError, SetCommand, StopCommand, Welcome, decode
from torchlab.core.wire.run_status import RunStatus


class Recorder(TrainerObserver):
    def __init__(self) -> None:
        self.metrics: list[MetricsRow] = []
        self.events: list[dict] = []

    def on_metrics(self, row):
        self.metrics.append(row)

    def on_event(self, event):
        self.events.append(event.journal_record())

    def refusals(self) -> list[dict]:
        return [event for event in self.events if event["event"] == "line_refused"]


def until(condition, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)
    return value


class Peer:
    """The far end of a channel, speaking raw lines."""

    def __init__(self, connection: socket.socket) -> None:
        self.socket = connection
        self.socket.settimeout(30)
        self.reader = connection.makefile("rb")

    def send(self, line: bytes) -> None:
        self.socket.sendall(line)

    def close(self) -> None:
        """As a process's exit would: the reader's file keeps the socket open past a plain close()."""
        try:
            self.socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.socket.close()

    def read(self) -> rc.RankMessage:
        line = self.reader.readline()
        assert line, "the channel closed"
        return decode(line, rc.RankMessage)


#: How a line of this protocol begins: its version, spelled as the sender spells it.
VERSION = f'{{"v": {PROTOCOL_VERSION}, '.encode()
GARBAGE = [
    b"not json\n",
    b"\xff\xfe not utf-8\n",
    b"[" * 100_000 + b"\n",  # nested too deep
    VERSION + b'"type": "metrics", "record": {"step": ' + b"9" * 5000 + b"}}\n",  # a number too long to read
    VERSION + b'"type": "metrics", "record": {"loss": 1.0}}\n',  # no step
    VERSION + b'"type": "event", "event": "{\\"v\\": 6, \\"type\\": \\"pause\\"}"}\n',  # a command, not an event
    VERSION + b'"type": "outcome", "status": "exploded", "step": 3}\n',
    VERSION + b'"type": "welcome", "run": {}}\n',  # the app's protocol, not this one
    VERSION + b'"type": "command", "command": {"command": "set"}}\n',  # a command is not a report
]


@pytest.fixture
def supervisor_end():
    recorder = Recorder()
    channel = rc.RankChannel(recorder, step=lambda: 41)
    peers = []

    def connect(token: str | None = None) -> Peer:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.connect(str(channel.path))
        peer = Peer(connection)
        peers.append(peer)
        if token is not None:
            peer.send(rc.RankHello(token=token).encode())
        return peer

    yield channel, recorder, connect
    for peer in peers:
        peer.close()
    channel.close()


def metrics_line(step: int) -> bytes:
    return rc.MetricsReport.of(metrics_row(step, loss=2.5)).encode()


def test_a_bad_line_from_rank_0_is_refused_journalled_and_the_reports_after_it_still_arrive(supervisor_end):
    channel, recorder, connect = supervisor_end
    rank0 = connect(channel.token)
    rank0.send(metrics_line(1))
    for number, line in enumerate(GARBAGE, start=2):
        rank0.send(line)
        refusal = rank0.read()
        assert isinstance(refusal, rc.ChannelRefused) and len(refusal.reason) < 300
        rank0.send(metrics_line(number))
    until(lambda: len(recorder.metrics) == len(GARBAGE) + 1, "every report")
    assert [m.step for m in recorder.metrics] == list(range(1, len(GARBAGE) + 2))
    refused = recorder.refusals()
    assert len(refused) == len(GARBAGE) and {r["channel"] for r in refused} == {"rank channel"}
    assert refused[0]["step"] == 41 and refused[0]["refused_by"] == "supervisor" and not refused[0]["before_hello"]


def test_a_line_over_the_cap_is_skipped_to_its_newline_and_refused(supervisor_end, monkeypatch):
    monkeypatch.setattr(rc, "MAX_LINE_BYTES", 4096)
    channel, recorder, connect = supervisor_end
    rank0 = connect(channel.token)
    rank0.send(VERSION + b'"type": "telemetry", "sample": {"x": "' + b"y" * 20_000 + b'"}}\n' + metrics_line(7))
    assert "exceeds the limit of 4096 bytes" in rank0.read().reason
    until(lambda: recorder.metrics, "the report after the long line")
    assert recorder.metrics == [metrics_row(7, loss=2.5)]


def test_a_flood_of_bad_lines_reaches_the_journal_as_a_burst_and_a_count(supervisor_end):
    channel, recorder, connect = supervisor_end
    rank0 = connect(channel.token)
    burst = channel._refusals.throttle.burst
    rank0.send(b"garbage\n" * (burst + 50) + metrics_line(1))
    until(lambda: recorder.metrics, "the report after the flood")
    assert len(recorder.refusals()) == burst
    channel._refusals.throttle._window_start -= channel._refusals.throttle.window_s  # a minute later
    rank0.send(b"garbage\n" + metrics_line(2))
    until(lambda: len(recorder.metrics) == 2, "the second report")
    assert recorder.refusals()[-1]["held_back"] == 50
    rank0.send(b"garbage\n" * (burst + 5) + metrics_line(3))  # the window is full again: 5 held back at the end
    until(lambda: len(recorder.metrics) == 3, "the third report")
    rank0.close()
    channel.close()
    assert recorder.events[-1] == {**recorder.events[-1], "event": "lines_refused_unrecorded", "channel": "rank channel", "count": 6}


def test_a_connection_without_the_token_is_refused_and_rank_0_still_gets_in(supervisor_end):
    channel, recorder, connect = supervisor_end
    stranger = connect("0" * 32)
    assert "hello with this launch's token" in stranger.read().reason
    assert stranger.reader.readline() == b""  # and closed
    rank0 = connect(channel.token)
    rank0.send(metrics_line(1))
    until(lambda: recorder.metrics, "rank 0's report")
    assert recorder.refusals()[0]["before_hello"]


def test_commands_reach_rank_0_typed_and_the_outcome_comes_back_with_what_it_did_not_handle(supervisor_end):
    channel, recorder, connect = supervisor_end
    channel.send(SetCommand("clip", "0.5", "app"))  # before rank 0 connects: queued
    rank0 = connect(channel.token)
    message = rank0.read()
    assert message == rc.CommandMessage(command=SetCommand("clip", "0.5", "app").json_text())
    assert message.as_command() == SetCommand("clip", "0.5", "app")
    rank0.send(rc.Outcome(status="relaunch", step=9, relaunch={"option": "world_size", "value": 2, "previous": 1, "step": 9,
                                                                  "source": "app", "world_size": 2},
                          unhandled=[StopCommand("later").json_text()]).encode())
    until(lambda: channel.outcome, "the outcome")
    rank0.close()
    assert channel.close() == [StopCommand("later")]
    assert channel.outcome.relaunch_change() == Relaunch("world_size", 2, 1, 9, "app", 2) and not channel.broken


@pytest.mark.parametrize("error", [StorageError, ConfigError, WorkloadError, None])
def test_the_error_that_ended_rank_0s_run_reaches_the_supervisor_as_its_class(error):
    """Its class crosses the channel as a name; the supervisor gets the class back (a full disk is told apart by
    type, not by comparing names), and a class of the workload's own comes back as no class rather than a guess."""
    sent = RunOutcome(RunStatus.FAILED, 7, "no space left", error=error)
    received = decode(rc.Outcome.of(sent, []).encode(), rc.RankMessage).as_run_outcome()
    assert received == sent and received.status is RunStatus.FAILED
    assert received.failed_with(StorageError) == (error is StorageError)
    workloads_own = RunOutcome(RunStatus.FAILED, 7, "boom", error=type("DataCorrupted", (RuntimeError,), {}))
    assert decode(rc.Outcome.of(workloads_own, []).encode(), rc.RankMessage).as_run_outcome().error is None


def test_an_outcome_whose_status_is_not_one_a_loop_ends_with_is_refused():
    with pytest.raises(ProtocolError, match="outcome.status: not one of finished, stopped, nonfinite, failed, relaunch, usage"):
        decode(rc.Outcome(status="running", step=3).encode(), rc.RankMessage)


def test_rank_0_gone_without_its_outcome_is_a_broken_channel_with_the_reason(supervisor_end):
    channel, recorder, connect = supervisor_end
    rank0 = connect(channel.token)
    rank0.send(metrics_line(1))
    rank0.close()
    assert channel.close() == []
    assert channel.outcome is None
    assert channel.broken == "the channel from rank 0 ended before it reported how its run ended (closed by the other side)"


class FakeTrainer:
    def __init__(self) -> None:
        self.commands: list = []
        self.stopped = threading.Event()
        self.stop_reason = ""

    def submit(self, command) -> None:
        self.commands.append(command)

    def request_stop(self, reason: str) -> None:
        self.stop_reason = reason
        self.stopped.set()


@pytest.fixture
def rank0_end(tmp_path):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "s.sock"))
    listener.listen(1)
    link = rc.SupervisorLink(tmp_path / "s.sock", "the-token")
    supervisor = Peer(listener.accept()[0])
    assert supervisor.read() == rc.RankHello(token="the-token")
    trainer = FakeTrainer()
    link.attach(trainer)
    yield link, supervisor, trainer
    link.close()
    supervisor.close()
    listener.close()


def test_rank_0_refuses_a_bad_command_line_and_takes_the_next(rank0_end, monkeypatch):
    link, supervisor, trainer = rank0_end
    # What rank 0 prints, polled below. Not capfd: each readouterr() empties its file after reading it, and a line
    # the link's thread wrote between the two was lost (CI timed out waiting for a line that had been printed).
    said = io.StringIO()
    monkeypatch.setattr(sys, "stderr", said)
    not_a_trainer_command = rc.CommandMessage(command=Hello(version=PROTOCOL_VERSION, token="x").json_text()).json_text()
    for line in GARBAGE[:4] + [f'{{"v": {PROTOCOL_VERSION}, "type": "command", "command": "{{\\"launch\\": 1}}"}}\n'.encode(),
                               (not_a_trainer_command + "\n").encode(),
                               rc.MetricsReport(record={"step": 1}).encode()]:
        supervisor.send(line)
        assert isinstance(supervisor.read(), rc.ChannelRefused)
    supervisor.send(rc.CommandMessage.of(SetCommand("accum", "2", "app")).encode())
    until(lambda: trainer.commands, "the command")
    assert trainer.commands == [SetCommand("accum", "2", "app")] and not trainer.stopped.is_set()
    supervisor.send(rc.ChannelRefused(reason="metrics.record: needs an integer step").encode())
    until(lambda: "the supervisor refused a report: metrics.record" in said.getvalue(), "rank 0 to say so")


def test_rank_0_stops_its_run_and_says_why_when_the_supervisor_goes(rank0_end, capfd):
    link, supervisor, trainer = rank0_end
    supervisor.close()
    assert trainer.stopped.wait(30) and trainer.stop_reason == "the supervisor went away"
    assert "the channel to the supervisor broke: closed by the other side" in capfd.readouterr().err
    link.on_metrics(metrics_row(2))  # sending on a broken channel is quiet now: the run is stopping
    assert link.broken


def test_the_channel_speaks_its_own_protocol_not_the_apps():
    outcome = rc.Outcome(status="finished", step=3)
    assert decode(outcome.encode(), rc.RankMessage) == outcome
    with pytest.raises(ProtocolError, match="unknown message type 'outcome'"):
        decode(outcome.encode())  # the app's socket does not read rank 0's messages
    with pytest.raises(ProtocolError, match="unknown message type 'welcome'"):
        decode(Welcome(run={}, modules=[], options={}, state="running", step=0).encode(), rc.RankMessage)


def test_rank_0s_per_rank_figures_reach_the_supervisor_typed_and_malformed_ones_are_refused(supervisor_end):
    """A metrics report carries the ranks' figures as JSON objects; the supervisor's observers get them back as
    RankFigures, and a report whose figures are not is refused (with where) like any bad line."""
    channel, recorder, connect = supervisor_end
    rank0 = connect(channel.token)
    figures = [RankFigures(rank, 0.25, 0.0004, None, None, None, 4.0e8) for rank in range(2)]
    rank0.send(rc.MetricsReport.of(metrics_row(1, loss=2.5, ranks=figures)).encode())
    malformed = {**metrics_row(2).json_object(), "ranks": [{"rank": 0, "step_time_s": "slow"}]}
    rank0.send(rc.MetricsReport(record=malformed).encode())
    refusal = rank0.read()
    assert isinstance(refusal, rc.ChannelRefused)
    assert refusal.reason.startswith("metrics.record.ranks[0].step_time_s: expected float or null, got str")
    until(lambda: recorder.metrics, "the report with figures")
    assert recorder.metrics == [metrics_row(1, loss=2.5, ranks=figures)]


def test_rank_0s_memory_breakdown_reaches_the_supervisor_typed_and_a_malformed_one_is_refused(supervisor_end):
    """The impact tracker beside the supervisor reads a MemoryBreakdown: the channel's JSON object is read back as one."""
    channel, recorder, connect = supervisor_end
    rank0 = connect(channel.token)
    memory = MemoryBreakdown(step=1, parameters_bytes=10, gradients_bytes=10, optimizer_bytes=20, activations_bytes=400,
                             allocator_peak_bytes=None, by_module=[ModuleBytes("body.0", 400)])
    rank0.send(rc.MetricsReport.of(metrics_row(1, loss=2.5, memory=memory)).encode())
    rank0.send(rc.MetricsReport(record={**metrics_row(2).json_object(), "memory": {"step": 2}}).encode())
    refusal = rank0.read()
    assert isinstance(refusal, rc.ChannelRefused) and refusal.reason.startswith("metrics.record.memory")
    until(lambda: recorder.metrics, "the report with its memory")
    assert recorder.metrics == [metrics_row(1, loss=2.5, memory=memory)]


def test_a_hello_whose_token_is_not_unicode_is_refused_and_rank_0_still_gets_in(supervisor_end, monkeypatch):
    """A lone surrogate escaped in a hello's token ("\\ud800") killed the channel's accept thread when the token was
    encoded to be compared: rank 0 could no longer connect, and a world-size-2 run failed ("rank 0 stopped reporting")."""
    channel, recorder, connect = supervisor_end
    faults = []
    monkeypatch.setattr(threading, "excepthook", faults.append)
    stranger = connect()
    stranger.socket.settimeout(10)
    stranger.send(VERSION + b'"type": "hello", "token": "\\ud800"}\n')
    assert stranger.read().reason.startswith("message holds text that is not Unicode")
    rank0 = connect(channel.token)
    rank0.send(metrics_line(1))
    until(lambda: recorder.metrics, "rank 0's report")
    assert faults == [] and recorder.refusals()[0]["before_hello"]


def test_a_fault_meeting_a_stranger_refuses_it_and_the_channel_serves_on(supervisor_end, monkeypatch):
    """Whatever a connection's line makes go wrong before its hello is that connection's end, journalled as one line."""
    channel, recorder, connect = supervisor_end
    faults, real_decode = [], rc.decode
    monkeypatch.setattr(threading, "excepthook", faults.append)

    def decode_failing_once(line, protocol):
        monkeypatch.setattr(rc, "decode", real_decode)
        raise KeyError("a bug")

    monkeypatch.setattr(rc, "decode", decode_failing_once)
    stranger = connect(channel.token)
    stranger.socket.settimeout(10)
    assert stranger.read().reason == "this connection failed: KeyError: 'a bug'"
    rank0 = connect(channel.token)
    rank0.send(metrics_line(1))
    until(lambda: recorder.metrics, "rank 0's report")
    assert faults == [] and recorder.refusals()[0]["reason"] == "this connection failed: KeyError: 'a bug'"


def test_a_report_the_supervisor_fails_on_is_refused_and_the_next_one_relayed(supervisor_end, monkeypatch):
    """A fault passing one report on ended the relay silently: rank 0's later reports and its outcome were lost."""
    channel, recorder, connect = supervisor_end
    faults = []
    monkeypatch.setattr(threading, "excepthook", faults.append)
    keep = recorder.on_metrics

    def failing_on_step_1(row):
        if row.step == 1:
            raise ValueError("a bug")
        keep(row)

    monkeypatch.setattr(recorder, "on_metrics", failing_on_step_1)
    rank0 = connect(channel.token)
    rank0.socket.settimeout(10)
    rank0.send(metrics_line(1) + metrics_line(2))
    assert rank0.read().reason == "this report failed: ValueError: a bug"
    until(lambda: recorder.metrics, "the next report")
    assert recorder.metrics == [metrics_row(2, loss=2.5)] and faults == []


def test_an_observer_that_fails_every_call_refuses_the_report_and_rank_0_still_gets_its_answer(supervisor_end, monkeypatch):
    """Found by the combination matrix: a headless run whose stderr's reader went away (the matrix's own crash; a
    pipe into ``head``): every line of its progress bar raised BrokenPipeError. The relay refused the report, the
    journalling of that refusal failed the same way, and the relay's thread died: rank 0 waited for ``RowsWritten``
    at its next checkpoint for ever, and its ranks with it. The relay now outlives any observer's fault, and a
    checkpoint's rows are always answered."""
    channel, recorder, connect = supervisor_end
    faults = []
    monkeypatch.setattr(threading, "excepthook", faults.append)

    def terminal_gone(*_):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(recorder, "on_metrics", terminal_gone)
    monkeypatch.setattr(recorder, "on_event", terminal_gone)
    monkeypatch.setattr(recorder, "before_checkpoint", terminal_gone, raising=False)
    rank0 = connect(channel.token)
    rank0.socket.settimeout(10)
    rank0.send(metrics_line(1) + rc.RowsFirst(step=1).encode())
    assert rank0.read().reason == "this report failed: BrokenPipeError: [Errno 32] Broken pipe"
    assert rank0.read() == rc.RowsWritten(step=1, failure="")
    rank0.send(metrics_line(2))
    assert rank0.read().reason.startswith("this report failed")  # still relaying
    assert faults == [] and channel._thread.is_alive()
