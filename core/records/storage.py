"""Writes of the run directory that land whole or leave what was there, and the one message a failed
write gives.

- A JSON-lines file (``metrics.jsonl``, ``events.jsonl``, ``system.jsonl``, ...) gets each line in one
  ``os.write`` on an ``O_APPEND`` descriptor; a failed or short write (a full disk) is cut back to the
  size before it, so every line of the file parses after any fault. A file that already ends in a torn
  line (a power cut; a kill mid-write by an older version) is repaired when it is opened: the fragment
  is dropped, and the caller learns how many bytes went.
- Any other file (``config.toml``, ``impact.json``, the profile tables) is written to a temporary file
  beside it, fsynced and renamed over its name: a reader sees the old file or the new one, never half.
- A failure becomes a ``StorageError`` that says what failed, while writing what, and what is intact:
  "no space left on device writing metrics.jsonl in runs/x; its lines before this one are whole ...".
- A file or folder is created as private as the folder it is in: in a folder no one else may enter
  (no group or other bits: a run directory is made so unless ``shared_run_dir`` is set), a file is
  created 0600 and a folder 0700, whatever the umask; elsewhere 0666 and 0755, which the umask trims
  as usual: others may read what the umask lets them, never add to or swap the entries of a folder
  torchlab made (core/records/rundir_folder.py refuses a run directory they could). The mode is given to
  ``open``/``mkdir`` themselves, so there is no moment when a file is readable by others before a
  ``chmod``; nothing that exists has its mode changed.

Standard library only: the profile-table builder, a child process without torch, writes through it too.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torchlab.core.errors import ConfigError, StorageError
from torchlab.core.safe_open import open_regular, require_real_folder
from torchlab.core.wire import strict_json

#: A file is read back from its end this much at a time (a line longer than this takes several reads).
TAIL_CHUNK = 64 * 1024


def reason(error: OSError) -> str:
    """What went wrong, as the start of a sentence: ``no space left on device``."""
    text = error.strerror or str(error) or type(error).__name__
    return text[:1].lower() + text[1:]


def unreadable_run(run: Path, error: OSError) -> ConfigError:
    """A run's files that cannot be read (``compare``, ``export``): another user's run is private to them."""
    private = " (a run directory is private to the user who started it)" if error.errno in (errno.EACCES, errno.EPERM) else ""
    return ConfigError(f"{run}: cannot be read: {reason(error)}{private}")


def remedy(error: OSError) -> str:
    """What the user does about it, as the start of a clause: ``free some space``."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free some space"
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "make the run directory writable"
    return "fix that"


def storage_error(error: OSError, writing: str, intact: str) -> StorageError:
    """The message of every failed write: ``{reason} writing {writing}; {intact}``."""
    return StorageError(f"{reason(error)} writing {writing}; {intact}")


def is_private(folder: Path) -> bool:
    """True if only its owner may enter or list ``folder``: its mode has no group or other bits."""
    return stat.S_IMODE(os.stat(folder).st_mode) & 0o077 == 0


def create_file(path: Path, flags: int = os.O_WRONLY | os.O_TRUNC) -> int:
    """``os.open(path, flags | O_CREAT)``, a new file being 0600 in a private folder and 0666 (less the
    umask) elsewhere; the descriptor. Never through a link, and only a regular file (``open_regular``):
    an UnsafeFileError otherwise. One ``stat`` of the folder: call it per file, not per write. Also an
    ``opener`` for ``open()``."""
    path = Path(path)
    return open_regular(path, flags | os.O_CREAT, 0o600 if is_private(path.parent) else 0o666)


def make_folders_above(folder: Path) -> list[Path]:
    """``mkdir -p`` of the folders above ``folder`` that are missing: 0755 less the umask, never writable by anyone
    else (the folder rule, core/safe_open.py, would refuse what was just made under umask 000, or umask 002 where
    the user's group holds others). One made meanwhile (another run starting) is left to the caller's check. The
    folders made, outermost first, for a caller to remove if what it writes fails; none where it raises."""
    missing = []
    for above in folder.parents:
        if os.path.lexists(above):
            break
        missing.append(above)
    made: list[Path] = []
    try:
        for above in reversed(missing):
            try:
                os.mkdir(above, 0o755)
            except FileExistsError:
                continue
            made.append(above)
    except OSError:  # no permission, a full disk: what this made is taken back
        for above in reversed(made):
            os.rmdir(above)
        raise
    return made


def make_folder(path: Path) -> Path:
    """Make ``path`` (and any missing folder above it) unless it is a folder already: 0700 in a private
    folder, 0755 less the umask elsewhere. An existing folder keeps its mode; a link in its place (to a
    folder of someone else's choosing) is an UnsafeFileError."""
    path = Path(path)
    if require_real_folder(path):
        return path
    if path.parent != path and not path.parent.is_dir():
        make_folder(path.parent)
    try:
        os.mkdir(path, 0o700 if is_private(path.parent) else 0o755)
    except FileExistsError:
        if not require_real_folder(path):
            raise
    return path


def match_folder_privacy(path: Path) -> None:
    """A file or folder another library created in ``path``'s folder (torch's trace.json, the launcher's rank
    log folders) loses its group and other bits if that folder is private, as if ``create_file`` or
    ``make_folder`` had made it."""
    path = Path(path)
    if is_private(path.parent):
        os.chmod(path, stat.S_IMODE(os.stat(path).st_mode) & 0o700)


def temporary_name(path: Path) -> Path:
    """``.NAME.tmp-PID`` beside ``path``: hidden, and naming its writer, so that a sweep can tell an
    abandoned one (its writer was killed) from one being written."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def write_new_file(path: Path, payload: bytes) -> None:
    """Create (or truncate) ``path`` with ``payload``, fsynced; on any failure ``path`` is removed and the
    OSError propagates."""
    path = Path(path)
    try:
        descriptor = create_file(path)
        try:
            write_all(descriptor, payload)
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def replace_file(path: Path, payload: bytes) -> None:
    """Replace ``path`` with ``payload``: temporary file, fsync, rename, fsync of the directory.

    On any failure the temporary file is removed, ``path`` is as it was, and the OSError propagates.
    """
    path = Path(path)
    temporary = temporary_name(path)
    write_new_file(temporary, payload)
    try:
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def write_atomically(path: Path, text: str, *, then: str = "try again") -> None:
    """``replace_file`` for a text file of the run directory; a failure is a StorageError that says the
    file is as it was, and ends "free some space, then {then}"."""
    path = Path(path)
    existed = path.exists()
    try:
        replace_file(path, text.encode("utf-8"))
    except OSError as error:
        kept = f"{path.name} is as it was" if existed else f"{path.name} was not written"
        raise storage_error(error, f"{path.name} in {path.parent}", f"{kept}: {remedy(error)}, then {then}.") from error


def fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable: after a power cut the new name is there."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_all(descriptor: int, payload: bytes | memoryview) -> None:
    """``os.write`` until all of ``payload`` is written; a write that takes nothing is a full disk."""
    view = memoryview(payload)
    while view:
        written = os.write(descriptor, view)
        if written == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]


def parse_line(line: bytes) -> dict[str, Any] | None:
    """The record of a whole line (ending in a newline), or None for a torn or unparseable one, or one holding
    what torchlab never writes (``strict_json.loads``)."""
    if not line.endswith(b"\n"):
        return None
    try:
        record = strict_json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


class JsonLines:
    """An append-only JSON-lines file whose lines are all whole.

    Not thread-safe by itself: the owner serialises the writers of one file (``RunDirectory`` holds a
    lock per file). ``bytes_dropped`` says what opening it repaired.
    """

    def __init__(self, path: Path, *, intact: str = "") -> None:
        """Open (creating) ``path`` for appending, after cutting off a torn last line. ``intact`` ends the
        message of a failed append (what else is still fine, e.g. "the checkpoints are untouched")."""
        self.path = Path(path)
        self.intact = intact
        try:
            self._descriptor = create_file(self.path, os.O_RDWR | os.O_APPEND)
        except OSError as error:
            raise storage_error(error, self._where(), f"nothing was written: {remedy(error)}, then try again.") from error
        try:
            self.bytes_dropped = self._repair()
        except OSError as error:
            os.close(self._descriptor)
            raise storage_error(error, f"{self._where()} (cutting off its torn last line)",
                                f"the file is as it was: {remedy(error)}, then try again.") from error

    @property
    def closed(self) -> bool:
        return self._descriptor < 0

    def append(self, line: str) -> None:
        """Append one line (``line`` ends in a newline) whole, or not at all."""
        self.append_bytes(line.encode("utf-8"))

    def append_bytes(self, lines: bytes) -> None:
        """Append whole lines in one write; on a failure the file is cut back to its size before it and a
        StorageError says so."""
        if self.closed:
            raise ValueError(f"{self.path} is closed")
        size = self.size()  # the owner's lock makes this the only writer: the append lands at ``size``
        try:
            written = os.write(self._descriptor, lines)
            if written != len(lines):  # a short write: the disk took part of it, the next write would fail
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as error:
            torn = self._cut_back(size)
            raise storage_error(error, self._where(), self._intact_after(error, torn)) from error

    def append_from(self, source: JsonLines, start: int, end: int) -> None:
        """Append ``source``'s bytes ``start:end`` (whole lines), a chunk at a time, all or nothing, and
        fsynced: the caller may then remove them from ``source``."""
        size = self.size()
        try:
            position = start
            while position < end:
                chunk = os.pread(source._descriptor, min(TAIL_CHUNK * 16, end - position), position)
                if not chunk:
                    raise OSError(errno.EIO, f"{source.path.name} ended at {position} bytes, before {end}")
                write_all(self._descriptor, chunk)
                position += len(chunk)
            os.fsync(self._descriptor)
        except OSError as error:
            torn = self._cut_back(size)
            raise storage_error(error, self._where(), self._intact_after(error, torn)) from error

    def lines_from_end(self) -> Iterator[tuple[int, bytes]]:
        """``(offset, line)`` for each line, the last first, read back from the end in chunks. A line keeps
        its newline; a torn last line has none."""
        position = self.size()  # the file offset of buffer[0]
        buffer, end = b"", 0  # buffer[:end]: read, not yet yielded
        while True:
            cut = buffer.rfind(b"\n", 0, end - 1) if end > 1 else -1
            if cut >= 0:
                yield position + cut + 1, buffer[cut + 1:end]
                end = cut + 1
                continue
            if position == 0:
                if end:
                    yield 0, buffer[:end]
                return
            start = max(0, position - TAIL_CHUNK)
            buffer = os.pread(self._descriptor, position - start, start) + buffer[:end]
            position, end = start, len(buffer)

    def last_record(self) -> dict[str, Any] | None:
        """The last line's record (None for an empty file)."""
        for _, line in self.lines_from_end():
            return parse_line(line)
        return None

    def truncate(self, size: int) -> None:
        """Cut the file to ``size`` bytes, a line boundary the caller found, and make that durable."""
        os.ftruncate(self._descriptor, size)
        os.fsync(self._descriptor)

    def size(self) -> int:
        return os.fstat(self._descriptor).st_size

    def close(self) -> None:
        if not self.closed:
            descriptor, self._descriptor = self._descriptor, -1
            os.close(descriptor)

    def _where(self) -> str:
        return f"{self.path.name} in {self.path.parent}"

    def _cut_back(self, size: int) -> bool:
        """Undo a failed append; True if even that failed (the next open repairs the torn line)."""
        try:
            os.ftruncate(self._descriptor, size)
        except OSError:
            return True
        return False

    def _intact_after(self, error: OSError, torn: bool) -> str:
        lines = ("its lines before this one are whole; the torn last one is cut off when the run resumes"
                 if torn else "its lines before this one are whole")
        return f"{lines}{', ' + self.intact if self.intact else ''}: {remedy(error)}, then resume."

    def _repair(self) -> int:
        """Cut off a torn last line (no final newline, or a line that does not parse); the bytes dropped.

        Only the last line: a file whose earlier lines do not parse was not torn by a write of ours, and
        is not ours to cut."""
        size = self.size()
        for offset, line in self.lines_from_end():
            if parse_line(line) is not None:
                return 0
            os.ftruncate(self._descriptor, offset)
            return size - offset
        return 0
