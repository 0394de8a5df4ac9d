"""Where a run's socket and token live: a per-user runtime directory only its owner can enter.

Standard library only, and the errors module (the app uses it too). ``$XDG_RUNTIME_DIR/torchlab``
when that is set, else ``/tmp/torchlab-<uid>``. An existing directory is used only if it is a real
directory (not a symlink), owned by this user, with mode 0700; anything else is refused rather than trusted
(``RuntimeDirError``, a ConfigError: one paragraph wherever it is met).

Each run has ``<name>.sock``, ``<name>.token`` and ``<name>.json``: what ``torchlab-tui attach``
lists (workload, run directory, step, state, since when, whether an app is attached). The trainer
rewrites the JSON as the run goes; a detached run that ends leaves it behind with its final state,
so ``attach`` can say the run finished and where its directory is.

Tokens and entries are opened as a run's files are (core/safe_open.py): never through a link, and only
when regular, so a FIFO there cannot block a listing. An entry is read as data someone else may have written:
one that is not a JSON object of the fields and types a trainer writes (``"started": "abc"``, a 70-bit pid,
nesting 100,000 deep) is skipped, with a line saying why (``read_runs``), never a traceback. What ``attach``
and ``serve`` print of an entry goes through ``printable`` (core/errors.py): a ``run_dir`` holding
``\\x1b]0;evil\\x07`` shows as those characters, escaped, not as a new title for the terminal.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import shutil
import socket
import stat
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchlab.core.errors import ConfigError, shown
from torchlab.core.safe_open import UnsafeFileError, open_regular, read_regular_bytes, read_regular_text
from torchlab.core.wire.run_status import FINAL_STATES, RunStatus


class RuntimeDirError(OSError, ConfigError):
    """The runtime directory exists but is not safe to use; the message says why (and what to do), and
    every entry point shows it as one paragraph (it is a ConfigError; an OSError too, as the folder's trouble is)."""


def runtime_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR")
    path = Path(base) / "torchlab" if base else Path(f"/tmp/torchlab-{os.getuid()}")
    try:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        info = os.lstat(path)
    except OSError as error:  # XDG_RUNTIME_DIR another user's (kept by ``su``, say), or gone: not a traceback
        where = f"XDG_RUNTIME_DIR={base}" if base else str(path.parent)
        raise RuntimeDirError(f"{path} cannot be used: {error.strerror or error}; {where} is not a folder of yours"
                              f"{': set XDG_RUNTIME_DIR to your own (or unset it)' if base else ''}.") from None
    if not stat.S_ISDIR(info.st_mode):
        raise RuntimeDirError(f"{path} is not a directory (a symlink or file is there); remove it.")
    if info.st_uid != os.getuid():
        raise RuntimeDirError(f"{path} belongs to another user (uid {info.st_uid}); remove it or set XDG_RUNTIME_DIR.")
    if stat.S_IMODE(info.st_mode) != 0o700:
        raise RuntimeDirError(f"{path} has mode {stat.S_IMODE(info.st_mode):o}, not 700: run chmod 700 {path}.")
    return path


#: A token is 64 hexadecimal digits; an entry a few hundred bytes (its training arguments are the most of it).
MAX_TOKEN_BYTES = 4096
MAX_ENTRY_BYTES = 1 << 20


@dataclass(frozen=True)
class Endpoint:
    """The socket a trainer serves and the file holding the token a client must present."""

    socket_path: Path
    token_path: Path

    @classmethod
    def create(cls, name: str) -> Endpoint:
        """A fresh endpoint with a new random token in a 0600 file. ``name`` identifies the run."""
        directory = runtime_dir()
        endpoint = cls(directory / f"{name}.sock", directory / f"{name}.token")
        endpoint.create_token()
        return endpoint

    def create_token(self) -> None:
        """A new random token in a file only this user can read (never written through a link)."""
        descriptor = open_regular(self.token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(secrets.token_hex(32))

    @property
    def name(self) -> str:
        return self.socket_path.stem

    @property
    def info_path(self) -> Path:
        return self.socket_path.with_suffix(".json")

    def read_token(self) -> str:
        """The token, from a regular file (UnsafeFileError for a link or a FIFO, which would block)."""
        return read_regular_text(self.token_path, MAX_TOKEN_BYTES).strip()

    def write_info(self, info: dict[str, Any]) -> None:
        """Replace ``<name>.json`` atomically (0600): a reader sees the old or the new version, whole."""
        temporary = self.info_path.with_suffix(f".json.tmp-{os.getpid()}")
        descriptor = open_regular(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            json.dump({**info, "name": self.name, "updated": time.time()}, handle)
        os.replace(temporary, self.info_path)

    def remove(self, *, keep_info: bool = False) -> None:
        for path in (self.socket_path, self.token_path) if keep_info else (self.socket_path, self.token_path, self.info_path):
            path.unlink(missing_ok=True)


@dataclass(frozen=True)
class RunEntry:
    """One run in the runtime directory, as ``attach`` lists it."""

    endpoint: Endpoint
    info: dict[str, Any]
    #: its socket is there but nothing listens on it: the trainer is dead, whatever process its pid names now
    unserved: bool = False

    @property
    def state(self) -> str:
        """The trainer's last word, or "gone" when its process died without one (kill -9).

        Its pid alone cannot say so once the system has given that number to another process: an entry
        of a trainer killed while starting then read "starting" forever, and ``attach`` tried to open it.
        """
        state = str(self.info.get("state", "?"))
        if state not in FINAL_STATES and (self.unserved or not process_running(self.info.get("pid"))):
            return RunStatus.GONE
        return state

    @property
    def ended(self) -> bool:
        """Its trainer said its last word (finished, stopped, failed), or died without one."""
        return self.state in FINAL_STATES or self.state == RunStatus.GONE

    @property
    def live(self) -> bool:
        return not self.ended and self.endpoint.socket_path.exists()


#: A socket refusing connections this long after it was made has no server (a trainer listens right after
#: its bind, and writes its entry after that).
STALE_SOCKET_AGE_S = 60.0
#: A token with neither socket nor entry beside it this long after it was written belongs to no run
#: (its trainer was killed before it could tidy up): a trainer makes both within a second of starting.
ORPHAN_TOKEN_AGE_S = 600.0


def remove_abandoned_temporaries(directory: Path, pattern: re.Pattern[str]) -> None:
    """Remove the files of ``directory`` that ``pattern`` matches (its group 1: the writer's pid) and
    whose writer no longer runs: a process killed between its write and its rename. Never another
    live writer's."""
    for candidate in directory.iterdir():
        match = pattern.match(candidate.name)
        if match and not process_running(int(match.group(1))):
            candidate.unlink(missing_ok=True)


_ENTRY_TEMPORARY = re.compile(r"^.+\.json\.tmp-(\d+)$")


def sweep_leftovers(directory: Path) -> None:
    """Remove what killed trainers left behind: entry temporaries of dead writers, sockets that no
    process serves (a run's, without its entry; a supervisor's ``ranks-*.sock``), and orphan tokens.

    A socket is removed only when it is older than ``STALE_SOCKET_AGE_S`` and refuses a connection: a
    trainer binds its socket and listens at once, so an old socket that refuses has no server. A socket
    beside its run's entry is the entry's to account for (``attach`` reports a dead run once, then removes it).
    """
    now = time.time()
    remove_abandoned_temporaries(directory, _ENTRY_TEMPORARY)
    for socket_path in directory.glob("*.sock"):
        if not socket_path.with_suffix(".json").exists() and _abandoned(socket_path, now):
            socket_path.unlink(missing_ok=True)
            socket_path.with_suffix(".token").unlink(missing_ok=True)
    for token in directory.glob("*.token"):
        stem = token.with_suffix("")
        if stem.with_suffix(".sock").exists() or stem.with_suffix(".json").exists():
            continue
        try:
            age = now - token.stat().st_mtime
        except FileNotFoundError:
            continue
        if age > ORPHAN_TOKEN_AGE_S:
            token.unlink(missing_ok=True)


def serves(socket_path: Path) -> bool:
    """Whether a process listens on the Unix socket ``socket_path`` (connects, then hangs up at once: a
    trainer or supervisor refuses a client that says nothing, and goes on). In doubt, True."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(socket_path))
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:  # a timeout (a server too busy to accept), no permission: not ours to remove
        return True
    finally:
        probe.close()
    return True


def _abandoned(socket_path: Path, now: float) -> bool:
    """Old enough that its server would be listening, and nobody is: its trainer (or supervisor) is dead."""
    return _older_than(socket_path, STALE_SOCKET_AGE_S, now) and not serves(socket_path)


def _older_than(path: Path, age_s: float, now: float) -> bool:
    try:
        return now - path.stat().st_mtime > age_s
    except FileNotFoundError:
        return False


def list_runs() -> list[RunEntry]:
    """Every run this user has in the runtime directory, oldest first (entries that are not one are skipped)."""
    return read_runs()[0]


def read_runs() -> tuple[list[RunEntry], list[str]]:
    """Every run this user has in the runtime directory, oldest first, and a line for each entry skipped: its
    path and why it is not a run's entry (a FIFO, a link, not JSON, a field of the wrong type).

    Leftovers of killed trainers are swept first (see ``sweep_leftovers``). An entry whose socket is old
    enough and refuses a connection is marked ``unserved``: its trainer is gone (``attach`` lists it once).
    """
    directory = runtime_dir()
    sweep_leftovers(directory)
    now = time.time()
    entries, skipped = [], []
    for info_path in directory.glob("*.json"):
        try:
            info = read_entry(info_path)
        except FileNotFoundError:  # removed since the listing: a run's end, or attach forgetting one
            continue
        except (UnsafeFileError, EntryError, OSError) as error:
            skipped.append(f"{info_path}: {_why_skipped(error)}")
            continue
        stem = info_path.with_suffix("")
        endpoint = Endpoint(stem.with_suffix(".sock"), stem.with_suffix(".token"))
        unserved = info.get("state") not in FINAL_STATES and _abandoned(endpoint.socket_path, now)
        entries.append(RunEntry(endpoint, info, unserved))
    return sorted(entries, key=lambda entry: entry.info.get("started") or 0), skipped


class EntryError(ValueError):
    """An entry of the runtime directory that is not one a trainer writes; the message says what is wrong."""


def read_entry(path: Path) -> dict[str, Any]:
    """The run entry at ``path``: a regular file (never a link or a FIFO) of at most ``MAX_ENTRY_BYTES``, holding a
    JSON object whose fields a trainer writes are of the types it writes them (others are let be); or EntryError,
    UnsafeFileError or OSError saying why not."""
    data = read_regular_bytes(path, MAX_ENTRY_BYTES + 1)
    if len(data) > MAX_ENTRY_BYTES:
        raise EntryError(f"larger than {MAX_ENTRY_BYTES} bytes")
    try:
        info = json.loads(data)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError too
        raise EntryError("not JSON (or nested too deep, or a number too long to read)") from None
    if not isinstance(info, dict):
        raise EntryError("not a JSON object")
    for key, (accepts, expected) in _ENTRY_FIELDS.items():
        if key in info and not accepts(info[key]):
            raise EntryError(f"{key}: expected {expected}, got {shown(info[key])}")
    return info


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _is_time(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and 0 <= value < 1e11


#: The fields of an entry (as core/launch/worker.py writes them) that are read, and what each must be.
_ENTRY_FIELDS: dict[str, tuple[Any, str]] = {
    "pid": (lambda value: _is_count(value) and 0 < value < 2**31, "a process id"),  # what os.kill takes
    "run_dir": (lambda value: isinstance(value, str), "text"),
    "workload": (lambda value: isinstance(value, str), "text"),
    "name": (lambda value: isinstance(value, str), "text"),
    "state": (lambda value: isinstance(value, str), "text"),
    "started": (_is_time, "a number"),
    "updated": (_is_time, "a number"),
    "step": (_is_count, "a count"),
    "steps": (lambda value: value is None or _is_count(value), "a count or null"),
    "attached": (lambda value: isinstance(value, bool), "true or false"),
    "training_args": (lambda value: isinstance(value, list) and all(isinstance(item, str) for item in value), "a list of text"),
}


def _why_skipped(error: UnsafeFileError | EntryError | OSError) -> str:
    if isinstance(error, UnsafeFileError):
        return f"{error.kind}, not a regular file"
    if isinstance(error, OSError):
        return error.strerror or str(error)
    return str(error)


def find_run(selector: str) -> RunEntry:
    """The run named ``selector`` (or a unique prefix of its name), or whose run directory it is."""
    entries = list_runs()
    exact = [e for e in entries if e.endpoint.name == selector or _same_path(e.info.get("run_dir"), selector)]
    matches = exact or [e for e in entries if e.endpoint.name.startswith(selector)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise LookupError(f"no run named {selector!r}; `torchlab-tui attach` lists them")
    raise LookupError(f"{selector!r} matches {len(matches)} runs ({', '.join(e.endpoint.name for e in matches)}); give more of the name")


def _same_path(run_dir: Any, selector: str) -> bool:
    try:
        return isinstance(run_dir, str) and Path(run_dir).resolve() == Path(selector).resolve()
    except OSError:
        return False


def listen_privately(path: Path, backlog: int = socket.SOMAXCONN) -> socket.socket:
    """A Unix socket listening at ``path``, 0600 from the moment it can be reached there: bound in a
    private folder beside it, then renamed into place. (Setting the umask around ``bind`` instead is
    process-wide: a folder another thread made meanwhile came out 0600, unusable.)"""
    path = Path(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=".bind-"))
    try:
        listener.bind(str(staging / "s"))
        os.chmod(staging / "s", 0o600)
        os.replace(staging / "s", path)
    except BaseException:
        listener.close()
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    listener.listen(backlog)
    return listener


def die_with_parent(signum: int) -> None:
    """Linux: have the kernel send this process ``signum`` when its parent dies (elsewhere: nothing)."""
    if sys.platform.startswith("linux"):
        import ctypes  # the trainer's processes only: not on the app's way to its first frame

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)


_PR_SET_PDEATHSIG = 1


def process_running(pid: Any) -> bool:
    """Whether ``pid`` runs (a zombie, finished but not yet reaped by its parent, does not)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
