"""The app's link to its trainer process: start it, speak the protocol, stop it.

The app calls ``start()`` from its main thread: the worker's parent-death signal follows the thread
that spawned it, so spawning from a short-lived worker thread would kill the trainer when that thread
ends. The child runs in its own session (terminal Ctrl-C and hang-ups go to the app, which decides),
with stdout and stderr in ``trainer.log`` in the run directory so it never draws over the app.

A reader thread connects (retrying while the trainer starts), decodes events and appends them to a
buffer; the app drains that buffer on a timer. The reader never touches the UI. When the process
ends without having said why, the link adds an ``Error`` event naming its exit code or signal.
Commands sent while it connects wait, in the order sent, and go right after the hello: the trainer queues
them for its first step boundary (keys typed as the app's screen shows, before torch has loaded).

``ProcessLink.attach`` makes a link to a trainer that is already running (detached earlier, listed
by ``torchlab-tui attach``): no process is spawned, and closing it stops that trainer the same way.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from torchlab.core.records.storage import create_file
from torchlab.core.safe_open import UnsafeFileError, read_regular_bytes
from torchlab.core.wire.control_server import HELLO_TIMEOUT_S
from torchlab.core.options import OPTIONS_BY_NAME
from torchlab.core.wire.protocol import (
    PROTOCOL_VERSION,
    DetachCommand,
    Detached,
    Error,
    Hello,
    Log,
    LogLevel,
    Message,
    Metrics,
    OtherVersion,
    Refused,
    ProtocolError,
    State,
    StopCommand,
    Welcome,
    decode,
)
from torchlab.core.wire.run_status import FINAL_STATES, RunStatus
from torchlab.core.wire.runtime import Endpoint, RunEntry, process_running

CONNECT_TIMEOUT_S = 120.0  # the first import of torch on a cold disk can be slow
STOP_GRACE_S = 30.0  # time for the current step and the final checkpoint
MAX_BUFFERED_MESSAGES = 100_000


class ProcessLink:
    """A trainer child process for ``run_dir``, trained with ``training_args`` (the CLI's flags)."""

    def __init__(
        self,
        run_dir: Path,
        training_args: list[str],
        *,
        python: str = sys.executable,
        worker_module: str = "torchlab.core.launch.worker",
    ) -> None:
        self.run_dir = Path(run_dir)
        self.worker_module = worker_module  # benchmarks substitute a synthetic trainer
        self.log_path = self.run_dir / "trainer.log"
        self.training_args = list(training_args)
        self.python = python
        self.process: subprocess.Popen | None = None
        self._endpoint: Endpoint | None = None
        self._socket: socket.socket | None = None
        self._send_lock = threading.Lock()
        self._buffer: deque[Message] = deque(maxlen=MAX_BUFFERED_MESSAGES)
        self._buffer_lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self._closing = False
        self._final_state_seen = False
        self._attached_pid: int | None = None  # the trainer's pid when attached rather than spawned
        self._on_detached = lambda: None  # detach_and_wait's signal
        self._welcomed = False
        #: a reader thread is connecting: commands sent meanwhile wait in ``_typed_ahead`` (under ``_send_lock``)
        self._connecting = False
        self._typed_ahead: list[Message] = []
        #: why the trainer turned this link away before welcoming it (another app is attached), if it did
        self.refused: str | None = None
        #: set whenever an event arrives (for code that waits on the link outside a UI timer)
        self.arrived = threading.Event()
        #: the newest step the trainer reported: what a trainer that died without a word had reached
        self.last_step = 0
        #: a read-only viewer (``attach``): its app refuses the keys that change the run
        self.view = False
        #: the size of ``log_path`` when this link spawned or found its trainer: what lies before is not news
        self.log_start = 0

    @classmethod
    def attach(cls, entry: RunEntry, *, view: bool = False) -> ProcessLink:
        """A link to the running trainer of ``entry``; ``start()`` connects to it instead of spawning one.
        ``view``: a read-only viewer, beside the app that controls the run; it sends nothing, and closing it
        only disconnects."""
        link = cls(Path(entry.info["run_dir"]), list(entry.info.get("training_args") or []))
        link._endpoint = entry.endpoint
        link._attached_pid = entry.info["pid"]
        link.view = view
        return link

    # ------------------------------------------------------------------ app-facing API
    def start(self) -> None:
        """Spawn the trainer (or, attached, find it) and begin connecting; returns at once. Main thread only."""
        self.log_start = _size(self.log_path)
        if self._attached_pid is not None:
            self._closing = False
            self._start_reader()
            return
        self._spawn(self.training_args)

    def _start_reader(self) -> None:
        with self._send_lock:
            self._connecting, self._typed_ahead = True, []
        self._reader = threading.Thread(target=self._read_events, name="torchlab-link-reader", daemon=True)
        self._reader.start()

    def _spawn(self, training_args: list[str]) -> None:
        self.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # private, unless the CLI made it shared already
        self._endpoint = Endpoint.create(f"{self.run_dir.name[:40]}-{secrets.token_hex(3)}")
        self._closing = False
        self._final_state_seen = False
        with open(self.log_path, "ab", opener=create_file) as log:  # as private as the run directory
            self.process = subprocess.Popen(
                [
                    self.python, "-m", self.worker_module,
                    "--run-dir", str(self.run_dir),
                    "--socket", str(self._endpoint.socket_path),
                    "--token-file", str(self._endpoint.token_path),
                    "--", *training_args,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._start_reader()

    def restart(self, resume: bool = True, options: dict[str, Any] | None = None) -> None:
        """After the trainer ended: start a new one in the same run directory, from its last checkpoint.

        ``--resume RUN_DIR``: the checkpoint holds the run's whole configuration and its live options as they
        were, which the flags the run was started with would override. ``options`` (set on the error screen)
        go with it as their flags, in force from the restart's first step (the trainer journals them as
        ``resume_changed_settings``). With no checkpoint yet, the run starts again from its first flags and these."""
        self.close()
        self._attached_pid = None  # an attached app restarts the run as its own child
        checkpoint = last_checkpoint(self.run_dir / "checkpoints") if resume else None
        # The new trainer starts at its checkpoint's step: killed before it reports, that is how far it got.
        self.last_step = (checkpoint[1] or 0) if checkpoint is not None else 0
        flags = [word for name, value in (options or {}).items() for word in OPTIONS_BY_NAME[name].flag_arguments(value)]
        if checkpoint is not None:
            self._spawn(["--resume", str(self.run_dir), *flags])
        else:
            self._spawn([*self.training_args, *flags])

    def restart_point(self) -> str | None:
        """What ``restart`` resumes from, as the user knows it ("step-0000550.pt, step 550"), or None when
        there is no checkpoint yet (a restart starts the run over)."""
        checkpoint = last_checkpoint(self.run_dir / "checkpoints")
        if checkpoint is None:
            return None
        name, step = checkpoint
        return name if step is None else f"{name}, step {step}"

    @property
    def trainer_exit_code(self) -> int | None:
        """The spawned trainer's exit status once it has ended (2: it refused its input); None while it
        runs, or for a trainer this app attached to."""
        if self._attached_pid is not None or self.process is None:
            return None
        return self.process.poll()

    def drain(self) -> list[Message]:
        with self._buffer_lock:
            messages = list(self._buffer)
            self._buffer.clear()
        return messages

    def send(self, command: Message) -> None:
        """Send a command; while the link connects it waits, in order, and goes right after the hello; if the
        trainer is not connected, the app is told so through a log event."""
        with self._send_lock:
            connection = self._socket
            if connection is None and self._connecting:
                self._typed_ahead.append(command)
                return
            if connection is None:
                self._push(Log(level=LogLevel.ERROR, text=f"{command.type}: the trainer is not connected"))
                return
            try:
                connection.sendall(command.encode())
            except OSError as error:  # the run has not failed: the app says the command did not arrive
                self._push(Log(level=LogLevel.ERROR, text=f"{command.type}: could not reach the trainer ({error})"))

    def close(self, *, detach: bool = False, grace_s: float = STOP_GRACE_S) -> int | None:
        """Stop the trainer (it writes a final checkpoint) and wait for it; returns its exit code.

        A trainer that has said how its run ended (finished, failed) is on its way out: it is waited for,
        not signalled. A SIGTERM then could land while its interpreter shuts down, when no handler is left,
        and its exit status would read "killed by SIGTERM" instead of the run's outcome (2 for bad input).

        With ``detach`` (after the trainer acknowledged the detach) only the connection closes: the
        trainer goes on, and its socket and token stay for the next ``attach``.
        """
        self._closing = True
        if self._attached_pid is not None:
            return self._close_attached(detach or self.view, grace_s)  # a viewer never stops the run
        process = self.process
        if process is None:
            return None
        if process.poll() is None and not detach:
            if not self._send_now(StopCommand()) and not self._final_state_seen:
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(grace_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._disconnect()
        if self._reader is not None:
            self._reader.join(timeout=2.0)
        if self._endpoint is not None and not detach:
            self._endpoint.remove()
        return process.returncode

    def detach_and_wait(self, timeout_s: float = 3.0) -> bool:
        """Ask the trainer to go on alone and wait for its yes (a hang-up: the app is about to vanish)."""
        acknowledged = threading.Event()
        self._on_detached = acknowledged.set
        return self._send_now(DetachCommand()) and acknowledged.wait(timeout_s)

    @property
    def endpoint_name(self) -> str | None:
        """The run's name in the runtime directory: what ``torchlab-tui attach NAME`` takes."""
        return self._endpoint.name if self._endpoint is not None else None

    @property
    def attached(self) -> bool:
        """The trainer was running before this link found it (``attach``): it trains already, it does not start."""
        return self._attached_pid is not None

    @property
    def pid(self) -> int | None:
        if self._attached_pid is not None:
            return self._attached_pid
        return self.process.pid if self.process else None

    def _send_now(self, command: Message) -> bool:
        """Send ``command``; False when there is no connection or it failed (the caller has a fallback)."""
        connection = self._socket
        if connection is None:
            return False
        try:
            with self._send_lock:
                connection.sendall(command.encode())
        except OSError:
            return False
        return True

    def _close_attached(self, detach: bool, grace_s: float) -> None:
        """Not our child: stop it through the socket (or SIGTERM) and watch its pid go away."""
        pid = self._attached_pid
        if not detach and process_running(pid):
            if not self._send_now(StopCommand()) and not self._final_state_seen:
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while process_running(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        self._disconnect()
        if self._reader is not None:
            self._reader.join(timeout=2.0)
        if not detach and not process_running(pid):
            self._endpoint.remove()
        return None

    # ------------------------------------------------------------------ reader thread
    def _read_events(self) -> None:
        connection = self._connect()
        self._connected(connection)
        if connection is not None:
            buffer = bytearray()
            while True:
                try:
                    chunk = connection.recv(65536)
                except OSError:
                    break
                if not chunk:
                    break
                buffer += chunk
                if b"\n" not in chunk:  # the middle of a long line: nothing to split yet
                    continue
                *lines, rest = buffer.split(b"\n")
                buffer = bytearray(rest)
                for line in lines:
                    self._accept_line(line)
            self._socket = None
        self._report_exit()

    def _connect(self) -> socket.socket | None:
        """Connect and say hello, retrying while the trainer starts; None if it died first."""
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while time.monotonic() < deadline and not self._closing:
            if not self._trainer_alive():
                return None
            connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                connection.connect(str(self._endpoint.socket_path))
            except (FileNotFoundError, ConnectionRefusedError):
                connection.close()
                time.sleep(0.05)
                continue
            connection.settimeout(HELLO_TIMEOUT_S)
            connection.sendall(Hello(version=PROTOCOL_VERSION, token=self._endpoint.read_token(), view=self.view).encode())
            connection.settimeout(None)
            return connection
        return None

    def _connected(self, connection: socket.socket | None) -> None:
        """The connection is made (or cannot be): the commands sent meanwhile go first, in order, then any sent
        from now on; with no connection they are not sent, and the app is told so."""
        with self._send_lock:
            waiting, self._typed_ahead, self._connecting = self._typed_ahead, [], False
            if connection is None:
                if waiting and not self._closing:
                    self._push(Log(level=LogLevel.ERROR, text=f"{', '.join(c.type for c in waiting)}: not sent, the trainer "
                                                       f"ended before it connected"))
                return
            try:
                for command in waiting:
                    connection.sendall(command.encode())
            except OSError as error:
                self._push(Log(level=LogLevel.ERROR, text=f"{command.type}: could not reach the trainer ({error})"))
            self._socket = connection

    def _accept_line(self, line: bytes) -> None:
        try:
            message = decode(line)
        except ProtocolError as error:
            if isinstance(error, OtherVersion) and not self._welcomed:  # a run of another release: fine, not ours
                pid = "PID" if self._attached_pid is None else str(self._attached_pid)
                self.refused = error.sentence("the run", "attached").replace("kill PID", f"kill {pid}")
                return
            self._push(Error(message=f"the trainer sent a message this app cannot read: {error}", traceback="", step=0))
            return
        step = (message.columns.get("step") or [None])[-1] if isinstance(message, Metrics) else getattr(message, "step", None)
        if isinstance(message, (State, Welcome, Metrics)) and isinstance(step, int) and not isinstance(step, bool):
            self.last_step = step
        match message:
            case State() if message.state in FINAL_STATES:
                self._final_state_seen = True
            case Detached():
                self._on_detached()
            case Welcome():
                self._welcomed = True
            case Refused() if not self._welcomed:
                self.refused = message.reason
        self._push(message)

    def _trainer_alive(self) -> bool:
        if self._attached_pid is not None:
            return process_running(self._attached_pid)
        return self.process.poll() is None

    def _report_exit(self) -> None:
        """The connection ended: if the process died without a final state, say how it died."""
        if self._attached_pid is not None:
            if self.refused is not None:  # the run is fine, this app may not have it: leave, saying why
                self._push(Log(level=LogLevel.ERROR, text=f"could not attach: {self.refused}"))
                self._push(State(state=RunStatus.DETACHED, step=0, detail=self.refused))
            elif not (self._closing or self._final_state_seen):
                cause = "is gone (it ended without a word: killed?)" if not process_running(self._attached_pid) else "closed the connection"
                self._report_trainer_lost(self._attached_pid, cause)
            return
        process = self.process
        try:
            code = process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            return
        if self._closing or self._final_state_seen:
            return
        self._endpoint.remove()  # it died without tidying up (kill -9): nothing of it is left for attach to list
        self._report_trainer_lost(process.pid, f"was killed by signal {code_name(-code)}" if code < 0 else f"exited with code {code}")

    def _report_trainer_lost(self, pid: int, cause: str) -> None:
        """The trainer ended without saying how: a failure at the last step it reported."""
        self._push(Error(
            message=f"the trainer process (pid {pid}) {cause} after step {self.last_step}; see {self.log_path}",
            traceback=_tail(self.log_path),
            step=self.last_step,
        ))
        self._push(State(state=RunStatus.FAILED, step=self.last_step, detail=cause))

    def _push(self, message: Message) -> None:
        with self._buffer_lock:
            self._buffer.append(message)
        self.arrived.set()

    def _disconnect(self) -> None:
        connection = self._socket
        if connection is not None:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # the trainer already closed it
            connection.close()


_STEP_FILE = re.compile(r"step-(\d+)\.pt")


def last_checkpoint(checkpoints: Path) -> tuple[str, int | None] | None:
    """``last.pt``'s checkpoint: the step file it is a hard link to and its step (``("step-0000550.pt", 550)``),
    told from the file names alone, as this process never imports torch; ``("last.pt", None)`` when no step
    file is that file; None when there is no ``last.pt`` (a resume would have nothing to start from)."""
    try:
        last = (checkpoints / "last.pt").stat()
    except OSError:
        return None
    for candidate in checkpoints.glob("step-*.pt"):
        step_file = _STEP_FILE.fullmatch(candidate.name)
        try:
            if step_file is not None and os.path.samestat(candidate.stat(), last):
                return candidate.name, int(step_file.group(1))
        except OSError:  # removed since the listing (pruned)
            continue
    return "last.pt", None


def code_name(signum: int) -> str:
    try:
        return f"{signum} ({signal.Signals(signum).name})"
    except ValueError:
        return str(signum)


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        data = read_regular_bytes(path)
    except (OSError, UnsafeFileError):  # nothing to show beside the message that names the file
        return ""
    return data[-limit:].decode("utf-8", errors="replace")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
