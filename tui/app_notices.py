"""Where the app's notices go: never over the data.

Textual's toasts were drawn over whatever lay under them: ``accum = 2 applied at step 48`` over the gradient
table's module names, and over the system view's lines. A notice now lives where it covers nothing:

- every notice is a line of the event log, which keeps them all in order (an acknowledgement, a refusal and the
  trainer's news are logged by ``RunState.log``; a notice of the app's own, ``notify``, is logged here);
- on the main screen that line is the notice: the log shows its newest line at the bottom;
- a full-size view (system, impact, profiles, heatmap...) covers the log, so it shows the newest notice in its
  own frame's bottom border for a few seconds (``ViewScreen.show_notice``), a line that holds no data.

Textual still records each notification (``App.notify``: its list and timers), but its toast rack is not drawn
(app.tcss). ``notify`` is called on the app's thread (keys, handlers, the poll timer), as all of the app's are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.app import App
from textual.notifications import SeverityLevel

from torchlab.core.errors import printable
from torchlab.tui.log_levels import EntryLevel

if TYPE_CHECKING:
    from torchlab.tui.state import RunState

#: Seconds a notice stays in a view's border (Textual's toasts stayed 4-5 s).
NOTICE_S = 4.0
#: The event log's level for a notification's severity, and back.
LEVEL_OF_SEVERITY: dict[str, EntryLevel] = {"information": EntryLevel.INFO, "warning": EntryLevel.WARNING, "error": EntryLevel.ERROR}
SEVERITY_OF_LEVEL: dict[EntryLevel, SeverityLevel] = {EntryLevel.REFUSED: "warning", EntryLevel.WARNING: "warning",
                                                      EntryLevel.ERROR: "error"}


class Notices:
    """The app's notices (a mixin of ``TorchlabApp``): in the event log, and in a view's border when one is on top."""

    run_state: RunState

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = True) -> None:
        """A notice of the app's own (a key's answer, a view's hint): logged, and shown where it covers nothing.
        Always plain text: a message is a sentence of the app's, or an error's text ("[Errno 2] ...")."""
        text = printable(f"{title}: {message}" if title else message, keep_lines=True)  # an error's text names paths
        self.run_state.log(LEVEL_OF_SEVERITY.get(severity, EntryLevel.INFO), text)
        self.show_notice(text, LEVEL_OF_SEVERITY.get(severity, EntryLevel.INFO), timeout)

    def show_notice(self, text: str, level: EntryLevel, timeout: float | None = None) -> None:
        """``text`` (already in the event log, at ``level``) shown on the screen on top, if it is a view."""
        timeout = NOTICE_S if timeout is None else timeout
        App.notify(self, text, severity=SEVERITY_OF_LEVEL.get(level, "information"), timeout=timeout,  # type: ignore[arg-type]
                   markup=False)
        screen = self.screen  # type: ignore[attr-defined]
        show = getattr(screen, "show_notice", None)
        if show is not None and screen.is_mounted:  # a view pushed this instant has no frame yet: the log has it
            show(text, level, timeout)
