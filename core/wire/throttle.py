"""Refusals in the run's journal, and the one rule that limits how often a peer can put one there.

A peer can make the run refuse without end: garbage on the app's socket, a bad line on the rank channel (refused
lines), and commands that read well but that the trainer will not carry out (a `set` of an unknown option, a
trial it cannot run). They belong in ``events.jsonl``: they say someone or something spoke nonsense to the run.
A flood of them must not bury the run's own events or fill the disk (a flood of unknown options added 2.5 MB/s),
so each source journals at most ``burst`` of them per ``window_s`` and counts the rest; the count reaches the
journal with the next one let through (a refused line's ``held_back``; before a refused command, a
``lines_refused_unrecorded`` record), and at the end the rest is counted, so nothing goes unsaid.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from torchlab.core.errors import StorageError
from torchlab.core.wire.events import LineRefused, LinesRefusedUnrecorded
from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.wire.observer import TrainerObserver
from torchlab.core.wire.payloads import TelemetrySample
from torchlab.core.wire.protocol import Message, OptionRefused, TrialResult


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


def refuses_a_command(event: Message) -> bool:
    """Whether ``event`` is the trainer refusing a command it was sent: an option it will not set or a profile it
    will not take (``option_refused``), a trial it could not run (a ``trial_result`` with an error)."""
    return isinstance(event, OptionRefused) or (isinstance(event, TrialResult) and event.error is not None)


class RefusedCommands(TrainerObserver):
    """The run's journal (``journal``) as the trainer reports to it, with its refusals of commands held to the rule
    of refused lines: at most a burst a window, the rest counted (``lines_refused_unrecorded``, channel
    ``commands``). Everything else passes as it is. The app is told of every refusal all the same: only the
    journal is spared. ``close`` counts what is left, at the run's end."""

    channel = "commands"

    def __init__(self, journal: TrainerObserver) -> None:
        self._journal = journal
        self._refusals = RefusedLines(self.channel)

    def on_metrics(self, row: MetricsRow) -> None:
        self._journal.on_metrics(row)

    def on_telemetry(self, sample: TelemetrySample) -> None:
        self._journal.on_telemetry(sample)

    def before_checkpoint(self, step: int) -> None:
        """Passed on as every record is: the journal writes the rows it holds before the checkpoint lands. Left to the
        observer's default (nothing), the app's trainer process kept them held while ``last.pt`` moved past them, and
        a kill then lost the rows of steps the checkpoint holds for good (found by the combination matrix:
        app_error_restart, steps 7 and 8 missing after a restart from step 8)."""
        self._journal.before_checkpoint(step)

    def leaving(self, status: str, step: int, message: str) -> None:
        self._journal.leaving(status, step, message)  # the journal's files closed before the process leaves

    def on_event(self, event: Message) -> None:
        if refuses_a_command(event):
            held_back = self._refusals.throttle.admit()
            if held_back is None:
                return
            if held_back:
                self._journal.on_event(LinesRefusedUnrecorded(step=event.step, channel=self.channel, count=held_back))
        self._journal.on_event(event)

    def close(self, step: int) -> None:
        """At the end: journal the count of the refusals held back since the last one written, if any were."""
        unrecorded = self._refusals.unrecorded(step)
        if unrecorded is None:
            return
        try:
            self._journal.on_event(unrecorded)
        except StorageError:
            pass  # the run is over and its journal full: only this count is lost, and the run's own end stands
