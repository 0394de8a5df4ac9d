"""The trainer's socket: one Unix socket, a token checked before anything else, one controlling app and any
number of read-only viewers (up to ``MAX_VIEWERS``: each holds two threads).

A viewer (a hello with ``view``) gets what the controlling app gets, history first; a command from it is
refused, and its going away, however it goes, is nothing to the run: only the controlling app's is.

Each connection has a reader thread (commands in) and a sender thread (events out, from the Outbox
through the connection's own cursor). The trainer thread never touches a socket. A connection that
sends garbage is answered with ``Refused`` and closed; the trainer and other connections go on. Every
refused line is also passed to ``on_refused`` (the worker journals it); a connection that hangs up
without a word (``attach`` probing whether anyone serves the socket) is no refused line.

Before its hello a connection has ``HELLO_TIMEOUT_S`` in all to send it, and at most
``MAX_AWAITING_HELLO`` connections wait for theirs at once: each holds a thread and a descriptor, so a
burst of idle connections must not exhaust either. A new connection takes the place of the oldest one
waiting, which is told so and closed: idle connections, however many and however long they are kept,
never keep out the app, whose hello comes at once.

Whatever goes wrong serving one connection, a fault of ours included, is that connection's end (or that
command's refusal), said as one refused line: never a dead thread, a traceback, or a peer left waiting.

Standard library only, plus the protocol: what a command *does* is the ``on_command`` callback's
business (the worker maps commands onto the trainer).
"""

from __future__ import annotations

import hmac
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

from torchlab.core.errors import shown
from torchlab.core.wire.line_reader import LineReader
from torchlab.core.wire.outbox import Cursor, Outbox
from torchlab.core.wire.protocol import (
    MAX_LINE_BYTES,
    PROTOCOL_VERSION,
    Hello,
    Message,
    ProtocolError,
    Refused,
    Welcome,
    decode,
    fault,
)
from torchlab.core.wire.runtime import listen_privately

HELLO_TIMEOUT_S = 5.0
MAX_VIEWERS = 32
#: What a viewer's command is answered with (its app refuses the keys itself; this is for any other client).
READ_ONLY = "this is a read-only view of the run: commands come from the app that controls it"
MAX_AWAITING_HELLO = 64
#: What the oldest connection awaiting its hello is told when a new one takes its place.
DROPPED_FOR_A_NEWER = (f"closed before a hello came: at most {MAX_AWAITING_HELLO} connections wait for theirs, "
                       "and a newer one took this one's place; connect again and say hello at once")
#: How long the accept loop waits after ``accept`` failed for want of descriptors or memory (EMFILE and
#: the like): the connections holding them end within HELLO_TIMEOUT_S, and then the app can connect again.
ACCEPT_RETRY_S = 0.1
SEND_TIMEOUT_S = 10.0
#: Reports gather this long between two sends to one app (an event goes at once). The app reads at
#: 20 Hz, so this delays nothing it shows; at 300 steps/s it is 50 messages a second instead of 300,
#: and at 50k reports/s the app decoded and folded ~200 small batches a second, each with its overhead.
GATHER_S = 0.02


class ControlServer:
    """Serves ``socket_path`` until ``close()``.

    ``welcome`` is called for each authenticated client and blocks until the run can describe itself
    (the trainer is built); ``on_command`` receives every later command of the controlling client, from its
    hello on (while its Welcome waits: the worker queues them for the trainer), detach included (the
    worker decides whether to accept it), with the name the client gave in its hello (``Hello.client``);
    ``on_client_attached()`` once the controlling client said its hello and ``on_client_gone()`` when it
    leaves, whichever way; ``on_refused(reason, before_hello)`` after each refusal was answered (on
    a connection's thread, or the accept loop's: it must not block, nor raise).
    """

    def __init__(
        self,
        socket_path: Path,
        token: str,
        outbox: Outbox,
        *,
        welcome: Callable[[], Welcome | None],
        on_command: Callable[[Message, str], None],
        on_client_gone: Callable[[], None],
        on_client_attached: Callable[[], None] = lambda: None,
        on_refused: Callable[[str, bool], None] = lambda reason, before_hello: None,
    ) -> None:
        self.socket_path = Path(socket_path)
        self._token = token
        self._outbox = outbox
        self._welcome = welcome
        self._on_command = on_command
        self._on_client_gone = on_client_gone
        self._on_client_attached = on_client_attached
        self._on_refused = on_refused
        # Connections accepted whose hello has not been read yet, oldest first (a dict kept as an ordered set),
        # and those of them dropped for a newer one, until their threads have seen it.
        self._awaiting: dict[socket.socket, None] = {}
        self._dropped: set[socket.socket] = set()
        self._awaiting_lock = threading.Lock()
        self._controller: socket.socket | None = None
        self._controller_lock = threading.Lock()  # and the viewers, and the senders list
        self._viewers: set[socket.socket] = set()
        self._closed = threading.Event()
        self._senders: list[threading.Thread] = []
        self._first_client_served = threading.Event()
        self._listener = self._listen()
        self._accept_thread = threading.Thread(target=self._accept_loop, name="torchlab-accept", daemon=True)
        self._accept_thread.start()

    def _listen(self) -> socket.socket:
        if self.socket_path.exists():
            self.socket_path.unlink()
        listener = listen_privately(self.socket_path, socket.SOMAXCONN)  # a burst (a scan, say) must not crowd out the app
        listener.settimeout(0.25)
        return listener

    def close(self) -> None:
        self._closed.set()
        self._outbox.close()
        self._listener.close()
        with self._controller_lock:
            for connection in [self._controller, *self._viewers]:
                if connection is not None:
                    _shutdown(connection)
        try:
            self.socket_path.unlink()
        except FileNotFoundError:
            pass

    def wait_for_first_client(self, timeout_s: float) -> bool:
        """Wait until some app has been welcomed (so an early failure still reaches it)."""
        return self._first_client_served.wait(timeout_s)

    def flush(self, timeout_s: float) -> None:
        """After ``outbox.close()``: wait up to ``timeout_s`` for senders to deliver what is left."""
        deadline = time.monotonic() + timeout_s
        with self._controller_lock:
            senders = list(self._senders)
        for sender in senders:
            sender.join(max(0.0, deadline - time.monotonic()))

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._closed.is_set():  # the listener was closed
                    return
                # Out of descriptors or memory (EMFILE, ENFILE, ENOBUFS): this connection is lost, but the
                # socket must go on serving, or the app could never attach again.
                self._closed.wait(ACCEPT_RETRY_S)
                continue
            self._await_hello(connection)
            try:
                threading.Thread(target=self._serve, args=(connection,), name="torchlab-connection", daemon=True).start()
            except RuntimeError as error:  # no thread to be had (the process's limit): this one is lost, not the socket
                self._settle(connection)
                connection.setblocking(False)  # this thread accepts for everyone: it never waits on one peer
                self._refuse(connection, f"no thread to serve this connection ({fault(error)}); try again", before_hello=True)

    def _await_hello(self, connection: socket.socket) -> None:
        """Count ``connection`` among those awaiting their hello; if that makes too many, drop the oldest. Its
        thread, reading, sees the end of its input at once and says why (this thread accepts for everyone: it
        never waits on one peer)."""
        with self._awaiting_lock:
            if len(self._awaiting) >= MAX_AWAITING_HELLO:
                oldest = next(iter(self._awaiting))
                del self._awaiting[oldest]
                self._dropped.add(oldest)
                try:
                    oldest.shutdown(socket.SHUT_RD)
                except OSError:
                    pass  # its peer is gone already: its thread is ending
            self._awaiting[connection] = None

    def _settle(self, connection: socket.socket) -> bool:
        """``connection`` awaits its hello no longer; whether it was dropped for a newer one."""
        with self._awaiting_lock:
            self._awaiting.pop(connection, None)
            dropped = connection in self._dropped
            self._dropped.discard(connection)
        return dropped

    def _was_dropped(self, connection: socket.socket) -> bool:
        with self._awaiting_lock:
            return connection in self._dropped

    def _serve(self, connection: socket.socket) -> None:
        try:
            hello = self._read_hello(connection)
        except Exception as error:  # a fault of ours that this peer's line met: it is refused, the socket serves on
            self._refuse(connection, f"this connection failed: {fault(error)}", before_hello=True)
            hello = None
        finally:
            dropped = self._settle(connection)
        if hello is not None and dropped:  # its hello came as it was dropped: it can be read from no more
            self._refuse(connection, DROPPED_FOR_A_NEWER, before_hello=True)
            return
        if hello is None:
            return
        reader, said = hello
        try:
            if said.view:
                self._serve_viewer(connection, reader)
            else:
                self._serve_app(connection, reader, said.client)
        except Exception as error:  # each cleans up after itself on the way out; the peer is told, the run journals it
            self._refuse(connection, f"this connection failed: {fault(error)}", before_hello=False)

    def _read_hello(self, connection: socket.socket) -> tuple[LineReader, Hello] | None:
        """The reader of a connection that said a hello with this run's token, and that hello (whether it asked to
        view only, the client's name), or None (refused, closed)."""
        reader = LineReader(connection, MAX_LINE_BYTES)
        try:
            hello = decode(reader.next_line(deadline=time.monotonic() + HELLO_TIMEOUT_S))
        except (ProtocolError, OSError, EOFError) as error:
            if self._was_dropped(connection):  # its input was ended here, for a newer connection
                self._refuse(connection, DROPPED_FOR_A_NEWER, before_hello=True)
            elif isinstance(error, EOFError) and not reader.received:  # a probe: it said nothing, so nothing was refused
                _refuse(connection, f"expected a hello with a token first: {error}")
            else:
                self._refuse(connection, f"expected a hello with a token first: {error}", before_hello=True)
            return None
        if not isinstance(hello, Hello):
            self._refuse(connection, f"the first message must be hello, not {hello.type}", before_hello=True)
            return None
        if hello.version != PROTOCOL_VERSION:
            self._refuse(connection, f"protocol version {shown(hello.version)} is not supported; this trainer speaks {PROTOCOL_VERSION}",
                         before_hello=True)
            return None
        if not hmac.compare_digest(hello.token.encode(), self._token.encode()):
            self._refuse(connection, "wrong token: this run's token file is readable only by the user who started it", before_hello=True)
            return None
        return reader, hello

    def _serve_app(self, connection: socket.socket, reader: LineReader, client: str) -> None:
        with self._controller_lock:
            taken = self._controller is not None
            if not taken:
                self._controller = connection
        if taken:
            self._refuse(connection, "another app is already attached to this run", before_hello=True)
            return
        try:
            # Its commands are read from its hello on, while the Welcome waits for the trainer to be built: keys
            # typed as the app's screen shows reach the trainer's queue in the order typed, before its first step.
            # The Welcome goes from a thread of its own, without a timeout on the socket (it would end the reads).
            self._on_client_attached()
            connection.settimeout(None)
            threading.Thread(target=self._welcome_app, args=(connection,), name="torchlab-welcome", daemon=True).start()
            self._read_commands(connection, reader, client)
        except OSError:
            pass  # the client vanished mid-handshake; it is treated as gone below
        finally:
            with self._controller_lock:
                self._controller = None
            _shutdown(connection)
            if not self._closed.is_set():
                self._on_client_gone()

    def _welcome_app(self, connection: socket.socket) -> None:
        """The controlling app's Welcome and stream, once the run can describe itself; a connection that cannot be
        welcomed is shut down, which ends its reads (``_serve_app`` then treats the app as gone)."""
        try:
            _limit_sends(connection, SEND_TIMEOUT_S)  # its reads wait as long as the app types nothing; its sends do not
            welcomed = self._welcome_and_stream(connection, send_timeout_s=None)
        except OSError:  # the app left before the trainer was built
            welcomed = False
        if welcomed:
            self._first_client_served.set()
        else:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed already, by its reader

    def _serve_viewer(self, connection: socket.socket, reader: LineReader) -> None:
        with self._controller_lock:
            admitted = len(self._viewers) < MAX_VIEWERS
            if admitted:
                self._viewers.add(connection)
        if not admitted:
            self._refuse(connection, f"too many viewers of this run (at most {MAX_VIEWERS})", before_hello=True)
            return
        try:
            if not self._welcome_and_stream(connection):
                return
            connection.settimeout(None)
            while not self._closed.is_set():
                try:
                    reader.next_line()
                except (EOFError, OSError):
                    return
                except ProtocolError:
                    pass  # an over-long line: refused below like any other
                _send_quietly(connection, Refused(reason=READ_ONLY))
        except OSError:
            pass
        finally:
            with self._controller_lock:
                self._viewers.discard(connection)
            _shutdown(connection)

    def _welcome_and_stream(self, connection: socket.socket, send_timeout_s: float | None = SEND_TIMEOUT_S) -> bool:
        """Send the Welcome, then the stream from the Outbox on a sender thread (``flush`` waits for it, so a
        viewer gets the run's end too); False when the run cannot describe itself or the server is closing."""
        welcome = self._welcome()
        if welcome is None or self._closed.is_set():
            return False
        connection.settimeout(send_timeout_s)
        connection.sendall(welcome.encode())
        sender = threading.Thread(target=self._send_loop, args=(connection,), name="torchlab-sender", daemon=True)
        sender.start()
        with self._controller_lock:  # connections are served on threads of their own
            # Those of connections gone are let go: a run watched for weeks by viewers that come and go kept one each.
            self._senders = [*(thread for thread in self._senders if thread.is_alive()), sender]
        return True

    def _read_commands(self, connection: socket.socket, reader: LineReader, client: str) -> None:
        """Dispatch commands, with the name the client gave in its hello, until the client leaves."""
        while not self._closed.is_set():
            try:
                line = reader.next_line()
            except (EOFError, OSError):
                return
            except ProtocolError as error:
                # An over-long line. Closing the connection, as before the hello, would be the app going
                # away, which stops the run: refused, and the reader skips to the line's end.
                _send_quietly(connection, Refused(reason=str(error)))
                self._on_refused(str(error), False)
                continue
            try:
                command = decode(line)
            except ProtocolError as error:
                _send_quietly(connection, Refused(reason=str(error)))
                self._on_refused(str(error), False)
                continue
            try:
                self._on_command(command, client)  # detach too: whether to accept it is the worker's decision
            except Exception as error:  # a fault of ours acting on it: this command is refused, the app stays attached
                reason = f"this command failed: {fault(error)}"
                _send_quietly(connection, Refused(reason=reason))
                self._on_refused(reason, False)

    def _refuse(self, connection: socket.socket, reason: str, *, before_hello: bool) -> None:
        """Answer with the reason, close the connection, and pass the refusal on."""
        _refuse(connection, reason)
        self._on_refused(reason, before_hello)

    def _send_loop(self, connection: socket.socket) -> None:
        cursor = Cursor()
        try:
            connection.sendall(b"".join(message.encode() for message in self._outbox.take_past(cursor)))
        except OSError:
            _shutdown(connection)
            return
        while True:
            messages = self._outbox.take(cursor, timeout=0.5)
            if messages is None:
                return
            if not messages:
                if connection.fileno() < 0:  # closed by its reader (the client left) while the run said nothing new
                    return
                continue
            try:
                connection.sendall(b"".join(message.encode() for message in messages))
            except OSError:  # the client went away or stopped reading for SEND_TIMEOUT_S
                _shutdown(connection)
                return
            self._outbox.wait_for_event(cursor, GATHER_S)


def _limit_sends(connection: socket.socket, seconds: float) -> None:
    """A send on ``connection`` that waits ``seconds`` for a client that stopped reading fails (OSError), as a
    socket timeout would make it, while a read waits as long as it must: the controlling app's socket is read by
    one thread (its commands) and written by another (the stream), and ``settimeout`` would time out both."""
    whole = int(seconds)
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                          struct.pack("ll", whole, int((seconds - whole) * 1_000_000)))


def _refuse(connection: socket.socket, reason: str) -> None:
    _send_quietly(connection, Refused(reason=reason))
    _shutdown(connection)


def _send_quietly(connection: socket.socket, message: Message) -> None:
    """Best effort: a client that is gone cannot be told anything more."""
    try:
        connection.sendall(message.encode())
    except OSError:
        pass


def _shutdown(connection: socket.socket) -> None:
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed by the peer
    connection.close()
