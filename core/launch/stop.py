"""``torchlab-tui stop [RUN]``: stop a running run as ``q`` in its app would: at its next step boundary, with
a final checkpoint, and say where that checkpoint is.

RUN is found as ``attach`` finds it (a name or a unique prefix, a run directory, or with none the one live run).
``stop`` is a client of the run's socket like the app: a hello with the run's token (readable only by the user
who started it) and its own name (the run journals who stopped it), as the one app that controls the run, then
the stop command; it reads the run's events until
the trainer closes the connection, and waits for its process to end. A step can be long (a large model, a
compile): every ``PROGRESS_S`` it says where the run is, and after ``STOP_WAIT_S`` it gives up waiting (the run
still stops: the stop was asked, and its controlling client has gone).

Exit codes: 0 the run stopped; 1 it was not running (ended, or no live run) or did not stop in time; 2 bad input
or a refusal (an app already controls the run, a name that matches several runs, an unsafe runtime directory).

Standard library only: no torch, no app.
"""

from __future__ import annotations

import errno
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from torchlab.core.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, TorchlabError
from torchlab.core.launch.arguments import command_parser
from torchlab.core.launch.attach import live_runs, report_ended
from torchlab.core.wire.line_reader import LineReader
from torchlab.core.wire.protocol import (
    MAX_LINE_BYTES,
    PROTOCOL_VERSION,
    OtherVersion,
    CheckpointSaved,
    Error,
    Hello,
    Metrics,
    ProtocolError,
    Refused,
    State,
    StopCommand,
    Welcome,
    decode,
)
from torchlab.core.wire.run_status import FINAL_STATES, RunStatus
from torchlab.core.errors import printable
from torchlab.core.wire.runtime import RunEntry, find_run, list_runs, process_running

#: The name ``stop`` gives in its hello: the run's journal and event log say it was "stopped by `torchlab-tui stop`".
STOP_CLIENT = "torchlab-tui stop"
#: How long ``stop`` waits for the run to end, and how often it says it is still waiting.
STOP_WAIT_S = 300.0
PROGRESS_S = 10.0
#: How long the trainer has to answer the hello (its control server allows a client 5 s to send one).
WELCOME_TIMEOUT_S = 10.0
#: After the trainer closed the connection, how long its process has to exit (it flushes and removes its files).
EXIT_GRACE_S = 10.0


class NotRunning(LookupError):
    """No live run answers to what was asked; the message says so (exit 1)."""


class StopRefused(Exception):
    """The run would not take a stop from here (another app controls it, say); the message says why (exit 2)."""


@dataclass
class Ending:
    """What the run said while it stopped: its last state and step, its last checkpoint, and the error that ended it
    (a hung run that a stop ended says so: core/engine/parallel/hang_watch.py)."""

    state: str = RunStatus.RUNNING
    step: int = 0
    checkpoint: str | None = None
    error: str = ""


def main(argv: list[str]) -> int:
    parser = command_parser("stop")
    parser.add_argument("run", nargs="?", help="the run's name (or a unique prefix) or its run directory; default: the one live run")
    args = parser.parse_args(argv)
    try:
        entry = running_run(args.run)
        return stop(entry)
    except NotRunning as error:
        print(f"torchlab-tui stop: {printable(error.args[0])}", file=sys.stderr)
        return EXIT_FAILED
    except (StopRefused, LookupError, TorchlabError) as error:  # several runs match; an unsafe runtime directory
        print(f"torchlab-tui stop: {printable(error.args[0] if isinstance(error, LookupError) else error)}", file=sys.stderr)
        return EXIT_USAGE


def running_run(selector: str | None) -> RunEntry:
    """The live run ``selector`` names (as ``attach`` takes it), or with none the one live run; NotRunning if none is."""
    if selector is None:
        live = live_runs(list_runs())
        if not live:
            raise NotRunning("no run is running; `torchlab-tui attach` lists your runs.")
        if len(live) > 1:
            raise LookupError(f"{len(live)} runs are running ({', '.join(entry.endpoint.name for entry in live)}); "
                              "name one: torchlab-tui stop NAME")
        return live[0]
    try:
        entry = find_run(selector)
    except LookupError:
        if _is_folder(selector):  # a run directory whose run ended, and whose entry attach has already reported
            raise NotRunning(f"{selector} is not running in an app (no app's or detached run has that run directory); "
                             f"a --headless run stops at its next step with a checkpoint on Ctrl-C in its terminal or "
                             f"`kill -TERM` of its process.") from None
        raise
    if entry.ended:
        raise NotRunning(f"not running: {report_ended(entry)}")
    return entry


def _is_folder(selector: str) -> bool:
    """Whether ``selector`` is a folder (a run directory whose run has ended); LookupError, saying why, where it
    cannot be looked into: another user's run directory is private to them (0700), and so is their run."""
    try:
        return Path(selector).is_dir()
    except OSError as error:
        private = error.errno in (errno.EACCES, errno.EPERM)
        raise LookupError(
            f"no run of yours has the run directory {selector}, which cannot be looked into "
            f"({error.strerror or error})" + (": a run directory is private to the user who started it, and only they "
                                              "(or root) can stop its run" if private else "")
            + ". `torchlab-tui attach` lists your runs.") from None


def stop(entry: RunEntry) -> int:
    name = printable(entry.endpoint.name)
    if entry.info.get("attached"):
        raise StopRefused(f"an app controls {name}: press q there (it stops the run, with a final checkpoint), "
                          f"or detach it with d and run `torchlab-tui stop {name}` again.")
    ending = Ending(step=int(entry.info.get("step") or 0))
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            connection.settimeout(WELCOME_TIMEOUT_S)
            connection.connect(str(entry.endpoint.socket_path))
            connection.sendall(Hello(version=PROTOCOL_VERSION, token=entry.endpoint.read_token(), client=STOP_CLIENT).encode())
            reader = LineReader(connection, MAX_LINE_BYTES)
            welcome = _answer(reader, ending, time.monotonic() + WELCOME_TIMEOUT_S, name, entry.info.get("pid"))
            if welcome.state in FINAL_STATES:
                raise NotRunning(f"{name} is not running: {welcome.state} at step {welcome.step}.")
            connection.sendall(StopCommand().encode())  # the run words the reason itself, from the hello's name
            print(f"Stopping {name} (at step {ending.step}): it writes its final checkpoint once its step ends (a step that "
                  "hangs ends at once, without one).",
                  file=sys.stderr, flush=True)
        except (ConnectionRefusedError, FileNotFoundError, EOFError):
            raise NotRunning(f"{name} is not running (its trainer does not answer on its socket).") from None
        except OSError as error:  # a timeout, a trainer too busy to answer: not stopped from here
            raise NotRunning(f"{name} did not answer on its socket ({error.strerror or error}); "
                             f"`torchlab-tui attach {name}` shows where it is.") from None
        if not _until_closed(reader, ending, name):
            print(f"torchlab-tui stop: {name} has not stopped after {STOP_WAIT_S:.0f} s (at step {ending.step}): it stops "
                  f"at the end of its step. `torchlab-tui attach {name}` shows where it is.", file=sys.stderr)
            return EXIT_FAILED
    finally:
        connection.close()
    return _report(entry, ending)


def _answer(reader: LineReader, ending: Ending, deadline: float, name: str, pid: object = None) -> Welcome:
    """The trainer's answer to the hello: its Welcome, or StopRefused saying why it refused (or why it cannot be read:
    a run that another release of torchlab-tui started)."""
    try:
        message = decode(reader.next_line(deadline=deadline))
    except OtherVersion as error:
        raise StopRefused(error.sentence(name, "stopped").replace("kill PID", f"kill {pid}" if pid else "kill PID")) from None
    match message:
        case Welcome():
            ending.state, ending.step = message.state, message.step
            return message
        case Refused():
            raise StopRefused(f"{name} refused the stop: {message.reason}")
        case _:
            raise StopRefused(f"{name} answered with {message.type}, not a welcome: is it a torchlab run of this version?")


def _until_closed(reader: LineReader, ending: Ending, name: str) -> bool:
    """Read the run's events (its history first, then what it does) into ``ending`` until the trainer closes
    the connection; False if it has not within ``STOP_WAIT_S``."""
    started = time.monotonic()
    next_word = started + PROGRESS_S
    while True:
        try:
            line = reader.next_line(deadline=min(next_word, started + STOP_WAIT_S))
        except TimeoutError:
            if time.monotonic() >= started + STOP_WAIT_S:
                return False
            print(f"  still stopping: {name} is at step {ending.step} ({time.monotonic() - started:.0f} s so far); "
                  "it stops at the end of its step.", file=sys.stderr, flush=True)
            next_word += PROGRESS_S
            continue
        except (EOFError, OSError):
            return True
        except ProtocolError:
            continue  # an over-long line: not one this client needs
        _note(decode(line), ending)


def _note(message: object, ending: Ending) -> None:
    match message:
        case State():
            ending.state, ending.step = message.state, message.step
        case Metrics() if message.columns.get("step"):
            ending.step = int(message.columns["step"][-1])
        case CheckpointSaved():
            ending.checkpoint = message.path
        case Error():
            ending.error = message.message


def _report(entry: RunEntry, ending: Ending) -> int:
    """Once its process has gone, what the run became and where its final checkpoint is; its entry removed, as
    the app removes a run's that it stopped."""
    name, pid = printable(entry.endpoint.name), entry.info.get("pid")
    deadline = time.monotonic() + EXIT_GRACE_S
    while process_running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if process_running(pid):
        print(f"torchlab-tui stop: {name} closed its socket at step {ending.step} but its process ({pid}) has not "
              f"ended after {EXIT_GRACE_S:.0f} s.", file=sys.stderr)
        return EXIT_FAILED
    entry.endpoint.remove()
    print(f"{name} {printable(ending.state)} at step {ending.step}" + (f": {printable(ending.error)}" if ending.error else "."))
    if ending.checkpoint:  # as the trainer named it, relative to where it started: said whole, for any directory
        final = Path(ending.checkpoint)
        shown = final if final.is_absolute() else Path(str(entry.info.get("run_dir"))) / "checkpoints" / final.name
        # A run that failed wrote no final checkpoint (a hung step ended by this stop): the one named is its last.
        print(f"{'Last' if ending.state == RunStatus.FAILED else 'Final'} checkpoint: {printable(shown)}")
    print(f"Run directory: {printable(entry.info.get('run_dir'))}")
    return EXIT_FAILED if ending.state == RunStatus.FAILED else EXIT_OK
