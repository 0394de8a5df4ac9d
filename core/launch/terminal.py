"""Whether this process can draw the app: the commands that open it full screen (``torchlab-tui`` itself, ``attach``,
``compare``) ask here first, once every other check has passed and before anything is spent.

``torchlab-tui attach RUN > file`` drew the app's escape codes into the file and hung at "connecting", waiting for
keys that could not come. The app needs a terminal for its output and its keys, unless Textual draws somewhere else:
a browser tab of ``torchlab-tui serve`` (textual-serve names its driver in ``TEXTUAL_DRIVER``, and pipes both).

Standard library only.
"""

from __future__ import annotations

import os
import sys

from torchlab.core.errors import ConfigError


class NotATerminal(ConfigError):
    """The app cannot be drawn here; the message says why and what to run instead (exit 2: nothing ran)."""


def require_terminal(command: str, instead: str) -> None:
    """NotATerminal if ``command``'s app would draw into a file or a pipe; ``instead``: what shows the same without
    the app ("`torchlab-tui attach` lists the runs"), the refusal's last words."""
    redirected = redirected_streams()
    if redirected:
        raise NotATerminal(f"not opened: {command} draws full screen, and its {' and '.join(redirected)} "
                           f"{'is' if len(redirected) == 1 else 'are'} not a terminal (a file or a pipe); run it from "
                           f"a terminal. {instead}")


def redirected_streams() -> list[str]:
    """Which of this process's "output" and "input" the app would need a terminal on and has none; empty where it
    can draw (a terminal, or a driver of Textual's that draws elsewhere)."""
    if os.environ.get("TEXTUAL_DRIVER"):  # the app draws where its driver says (a browser tab)
        return []
    return [name for name, stream in (("output", sys.stdout), ("input", sys.stdin)) if not _is_terminal(stream)]


def _is_terminal(stream: object) -> bool:
    isatty = getattr(stream, "isatty", None)  # a stream closed or replaced by a caller's object may lack it
    try:
        return bool(isatty and isatty())
    except ValueError:  # closed
        return False
