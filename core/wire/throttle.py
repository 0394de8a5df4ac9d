"""Refused lines in the run's journal, and the limit on how often they reach it.

Refused lines (garbage on the app's socket, a bad line on the rank channel) belong in ``events.jsonl``:
they say someone or something spoke nonsense to the run. A flood of them must not bury the run's own
events or fill the disk, so each source journals at most ``burst`` of them per ``window_s`` and counts
the rest; the next record let through carries that count (``held_back``), and at the end ``flush``
gives what is left to count, so nothing goes unsaid.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from torchlab.core.wire.events import LineRefused, LinesRefusedUnrecorded


class Throttle:
    """Lets ``burst`` records through per window of ``window_s`` seconds; thread-safe."""

    def __init__(self, burst: int = 20, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst = burst
        self.window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._window_start = clock()
        self._admitted = 0
        self._held_back = 0

    def admit(self) -> int | None:
        """None: hold this record back (it is counted). Otherwise, write it, with the returned number of
        records held back since the last one let through."""
        with self._lock:
            now = self._clock()
            if now - self._window_start >= self.window_s:
                self._window_start, self._admitted = now, 0
            if self._admitted >= self.burst:
                self._held_back += 1
                return None
            self._admitted += 1
            held_back, self._held_back = self._held_back, 0
            return held_back

    def flush(self) -> int:
        """The records held back since the last one let through (to journal as a count at the end)."""
        with self._lock:
            held_back, self._held_back = self._held_back, 0
            return held_back


class RefusedLines:
    """The journal's records of the lines one channel refused (``app socket``, ``rank channel``):
    ``line_refused`` for at most a burst a window, and at the end ``lines_refused_unrecorded`` with the
    count of what was held back since the last one. The caller writes the records it is given."""

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self.throttle = Throttle()

    def record(self, step: int, reason: str, *, before_hello: bool, refused_by: str = "") -> LineRefused | None:
        """The event to journal for this refusal, or None to hold it back (it is counted)."""
        held_back = self.throttle.admit()
        if held_back is None:
            return None
        return LineRefused(step=step, channel=self.channel, reason=reason, before_hello=before_hello, refused_by=refused_by, held_back=held_back)

    def unrecorded(self, step: int) -> LinesRefusedUnrecorded | None:
        """At the end: the event of the refusals held back since the last one written, if any were."""
        count = self.throttle.flush()
        if not count:
            return None
        return LinesRefusedUnrecorded(step=step, channel=self.channel, count=count)
