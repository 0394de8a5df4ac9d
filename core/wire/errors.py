"""The errors a user can act on.

Each one carries a message that names what to change (a setting, a file and line, an option). The CLI
prints them as one paragraph and exits 2; the app shows them in a panel. Anything else that escapes
is a bug in torchlab or an error inside the user's training step, reported with its traceback.
"""

from __future__ import annotations

import reprlib


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


#: How much of a value given by someone else a message repeats: each string, number and item, and the whole.
SHOWN_CHARS = 40
_shown = reprlib.Repr()
_shown.maxstring = _shown.maxlong = _shown.maxother = SHOWN_CHARS
_shown.maxlevel, _shown.maxlist, _shown.maxdict, _shown.maxtuple = 2, 3, 3, 3


def shown(value: object) -> str:
    """A value someone gave (a flag, a TOML value, a peer's message), as a message may repeat it: its
    repr, cut with ``...``. Repeated whole, a 1 MB string or a 4,000-digit number would become a 1 MB
    error paragraph, refusal, or line of the run's journal. reprlib cuts each string, number and
    container's items; the whole of a nested value is cut here too."""
    text = _shown.repr(value)
    return text if len(text) <= 2 * SHOWN_CHARS else text[: 2 * SHOWN_CHARS - 3] + "..."
