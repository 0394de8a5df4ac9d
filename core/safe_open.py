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
(core/records/rundir_folder.py), and once no one else may write into it, no one else can swap its entries.

The folder rule: every place torchlab writes into, in every command (a run directory and its runs root, a
``--tensorboard`` folder while training or exporting, the folder of an export's ``--csv``), goes through
``who_else_may_change`` before anything is written, and each caller says what a fault means for it. As
OpenSSH's StrictModes checks ``~/.ssh``: each folder on the way is yours or root's and not writable by
others, unless sticky (``/tmp``: no one else may rename or remove your entries there); a link on the way is
yours or root's (a link another user made in ``/tmp`` is not followed); the folder written into is yours,
and no one else may write into it. Otherwise another user could have put a link where a file will be
created (TensorBoard opens its event file by name itself), read what is written, or swap the folder
mid-run for one of theirs.

Every path given on the command line meets one rule for its length too (``refuse_a_path_too_long``):
said in one paragraph before it is used, not as the ``File name too long`` of whichever call met it first.

Standard library only (the profile-table builder, a child process without torch, writes through it).
"""

from __future__ import annotations

import errno
import fcntl
import grp
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from torchlab.core.errors import ConfigError, shown

#: The longest name of one entry in a folder, and the longest path, in bytes, that Linux takes (NAME_MAX, PATH_MAX
#: less the closing NUL): a longer one is ENAMETOOLONG wherever it is first used.
NAME_MAX_BYTES = 255
PATH_MAX_BYTES = 4095
#: How many links a path may lead through (the kernel's own limit, for ELOOP).
_MAX_LINKS = 40

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
    could have: it belongs to another user, or other users may write into it (group or others). The rule for
    the folder at the end of the folder rule's walk (``who_else_may_change``) and for a checkpoint named on the
    command line; each caller says what the fault means for it."""
    if status.st_uid != os.geteuid():
        return f"belongs to {owner_name(status.st_uid)}"
    mode = stat.S_IMODE(status.st_mode)
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"can be written by other users (mode {mode:04o})"
    return None


@dataclass(frozen=True)
class FolderFault:
    """Why someone other than you and root could change what torchlab writes at a path (``who_else_may_change``).

    ``str()`` reads after the path, as ``--tensorboard /tmp/pub/tb {fault}``: ``belongs to alice (uid 1001)``,
    ``can be written by other users (mode 0777)``, ``is inside /tmp/pub, which belongs to alice (uid 1001)``,
    ``leads through /tmp/tb, a symbolic link that belongs to alice (uid 1001)``."""

    #: what is at fault: the path itself, a folder above it, or a link on the way to it
    at: Path
    #: the fault, as a clause: ``belongs to alice (uid 1001)``, ``other users can write into (mode 0777)``
    why: str
    #: "itself", "above" or "link"
    where: str
    #: another user's: only they (or root) can mend it, where a ``chmod`` of yours mends the rest
    theirs: bool

    def __str__(self) -> str:
        if self.where == "itself":
            return self.why
        if self.where == "link":
            return f"leads through {self.at}, a symbolic link that {self.why}"
        return f"is inside {self.at}, which {self.why}"


def who_else_may_change(path: Path | str, *, sticky_is_enough: bool = False) -> FolderFault | None:
    """The folder rule (the module's docstring): why someone other than you and root could change what torchlab
    writes at ``path`` (a folder it writes files into, or a file it creates), or None where no one could.

    The path is walked as the kernel resolves it: every folder on the way is yours or root's, and neither
    others nor, unless it holds no one but its owner, its group may write into it, save where it is sticky
    (``/tmp``); a link on the way is yours or root's, and is followed. ``path`` itself, where it is a folder,
    is yours, and no one else may write into it (``who_else_may_write``: sticky or not, a folder others may
    add to could hold a link where a file will be made). A part that is not there yet is not judged: it will
    be made, by you, in a folder judged already (check again once it is made: someone may have made it
    first). What is at ``path`` that is not a folder (a file, a FIFO) is the caller's to judge. An OSError
    where a part cannot be looked at (no permission, a name too long, a loop of links, a file on the way).

    ``sticky_is_enough``: ``path`` is a folder that only receives files torchlab makes itself, new
    (``O_EXCL | O_NOFOLLOW``) and renamed within it, as an export's ``--csv``: it is judged as a folder on the
    way, and a fault of its own is said as one above the file (``is inside``): ``/tmp`` is fine, since no one
    else can take a name you made there, or swap what is at it."""
    pending = list(Path(os.getcwd(), path).parts[1:])  # not abspath: ``..`` after a link goes where the link led
    folder, links = Path("/"), 0
    while pending:
        part = pending.pop(0)
        if part == "..":
            folder = folder.parent
            continue
        entry = folder / part
        try:
            status = os.lstat(entry)
        except FileNotFoundError:
            return None  # made by you from here on, in ``folder``, judged already
        if stat.S_ISLNK(status.st_mode):
            links += 1
            if links > _MAX_LINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(path))
            if status.st_uid not in (os.geteuid(), 0):
                return FolderFault(entry, f"belongs to {owner_name(status.st_uid)}", "link", theirs=True)
            folder, target_parts = _where_the_link_leads(entry, folder)
            pending[:0] = target_parts
            continue
        if not pending:  # the path itself
            return _fault_of_the_path_itself(entry, status, sticky_is_enough=sticky_is_enough)
        if not stat.S_ISDIR(status.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(entry))
        fault = _fault_of_a_folder_above(entry, status)
        if fault is not None:
            return fault
        folder = entry
    return None  # the path is ``/``: root's


def _where_the_link_leads(link: Path, folder: Path) -> tuple[Path, list[str]]:
    """Where the walk goes on from ``link``, a link in ``folder``: the folder its target is resolved from (``/`` for
    an absolute target) and the target's parts, walked before what followed the link in the path."""
    target = os.readlink(link)
    resolved_from = Path("/") if os.path.isabs(target) else folder
    return resolved_from, [piece for piece in Path(target).parts if piece != "/"]


def _fault_of_the_path_itself(entry: Path, status: os.stat_result, *, sticky_is_enough: bool) -> FolderFault | None:
    """The folder rule's last judgement, of the folder at the end of the walk (``who_else_may_change``'s
    ``sticky_is_enough`` says which rule it meets); None where it is not a folder, for the caller to judge."""
    if not stat.S_ISDIR(status.st_mode):
        return None
    if sticky_is_enough:  # the folder above the files written: said so
        return _fault_of_a_folder_above(entry, status)
    fault = who_else_may_write(status)
    return fault and FolderFault(entry, fault, "itself", theirs=status.st_uid != os.geteuid())


def _fault_of_a_folder_above(entry: Path, status: os.stat_result) -> FolderFault | None:
    """The folder rule for a folder on the way (``_who_else_may_rename_in``), as the fault of what is inside it."""
    fault = _who_else_may_rename_in(status)
    if fault is None:
        return None
    return FolderFault(entry, fault, "above", theirs=status.st_uid not in (os.geteuid(), 0))


def _who_else_may_rename_in(status: os.stat_result) -> str | None:
    """Why someone else could rename or remove the entries of a folder on the way, or None. Root's folders and
    yours are trusted; a sticky one (``/tmp``) lets no one else touch your entries; a group-writable one is
    fine where its group holds no one but the folder's owner (a user private group: Debian's OpenSSH allows
    the same, so ``umask 002`` does not make every folder of a user's suspect)."""
    if status.st_uid not in (os.geteuid(), 0):
        return f"belongs to {owner_name(status.st_uid)}"
    mode = stat.S_IMODE(status.st_mode)
    if mode & stat.S_ISVTX:
        return None
    if mode & stat.S_IWOTH:
        return f"other users can write into (mode {mode:04o})"
    if mode & stat.S_IWGRP:
        others = _other_members(status.st_gid, status.st_uid)
        if others:
            return f"other members of its group {others} can write into (mode {mode:04o})"
    return None


def _other_members(gid: int, owner: int) -> str:
    """``staff (bob, carol)``: the group ``gid`` as a refusal names it, where someone but ``owner`` is in it (by
    its member list, or as their primary group); empty where no one else is."""
    try:
        group = grp.getgrgid(gid)
    except KeyError:  # a group without a name: who is in it cannot be told
        return f"gid {gid}"
    try:
        owner_login = pwd.getpwuid(owner).pw_name
    except KeyError:
        owner_login = None
    members = set(group.gr_mem) | {user.pw_name for user in pwd.getpwall() if user.pw_gid == gid}
    others = sorted(members - {owner_login})
    if not others:
        return ""
    listed = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
    return f"{group.gr_name} ({listed})"


def length_fault(path: Path | str) -> str | None:
    """Why ``path`` is too long to be used (the ENAMETOOLONG it would meet), as a clause, or None."""
    encoded = os.fsencode(path)
    if any(len(name) > NAME_MAX_BYTES for name in encoded.split(b"/")):
        return f"a name in it is longer than the {NAME_MAX_BYTES} bytes a file name may have"
    if len(encoded) > PATH_MAX_BYTES:
        return f"it is longer than the {PATH_MAX_BYTES + 1:,} bytes a path may have"
    return None


def refuse_a_path_too_long(label: str, path: Path | str) -> None:
    """The one rule for the length of every path given on the command line: a ConfigError naming it
    (``label``: the flag, or ``workload file``) and saying to give a shorter one, if it is too long."""
    fault = length_fault(path)
    if fault is not None:
        shorter = label if label.startswith("--") else "path"
        raise ConfigError(f"{label} {shown(str(path))}: {fault}: give a shorter {shorter}.")


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
