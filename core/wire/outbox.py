"""The trainer's outbox: where events wait for the app, without ever making the trainer wait.

The trainer thread only appends (under a lock, O(1)); each connection's sender thread reads what is
new since its own cursor. Three kinds of content, three rules:

- metrics rows: a ring of the last ``metrics_capacity`` reports. A connection that falls behind
  skips ahead (old reports are dropped for it, never queued without bound). A new connection gets
  the ring first, so its curves are full at once.
- latest-wins values (gradient norms, telemetry, the impact table, per-rank figures, a trial's progress): only the newest
  is kept and sent.
- everything else (acknowledgements, state changes, checkpoints, errors): kept in order and never
  dropped for a connection that keeps up; the ring for them is large (``events_capacity``) because
  they are rare (a handful per option change).
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import TypeVar

from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.wire.protocol import GradNorms, Impact, Memory, Message, Metrics, Ranks, Replayed, Telemetry, TrialProgress

MAX_RECORDS_PER_MESSAGE = 1000
T = TypeVar("T")


@dataclass
class Cursor:
    """How far one connection has read."""

    metrics: int = 0
    events: int = 0
    latest: dict[type, int] = field(default_factory=dict)  # per latest-wins message type


class Outbox:
    def __init__(self, metrics_capacity: int = 20_000, events_capacity: int = 10_000) -> None:
        self._lock = threading.Condition()
        # Signalled only for events and close: a sender letting reports gather waits on this one.
        self._event_added = threading.Condition(self._lock)
        self._metrics: deque[tuple[int, MetricsRow]] = deque(maxlen=metrics_capacity)
        self._events: deque[tuple[int, Message]] = deque(maxlen=events_capacity)
        self._metrics_seq = 0
        self._events_seq = 0
        self._latest: dict[type, tuple[int, Message]] = {}
        self._latest_seq = 0
        self._closed = False

    # ---- producer side (the trainer thread): never blocks beyond a short lock
    def add_metrics(self, row: MetricsRow) -> None:
        with self._lock:
            self._metrics_seq += 1
            self._metrics.append((self._metrics_seq, row))
            self._lock.notify_all()

    def add_latest(self, message: GradNorms | Memory | Telemetry | Impact | Ranks | TrialProgress) -> None:
        with self._lock:
            self._latest_seq += 1
            self._latest[type(message)] = (self._latest_seq, message)
            self._lock.notify_all()

    def add_event(self, message: Message) -> None:
        with self._lock:
            self._events_seq += 1
            self._events.append((self._events_seq, message))
            self._lock.notify_all()
            self._event_added.notify_all()

    def close(self) -> None:
        """Wake every waiting sender; ``take`` then returns what is left, then None."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
            self._event_added.notify_all()

    # ---- consumer side (one sender thread per connection)
    def wait_for_event(self, cursor: Cursor, timeout: float) -> None:
        """Wait up to ``timeout`` unless an event is (or becomes) new for ``cursor``, or the outbox closes.

        Reports and latest-wins values do not cut the wait short: a sender calls this between sends
        so that they gather into fewer, larger messages, while an acknowledgement still goes at once.
        """
        with self._lock:
            if self._events_seq > cursor.events or self._closed:
                return
            self._event_added.wait(timeout)

    def take_past(self, cursor: Cursor) -> list[Message]:
        """Everything held now, without waiting, ending in ``Replayed``: a connection's first send. The app
        folds what comes before the marker as the run's past (into its log, without a toast per old event)."""
        with self._lock:
            events = min(len(self._events), self._events_seq - cursor.events)
            rows, others = self._take_new(cursor)
        return [*_batches(rows), *others, Replayed(events=events)]

    def take(self, cursor: Cursor, timeout: float) -> list[Message] | None:
        """What is new for ``cursor`` (waiting up to ``timeout``); None once closed and drained."""
        with self._lock:
            if not self._has_new(cursor):
                if self._closed:
                    return None
                self._lock.wait(timeout)
            rows, others = self._take_new(cursor)
        return [*_batches(rows), *others]

    def _take_new(self, cursor: Cursor) -> tuple[list[MetricsRow], list[Message]]:
        """What is new for ``cursor``: reports, then newest values and events in order. Called under the lock;
        the reports become messages after it (``_batches``), so that the trainer never waits for their columns."""
        messages: list[Message] = []
        rows = [row for _, row in _newest(self._metrics, self._metrics_seq - cursor.metrics)]
        cursor.metrics = self._metrics_seq
        for kind, (seq, message) in self._latest.items():
            if seq > cursor.latest.get(kind, 0):
                messages.append(message)
                cursor.latest[kind] = seq
        messages.extend(message for _, message in _newest(self._events, self._events_seq - cursor.events))
        cursor.events = self._events_seq
        return rows, messages

    def _has_new(self, cursor: Cursor) -> bool:
        return (
            self._metrics_seq > cursor.metrics
            or self._events_seq > cursor.events
            or any(seq > cursor.latest.get(kind, 0) for kind, (seq, _) in self._latest.items())
        )


def _batches(rows: list[MetricsRow]) -> list[Message]:
    """``rows`` as Metrics messages of at most ``MAX_RECORDS_PER_MESSAGE`` rows each, oldest first."""
    return [Metrics.from_rows(rows[start : start + MAX_RECORDS_PER_MESSAGE]) for start in range(0, len(rows), MAX_RECORDS_PER_MESSAGE)]


def _newest(ring: deque[tuple[int, T]], count: int) -> list[tuple[int, T]]:
    """The last ``count`` items of ``ring`` (all it holds, if fewer), oldest first.

    Read from the newest end: a sender takes what is new since its last send, a few items, and going
    through the whole ring (20k reports) for them, under the lock the trainer appends with, cost the
    trainer ~0.2 ms a step per connected app or viewer on a tiny model (benchmarks/viewer_cost.py).
    """
    newest = list(itertools.islice(reversed(ring), max(0, count)))
    newest.reverse()
    return newest
