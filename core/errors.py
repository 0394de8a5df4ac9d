"""The errors a user can act on, and the exit statuses of every torchlab-tui process.

Each error carries a message that names what to change (a setting, a file and line, an option). The CLI
prints them as one paragraph and exits with ``exit_status`` (2: bad input; 1: a run that failed, such as a
full disk); the app shows the paragraph, without a traceback, and exits with the same status. Anything else
that escapes is a bug in torchlab or an error inside the user's training step, reported with its traceback.
"""

from __future__ import annotations

import reprlib


class TorchlabError(Exception):
    """Base for errors whose message is written for the user."""


class ConfigError(TorchlabError):
    """A configuration value is invalid; the message names the setting."""


class WorkloadError(TorchlabError):
    """The workload cannot be loaded or cannot train; the message names the file and line at fault."""


class WorkloadExited(WorkloadError):
    """The workload's code called ``sys.exit`` (raised SystemExit); the message names the file and line. The run
    failed, whatever status it asked for: left to rise, it ended torchlab with that status, 0 as a finished run
    and 3 as a non-finite stop, and nothing was said."""


class StorageError(TorchlabError):
    """A file of the run could not be written (disk full, no permission); the message says which and
    what is still intact."""


class ForecastError(TorchlabError):
    """A step whose memory cannot be predicted on fake tensors (an op whose result depends on the data); the message
    names the op. Nothing failed but the prediction: the model may train."""


class HangEnded(TorchlabError):
    """A run ended at a hung step, as its user chose (core/engine/parallel/hang_watch.py): its ranks were stuck in a
    collective, so it has no final checkpoint; the message names the last."""


class NonFiniteError(TorchlabError):
    """Training produced NaN/Inf; carries the report that localises it."""

    def __init__(self, message: str, report: dict) -> None:
        super().__init__(message)
        self.report = report


#: How a torchlab-tui process exits, the app's as a headless run's and every subcommand's: 0 finished, stopped on
#: request or detached; 1 a run that failed (the workload raised or exited while training, a file could not be
#: written); 2 bad input (a setting, a workload that cannot load or take its first step, a refused directory or
#: file); 3 stopped on a non-finite loss or gradient, and only that; 130 interrupted (Ctrl-C).
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NONFINITE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


def exit_status(error: TorchlabError) -> int:
    """The status a process that stopped on ``error`` exits with."""
    if isinstance(error, NonFiniteError):
        return EXIT_NONFINITE
    return EXIT_FAILED if isinstance(error, (StorageError, WorkloadExited, ForecastError, HangEnded)) else EXIT_USAGE


#: How much of a value given by someone else a message repeats: each string, number and item, and the whole.
SHOWN_CHARS = 40
_shown = reprlib.Repr()
_shown.maxstring = _shown.maxlong = _shown.maxother = SHOWN_CHARS
_shown.maxlevel, _shown.maxlist, _shown.maxdict, _shown.maxtuple = 2, 3, 3, 3


def printable(text: object, *, keep_lines: bool = False) -> str:
    """``text`` as a terminal may show it: each control character (an escape sequence's ESC, a bell, a C1 control
    such as ``\\x9b``, a bidi override, a zero-width letter, half a surrogate, a newline) written as Python escapes
    it, ``\\x1b``; every other letter, of any script, as it is. A name or path someone chose (a workload file, a run
    directory, a runtime entry, a peer's words) must not retitle, clear or rewrite the user's terminal, nor pass one
    line for two. ``keep_lines``: ``text`` is a whole message, whose own line breaks stay line breaks; each line is
    escaped. Every message that can repeat such a value goes through here where it is printed (the CLI's error
    paragraph, argparse's refusal, each command's lines); ``shown`` escapes the same characters by ``repr``."""
    text = str(text)
    if keep_lines:
        return "\n".join(printable(line) for line in text.split("\n"))
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def shown(value: object) -> str:
    """A value someone gave (a flag, a TOML value, a peer's message), as a message may repeat it: its
    repr, cut with ``...``. Repeated whole, a 1 MB string or a 4,000-digit number would become a 1 MB
    error paragraph, refusal, or line of the run's journal. reprlib cuts each string, number and
    container's items; the whole of a nested value is cut here too."""
    text = _shown.repr(value)
    return text if len(text) <= 2 * SHOWN_CHARS else text[: 2 * SHOWN_CHARS - 3] + "..."
