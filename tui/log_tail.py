"""Follow ``trainer.log`` from where the last read stopped, the way ``tail -f`` does, without blocking.

The trainer's stdout and stderr go to a file (printing to the terminal would scribble over the app),
and the app shows new lines of it in the event log: those written since its link started, not the
file's older ones (an earlier trainer's, or, attached, the run's output before this app came: at the
end of the log they read as news, below the replayed events they are older than). Reads are bounded
per call, a line is only emitted once its newline arrived, and a file that shrank (rotated or
rewritten) is followed from its start again.

Not every line is for the event log: torch's C++ side logs to stderr in its own format (c10's
``[W1123 07:45:12.901699812 CPUAllocator.cpp:245] Memory block of unknown size…`` from the profiler,
the profiler's ``USDT:2026-11-23 21:00:42 30607:30607 SyncActivityProfilerHandler.cpp:52] profiler_start``).
Those stay in ``trainer.log``, where they are next to the rest of the trainer's output; the event log is for
what the user can act on, and at 80x24 a burst of them pushed the acknowledgements out of its six lines.
"""

from __future__ import annotations

import re
from pathlib import Path

from torchlab.core.safe_open import open_regular

#: The head of a line torch's C++ code logged: ``[W1123 07:45:12.9 file.cpp:245]``, ``[W file.cpp:245]``
#: (older c10), ``USDT:…`` or ``STAGE:…`` then the time and ids (the profiler's), each ending in its source
#: file and line.
_NATIVE_LOG_HEAD = re.compile(r"(\[[IWEF]|[A-Z]{2,8}:)[^\]\n]{0,80}?[\w-]+\.(?:cpp|cc|cu|cuh|c|h|hpp):\d+\] ")


def is_native_torch_log(line: str) -> bool:
    """Whether ``line`` is a log line of torch's C++ side (it stays in trainer.log, out of the event log)."""
    return _NATIVE_LOG_HEAD.match(line) is not None


class LogTail:
    """New complete lines of a growing text file, per call to ``read_lines``."""

    def __init__(self, path: Path, *, start: int = 0, max_bytes: int = 64 * 1024) -> None:
        """``start``: the file's size when the trainer whose lines are news began writing to it (the link's
        ``log_start``)."""
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._offset = start
        self._partial = b""

    def read_lines(self) -> list[str]:
        """Lines completed since the last call (at most ``max_bytes`` of them); [] when the file is not there yet."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self._offset:
            self._offset, self._partial = 0, b""
        if size == self._offset:
            return []
        with open(self.path, "rb", opener=open_regular) as handle:  # no link, no FIFO (UnsafeFileError)
            handle.seek(self._offset)
            data = handle.read(self.max_bytes)
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > self.max_bytes:  # a line without end: show what there is
            lines.append(self._partial)
            self._partial = b""
        return [line.decode("utf-8", "replace").rstrip("\r") for line in lines]
