"""The event log's levels: each line's mark and colour (tui/widgets/event_log.py ``LEVEL_MARKS``), and which lines a
notice shows with which severity (tui/app_notices.py). One definition, so that a level the log draws and a level a
part of the app logs at cannot drift apart."""

from __future__ import annotations

from enum import StrEnum


class EntryLevel(StrEnum):
    """What kind of line an event-log entry is."""

    INFO = "info"
    APPLIED = "applied"  # a change acknowledged by the trainer
    REFUSED = "refused"  # a change or a line the trainer refused
    CHECKPOINT = "checkpoint"
    WARNING = "warning"
    ERROR = "error"
    TRAINER = "trainer"  # a line of the trainer's own output (its log file's tail)
    PROFILE = "profile"  # a profile snapshot ready
    IMPACT = "impact"  # an impact verdict
