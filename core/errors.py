"""The errors a user can act on.

Each one carries a message that names what to change (a setting, a file and line, an option). The CLI
prints them as one paragraph and exits 2; the app shows them in a panel. Anything else that escapes
is a bug in torchlab or an error inside the user's training step, reported with its traceback.
"""

from __future__ import annotations


class TorchlabError(Exception):
    """Base for errors whose message is written for the user."""


class ConfigError(TorchlabError):
    """A configuration value is invalid; the message names the setting."""


class WorkloadError(TorchlabError):
    """The workload cannot be loaded or cannot train; the message names the file and line at fault."""


class StorageError(TorchlabError):
    """A file of the run could not be written (disk full, no permission); the message says which and
    what is still intact."""


class NonFiniteError(TorchlabError):
    """Training produced NaN/Inf; carries the report that localises it."""

    def __init__(self, message: str, report: dict) -> None:
        super().__init__(message)
        self.report = report


#: How much of a value given by someone else an error message repeats.
SHOWN_CHARS = 60


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)``, cut to ``limit`` characters with an ellipsis: a message names what was given
    without echoing a megabyte of it back to a terminal, a socket or the run's journal."""
    try:
        text = repr(value[: limit + 1] if isinstance(value, str) else value)
    except ValueError:  # an integer over Python's 4300-digit limit
        return "an integer too long to show"
    return text if len(text) <= limit else text[:limit] + "…"
