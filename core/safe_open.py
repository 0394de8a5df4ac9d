"""Opening a run's files when someone else may have prepared them: never through a symbolic link, and
never anything but a regular file.

On a shared box a run directory in ``/tmp``, or a colleague's ``--shared-run-dir`` run, can hold entries
made by another user: ``trials.jsonl`` linked to ``~victim/notes.txt`` (a journal "repair" would cut its
last line), ``checkpoints`` linked to a folder of theirs, ``trace.json`` linked to ``/etc/shadow`` (an
export would copy it), a FIFO that blocks a reader for ever. Every open of a run's file goes through
``open_regular``: ``O_NOFOLLOW`` refuses a link as the last part of the path, ``O_NONBLOCK`` lets a FIFO's
open return at once so that ``fstat`` can refuse it, and anything that is not a regular file (a FIFO, a
device, a socket, a folder) is refused with one paragraph. Folders are checked with ``lstat`` by
``require_real_folder``; the run directory's owner and mode are checked where a run begins
(core/records/rundir.py), and once no one else may write into it, no one else can swap its entries.

Standard library only (the profile-table builder, a child process without torch, writes through it).
"""

from __future__ import annotations

import errno
import fcntl
import os
import pwd
import stat
from pathlib import Path

from torchlab.core.errors import ConfigError

#: What an entry is, as a message names it.
_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


class UnsafeFileError(ConfigError):
    """A run's file that is not a regular file of its own: a link, a FIFO, a device; the message names it."""

    def __init__(self, path: Path | str, kind: str, expected: str = "a regular file") -> None:
        self.path = Path(path)
        self.kind = kind
        if kind == "a symbolic link":
            why = ("torchlab opens no file of a run through a link, which whoever made it could point at a file "
                   "of yours")
        else:
            why = "torchlab reads and writes only regular files in a run (a FIFO or a device would block or never end)"
        super().__init__(f"{self.path} is {kind}, not {expected}: {why}. Remove it, or use another run directory.")


def kind_of(mode: int) -> str:
    """``a symbolic link``, ``a FIFO (named pipe)``, ...: what a mode from ``lstat`` is, for a message."""
    for test, kind in _KINDS:
        if test(mode):
            return kind
    return "a regular file" if stat.S_ISREG(mode) else "not a file"


def open_regular(path: Path | str, flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
    """``os.open(path, flags, mode)`` that follows no link in the last part of ``path`` and opens only a
    regular file, or raises UnsafeFileError; the descriptor (blocking, close-on-exec). Other failures are
    the OSError ``os.open`` raised. Also an ``opener`` for ``open()`` (``open(p, opener=open_regular)``)."""
    try:
        descriptor = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as error:
        if error.errno == errno.ELOOP:  # O_NOFOLLOW's answer for a link
            raise UnsafeFileError(path, "a symbolic link") from None
        if error.errno in (errno.ENXIO, errno.EISDIR):  # a FIFO no one reads, opened to write; a folder
            raise UnsafeFileError(path, _lstat_kind(path)) from None
        raise
    try:
        mode_now = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode_now):
            raise UnsafeFileError(path, kind_of(mode_now))
        fcntl.fcntl(descriptor, fcntl.F_SETFL, fcntl.fcntl(descriptor, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def read_regular_bytes(path: Path | str, limit: int | None = None) -> bytes:
    """The bytes of the regular file at ``path`` (``open_regular``'s rules), at most ``limit`` of them."""
    with open(path, "rb", opener=open_regular) as handle:
        return handle.read() if limit is None else handle.read(limit)


def read_regular_text(path: Path | str, limit: int | None = None) -> str:
    """``read_regular_bytes`` decoded as UTF-8 (undecodable bytes replaced: a message shows them, no more)."""
    return read_regular_bytes(path, limit).decode("utf-8", errors="replace")


def require_real_folder(path: Path | str) -> bool:
    """True if ``path`` is a folder itself (not a link to one), False if nothing is there; UnsafeFileError
    for a link or anything else that is not a folder."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(mode):
        raise UnsafeFileError(path, kind_of(mode), expected="a folder")
    return True


def who_else_may_write(status: os.stat_result) -> str | None:
    """Why what ``status`` describes may have been prepared or changed by someone else, or None where only you
    could have: it belongs to another user, or other users may write into it (group or others). The one rule
    for a run directory, a checkpoint named on the command line and an export's folder; each caller says what
    the fault means for it."""
    if status.st_uid != os.geteuid():
        return f"belongs to {owner_name(status.st_uid)}"
    mode = stat.S_IMODE(status.st_mode)
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"can be written by other users (mode {mode:04o})"
    return None


def owner_name(uid: int) -> str:
    """``alice (uid 1001)``: who owns a file, as a refusal names them."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:  # no name in the password database
        return f"uid {uid}"


def _lstat_kind(path: Path | str) -> str:
    try:
        return kind_of(os.lstat(path).st_mode)
    except OSError:
        return "not a file"
