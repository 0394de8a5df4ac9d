"""The files an export writes (``torchlab-tui export``): never through a link, and never a copy of one.

A run may be someone else's (a run directory in ``/tmp``), and so may the place an export writes to: a
``trace.json`` linked to ``/etc/shadow`` was copied, world-readable, into a TensorBoard folder, and a CSV
path that was a link was written through. So:

- ``output_file`` writes a new file with ``O_CREAT | O_EXCL | O_NOFOLLOW``: whatever is at the path, a link
  included, makes it fail rather than be written through. ``replace=True`` (``--force``; a trace copied) writes a
  temporary file beside the path and renames it over: the name is replaced, a link at it included, and
  the file it pointed at is untouched. Only a regular file (or a link's name) is replaced: a FIFO or a device
  put at the path meanwhile is an UnsafeFileError, and stays (core/launch/export.py refuses one before writing).
  A reader never sees half a file, and a failed write leaves none.
- A copy (a profiler trace into a TensorBoard folder, core/engine/measure/tensorboard.py) reads its source with
  ``open_regular`` (no link, no FIFO or device: an UnsafeFileError names it) and writes it through
  ``output_file``: a read and a write of our own, never ``shutil.copy``, which follows links.
- What is written follows storage's rule: 0600 in a private folder, 0666 less the umask elsewhere.

Where an export may write at all (not into a run, existing paths only with ``--force``) is the command's
rule: core/launch/export.py. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from torchlab.core.records.storage import create_file, fsync_directory, temporary_name
from torchlab.core.safe_open import UnsafeFileError, kind_of

#: A file is copied this much at a time (a profiler trace can be hundreds of megabytes).
COPY_CHUNK = 1024 * 1024


@contextlib.contextmanager
def output_file(path: Path, *, replace: bool, text: bool = False) -> Iterator[IO[Any]]:
    """A file to write ``path`` through: binary, or (``text``) UTF-8 text written as given (no newline
    translation). ``replace=False``: ``path`` must be new (FileExistsError otherwise, for a link too).
    ``replace=True``: a temporary file renamed over ``path`` when the block ends. If the block raises, what
    it wrote is removed and ``path`` is as it was."""
    path = Path(path)
    written = temporary_name(path) if replace else path
    descriptor = create_file(written, os.O_WRONLY | os.O_EXCL)
    try:
        with (open(descriptor, "w", encoding="utf-8", newline="") if text else open(descriptor, "wb")) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        if replace:
            _require_replaceable(path)
            os.replace(written, path)
            fsync_directory(path.parent)
    except BaseException:
        written.unlink(missing_ok=True)
        raise


def _require_replaceable(path: Path) -> None:
    """``path`` is nothing, a regular file or a link (its name is replaced), or an UnsafeFileError: never a FIFO,
    a device, a socket or a folder, which a rename would take from whoever uses it (``/dev/null`` as root)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise UnsafeFileError(path, kind_of(mode), expected="a regular file that --force may replace")
