"""The app's socket in-process (core/wire/control_server.py): what it answers a stranger, what it passes on as a
refused line, and that no burst of connections crowds out the app. Issue 12, item 2. The trainer process
behind it is tests/process/test_hostile_lines.py's business; here a Welcome and a list stand in for it."""

from __future__ import annotations

import errno
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from metrics_rows import metrics_row
from torchlab.core.wire import control_server as cs
from torchlab.core.wire import protocol as p
from torchlab.core.wire.outbox import Outbox
from torchlab.core.wire.payloads import RunInfo
from torchlab.core.wire.protocol import PROTOCOL_VERSION

#: How a line of the protocol begins: its version (a test's line stays one of today's when it moves on).
V = f'{{"v": {PROTOCOL_VERSION}'.encode()

TOKEN = "ab" * 16
WAIT_S = 30.0
RUN = RunInfo(workload="tiny", run_dir="/runs/x", device="cpu", steps=10, batch_size=4, pid=1, started=0.0,
              checkpoint_blocks=[], world_size=1, ranks=[])


class Served:
    """A ControlServer on a short socket path, with what reached its callbacks."""

    def __init__(self, directory: Path) -> None:
        self.commands: list[p.Message] = []
        self.refused: list[tuple[str, bool]] = []
        self.gone = 0
        self.changed = threading.Condition()
        self.server = cs.ControlServer(
            directory / "s.sock", TOKEN, Outbox(),
            welcome=lambda: p.Welcome(run=RUN, modules=[], options={}, state="running", step=0),
            on_command=lambda command, client: self._keep(self.commands, command),
            on_client_gone=lambda: self._keep([], setattr(self, "gone", self.gone + 1)),
            on_refused=lambda reason, before_hello: self._keep(self.refused, (reason, before_hello)),
        )

    def _keep(self, into: list, item) -> None:
        with self.changed:
            into.append(item)
            self.changed.notify_all()

    def until(self, predicate, timeout: float = WAIT_S) -> None:
        with self.changed:
            assert self.changed.wait_for(predicate, timeout), f"timed out; refused so far: {self.refused[-5:]}"

    def connect(self) -> socket.socket:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.settimeout(WAIT_S)
        client.connect(str(self.server.socket_path))
        return client

    def app(self, view: bool = False) -> socket.socket:
        """A connection that said the right hello and got its Welcome (``view``: as a read-only viewer)."""
        client = self.connect()
        client.sendall(p.Hello(version=p.PROTOCOL_VERSION, token=TOKEN, view=view).encode())
        assert answer(client).type == "welcome"
        assert answer(client) == p.Replayed(events=0)  # the run had no past
        return client


def answer(client: socket.socket) -> p.Message:
    """The next message (read a byte at a time: a buffered reader per call would swallow the one after)."""
    return p.decode(client.makefile("rb", buffering=0).readline())


@pytest.fixture
def served():
    with tempfile.TemporaryDirectory(prefix="cs-") as directory:  # a Unix socket's path is short (108 bytes)
        serving = Served(Path(directory))
        yield serving
        serving.server.close()


def test_refused_lines_are_passed_on_before_and_after_the_hello_and_a_probe_is_not(served):
    """The worker journals what reaches on_refused. ``attach`` probes a socket by connecting and hanging up
    at once: that said nothing, so it must not fill the journal with refusals."""
    served.connect().close()  # the probe
    stranger = served.connect()
    stranger.sendall(b"\xff not json\n")
    assert "expected a hello" in answer(stranger).reason
    served.until(lambda: len(served.refused) == 1)
    app = served.app()
    app.sendall(V + b', "type": "' + b"x" * 100_000 + b'"}\n')
    served.until(lambda: len(served.refused) == 2)
    app.sendall(p.PauseCommand().encode())
    served.until(lambda: served.commands)

    (before, before_hello), (after, after_hello) = served.refused
    assert before.startswith("expected a hello with a token first: message is not UTF-8") and before_hello
    assert after.startswith("unknown message type 'xxx") and len(after) < 300 and not after_hello


def test_a_line_cut_off_by_the_peer_hanging_up_is_a_refused_line(served):
    stranger = served.connect()
    stranger.sendall(V + b', "type": "hel')
    stranger.shutdown(socket.SHUT_WR)
    assert "connection closed" in answer(stranger).reason
    served.until(lambda: served.refused == [("expected a hello with a token first: connection closed", True)])


def test_the_hello_has_its_time_in_all_however_slowly_the_bytes_come(served, monkeypatch):
    """HELLO_TIMEOUT_S bounded each wait for a byte, not the hello: a byte every few seconds held a
    connection, and its thread, for as long as the peer liked."""
    monkeypatch.setattr(cs, "HELLO_TIMEOUT_S", 0.5)
    stranger = served.connect()
    stranger.settimeout(0.1)  # a byte each 0.1 s until the server answers: each well within HELLO_TIMEOUT_S
    deadline = time.monotonic() + WAIT_S
    while True:
        assert time.monotonic() < deadline, "the server never gave up on a hello that never ends"
        try:
            try:
                stranger.sendall(b" ")
            except BrokenPipeError:  # it answered and closed since the last byte: the answer waits to be read
                pass
            reply = stranger.recv(65536)
            break
        except TimeoutError:
            continue
    assert "expected a hello with a token first: timed out" in p.decode(reply.split(b"\n")[0]).reason


def test_a_burst_of_idle_connections_is_bounded_and_the_app_keeps_its_control(served):
    """300 connections that say nothing: at most MAX_AWAITING_HELLO wait for their hello (a thread each), each
    newer one taking the place of the oldest, which is told why and closed; the attached app's commands still
    arrive, and once the strangers are gone a new connection is heard again (the count of waiting ones went down)."""
    app = served.app()
    strangers = [served.connect() for _ in range(300)]  # all connect: none gets EAGAIN or ECONNREFUSED
    app.sendall(p.SetCommand(option="accum", value=2).encode())
    served.until(lambda: served.commands == [p.SetCommand(option="accum", value=2)])

    dropped = 300 - cs.MAX_AWAITING_HELLO
    served.until(lambda: len(served.refused) == dropped)
    assert set(served.refused) == {(cs.DROPPED_FOR_A_NEWER, True)}
    assert all(answer(client).reason == cs.DROPPED_FOR_A_NEWER and client.recv(1) == b"" for client in strangers[:dropped])
    for client in strangers:
        client.close()

    served.until(lambda: len(served.refused) == dropped)  # the waiting ones hung up without a word
    late = served.connect()
    late.sendall(p.Hello(version=p.PROTOCOL_VERSION, token="guess").encode())
    assert "wrong token" in answer(late).reason
    app.sendall(p.PauseCommand().encode())
    served.until(lambda: served.commands[-1] == p.PauseCommand())


def test_idle_connections_never_keep_the_app_out(served, monkeypatch):
    """64 connections that said nothing held every place before a hello: ``attach`` was refused ("too many
    connections awaiting hello") for as long as someone kept them open. The oldest idle one now gives way."""
    monkeypatch.setattr(cs, "HELLO_TIMEOUT_S", 120.0)  # the app gets in long before any of them times out
    idle = [served.connect() for _ in range(cs.MAX_AWAITING_HELLO + 16)]
    started = time.monotonic()
    client = served.connect()
    client.settimeout(10.0)
    client.sendall(p.Hello(version=p.PROTOCOL_VERSION, token=TOKEN).encode())
    assert answer(client).type == "welcome" and time.monotonic() - started < 10.0
    assert all(_closed_for_a_newer(stranger) for stranger in idle[:17])  # the 16 too many, then one for the app
    assert not _closed_for_a_newer(idle[17])
    for stranger in idle:
        stranger.close()


def _closed_for_a_newer(client: socket.socket) -> bool:
    client.settimeout(0.5)
    try:
        return answer(client).reason == cs.DROPPED_FOR_A_NEWER
    except TimeoutError:
        return False


def test_a_token_that_is_not_unicode_is_refused_and_the_socket_serves_on(served, monkeypatch):
    """A lone surrogate escaped in the hello's token ("\\ud800") read as JSON, then failed to encode for the
    comparison: the connection's thread died with a traceback and the stranger was never answered."""
    faults = []
    monkeypatch.setattr(threading, "excepthook", faults.append)
    stranger = served.connect()
    stranger.settimeout(10.0)
    stranger.sendall(V + b', "type": "hello", "version": 8, "token": "\\ud800"}\n')
    assert "not Unicode" in answer(stranger).reason
    served.until(lambda: served.refused)
    assert served.refused[0][0].startswith("expected a hello with a token first: message holds text that is not Unicode")
    served.app()
    assert faults == []


def test_a_fault_meeting_one_connection_refuses_that_peer_and_the_socket_serves_on(served, monkeypatch):
    """Whatever one connection's line makes go wrong in the server is that connection's end, said as one line:
    never a dead thread, a traceback, or a client left waiting for an answer."""
    faults, real_decode = [], cs.decode
    monkeypatch.setattr(threading, "excepthook", faults.append)

    def decode_failing_once(line):
        monkeypatch.setattr(cs, "decode", real_decode)
        raise KeyError("a bug")

    monkeypatch.setattr(cs, "decode", decode_failing_once)
    stranger = served.connect()
    stranger.settimeout(10.0)
    stranger.sendall(p.Hello(version=p.PROTOCOL_VERSION, token=TOKEN).encode())
    assert answer(stranger).reason == "this connection failed: KeyError: 'a bug'"
    served.until(lambda: served.refused == [("this connection failed: KeyError: 'a bug'", True)])
    served.app()
    assert faults == []


def test_a_command_the_server_fails_on_is_refused_and_the_app_stays_attached(served, monkeypatch):
    """A fault acting on one command ended the app's connection, which is the app going away: the run stopped."""
    faults = []
    monkeypatch.setattr(threading, "excepthook", faults.append)
    app = served.app()
    keep = served.server._on_command

    def failing_on_pause(command, client):
        if isinstance(command, p.PauseCommand):
            raise ValueError("a bug")
        keep(command, client)

    served.server._on_command = failing_on_pause
    app.sendall(p.PauseCommand().encode())
    assert answer(app).reason == "this command failed: ValueError: a bug"
    app.sendall(p.ResumeCommand().encode())
    served.until(lambda: served.commands == [p.ResumeCommand()])
    assert served.gone == 0 and faults == [] and served.refused == [("this command failed: ValueError: a bug", False)]


def test_accept_failing_for_want_of_descriptors_does_not_end_the_serving(served, monkeypatch):
    """accept() raising EMFILE (a process out of descriptors) ended the accept loop: the socket stayed, and
    no app could ever attach again."""
    real_accept = socket.socket.accept
    failures, failed_thrice = [], threading.Event()

    def accept_or_fail(listener):
        if len(failures) < 3:
            failures.append(errno.EMFILE)
            if len(failures) == 3:
                failed_thrice.set()
            raise OSError(errno.EMFILE, "Too many open files")
        return real_accept(listener)

    monkeypatch.setattr(socket.socket, "accept", accept_or_fail)
    assert failed_thrice.wait(WAIT_S)
    app = served.connect()
    app.sendall(p.Hello(version=p.PROTOCOL_VERSION, token=TOKEN).encode())
    assert answer(app).type == "welcome"


def test_an_over_long_line_from_the_app_is_refused_and_the_next_one_read(served):
    """The app's connection closing is the app going away, which stops the run; so an over-long line on it
    is refused and skipped, where it used to close that connection."""
    app = served.app()
    for size in (p.MAX_LINE_BYTES, p.MAX_LINE_BYTES + 1, 3 * p.MAX_LINE_BYTES):
        app.sendall(b"x" * size + b"\n")
    app.sendall(p.PauseCommand().encode())
    served.until(lambda: served.commands == [p.PauseCommand()])
    assert [before_hello for _, before_hello in served.refused] == [False] * 3
    assert "exceeds the limit" in served.refused[2][0] and "not valid JSON" in served.refused[0][0]


def test_viewers_get_the_stream_beside_the_app_their_commands_are_refused_and_their_going_is_nothing(served):
    app = served.app()
    viewers = [served.app(view=True) for _ in range(3)]  # three viewers beside the one app that controls
    served.server._outbox.add_event(p.Log(level="info", text="for everyone", step=1))
    for client in [app, *viewers]:
        assert answer(client) == p.Log(level="info", text="for everyone", step=1)
    viewers[0].sendall(p.PauseCommand().encode())
    assert answer(viewers[0]) == p.Refused(reason=cs.READ_ONLY)
    for viewer in viewers:
        viewer.close()
    app.sendall(p.ResumeCommand().encode())
    served.until(lambda: served.commands == [p.ResumeCommand()])  # the viewer's pause never reached the run
    assert served.gone == 0  # viewers leaving is not the app leaving (which stops a run)
    intruder = served.connect()
    intruder.sendall(p.Hello(version=p.PROTOCOL_VERSION, token="guess", view=True).encode())
    assert "wrong token" in answer(intruder).reason  # viewing takes the owner's token too
    app.close()
    served.until(lambda: served.gone == 1)


def test_a_connection_gets_the_runs_past_then_a_marker_then_news(served):
    outbox = served.server._outbox
    outbox.add_event(p.State(state="running", step=0))
    outbox.add_metrics(metrics_row(1, loss=2.5))
    outbox.add_event(p.OptionApplied(option="clip", value=1.0, previous=None, step=5, source="app"))
    viewer = served.connect()
    viewer.sendall(p.Hello(version=p.PROTOCOL_VERSION, token=TOKEN, view=True).encode())
    assert answer(viewer).type == "welcome"
    past = [answer(viewer) for _ in range(4)]
    assert past == [p.Metrics.from_rows([metrics_row(1, loss=2.5)]), p.State(state="running", step=0),
                    p.OptionApplied(option="clip", value=1.0, previous=None, step=5, source="app"), p.Replayed(events=2)]
    outbox.add_event(p.Log(level="info", text="news", step=6))
    assert answer(viewer) == p.Log(level="info", text="news", step=6)


def test_viewers_are_bounded(served):
    viewers = [served.app(view=True) for _ in range(cs.MAX_VIEWERS)]
    one_more = served.connect()
    one_more.sendall(p.Hello(version=p.PROTOCOL_VERSION, token=TOKEN, view=True).encode())
    assert answer(one_more).reason == f"too many viewers of this run (at most {cs.MAX_VIEWERS})"
    viewers[0].close()
    for _ in range(1000):  # a place freed is taken again, once the server has read the hang-up
        again = served.connect()
        again.sendall(p.Hello(version=p.PROTOCOL_VERSION, token=TOKEN, view=True).encode())
        if answer(again).type == "welcome":
            break
    else:
        pytest.fail("the place a viewer left was never free again")
    served.app()  # and the app's own place was never theirs


def test_viewers_that_come_and_go_leave_no_thread_behind(served):
    """The server kept the sender thread of every connection it ever served: a run watched for weeks by viewers
    that come and go held one each (seen in a review of the viewer code)."""
    for _ in range(40):
        viewer = served.app(view=True)
        viewer.close()
    deadline = time.monotonic() + WAIT_S  # a sender sees its connection closed within the outbox's 0.5 s wait
    while sum(thread.is_alive() for thread in served.server._senders) > 0:
        assert time.monotonic() < deadline, "senders of closed connections still alive"
        time.sleep(0.05)
    served.app(view=True)  # each new stream lets go of the senders of connections gone, just after its welcome
    while len(served.server._senders) != 1:  # the welcome can reach us before the server has let them go
        assert time.monotonic() < deadline, f"{len(served.server._senders)} senders kept"
        time.sleep(0.05)


def test_no_thread_to_be_had_for_a_connection_refuses_it_and_the_accept_loop_goes_on(served, monkeypatch):
    """Thread.start raising (a process at its limit of threads) ended the accept loop: no app could attach again."""
    real_thread, refusals = threading.Thread, []

    class NoThreadOnce(real_thread):
        def start(self):
            if self.name == "torchlab-connection" and not refusals:
                refusals.append(self)
                raise RuntimeError("can't start new thread")
            super().start()

    monkeypatch.setattr(cs.threading, "Thread", NoThreadOnce)
    stranger = served.connect()
    stranger.settimeout(10.0)
    assert answer(stranger).reason == "no thread to serve this connection (RuntimeError: can't start new thread); try again"
    served.app()


def test_the_apps_commands_are_passed_on_in_order_while_its_welcome_waits_for_the_trainer():
    """Keys typed as the app's screen shows reach the socket while the trainer still loads torch, and its Welcome
    waits for the trainer: read only after the Welcome, they reached the trainer after its first step boundary
    (or not at all, refused). They are passed on at once, in order, and the Welcome follows when the run is ready."""
    with tempfile.TemporaryDirectory(prefix="cs-") as directory:
        ready, commands, attached = threading.Event(), [], threading.Event()

        def welcome():
            ready.wait(WAIT_S)
            return p.Welcome(run=RUN, modules=[], options={}, state="running", step=0)

        server = cs.ControlServer(Path(directory) / "s.sock", TOKEN, Outbox(), welcome=welcome,
                                  on_command=lambda command, client: commands.append(command),
                                  on_client_gone=lambda: None, on_client_attached=attached.set)
        try:
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.settimeout(WAIT_S)
            client.connect(str(server.socket_path))
            client.sendall(p.Hello(version=PROTOCOL_VERSION, token=TOKEN).encode())
            sent = [p.SetCommand("accum", 2), p.SetCommand("amp", "bf16"), p.PauseCommand()]
            client.sendall(b"".join(command.encode() for command in sent))
            deadline = time.monotonic() + WAIT_S
            while len(commands) < len(sent):
                assert time.monotonic() < deadline, f"only {commands} passed on before the welcome"
                time.sleep(0.01)
            assert commands == sent and attached.is_set()
            ready.set()
            assert answer(client).type == "welcome"
            client.sendall(p.ResumeCommand().encode())
            while len(commands) < len(sent) + 1:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            assert commands[-1] == p.ResumeCommand()
        finally:
            server.close()


def test_an_app_that_stops_reading_is_let_go_after_the_send_timeout(served, monkeypatch):
    """The controlling app's commands are read from its hello on, so its socket has no timeout for reads (an app
    may type nothing for hours); a send to an app that stopped reading (its process stopped, its machine gone)
    still gives up after ``SEND_TIMEOUT_S``, and the run treats the app as gone, as before the reads moved."""
    monkeypatch.setattr(cs, "SEND_TIMEOUT_S", 0.5)
    app = served.app()
    outbox = served.server._outbox
    for index in range(200):  # 4 MB: far beyond what the socket's buffers hold for a client that reads nothing
        outbox.add_event(p.Log(level="info", text=f"{index} " + "x" * 20_000))
    served.until(lambda: served.gone == 1)
    app.close()
