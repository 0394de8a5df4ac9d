"""The frame shared by the app's full-size views (profiles, impact, system): a title, a body, a key line.

They are modal on purpose: the app refuses trainer keys while a modal screen is on top
(``TorchlabApp.check_action``), so a letter typed in a table never changes the run underneath.
The app calls ``show_state`` on the top screen at every redraw; a view redraws when its part of the
state moved.
"""

from __future__ import annotations

from textual.binding import Binding
from textual.screen import ModalScreen

from torchlab.tui.state import RunState


class ViewScreen(ModalScreen[None]):
    """A full-size modal view; escape or q goes back. Subclasses compose ``#view`` and implement ``show_state``."""

    DEFAULT_CSS = """
    ViewScreen {
        align: center middle;
        background: $background 60%;
    }
    ViewScreen > #view {
        width: 100%;
        height: 100%;
        border: round $primary;
        border-title-color: $text;
        border-title-style: bold;
        background: $surface;
        padding: 0 1;
    }
    ViewScreen .view-status { color: $text-muted; width: 1fr; height: auto; }
    ViewScreen .view-keys { color: $text-muted; width: 1fr; height: 1; text-wrap: nowrap; text-overflow: ellipsis; }
    ViewScreen .view-empty { color: $text-muted; width: 1fr; height: auto; padding: 1 0; }
    ViewScreen DataTable { height: 1fr; scrollbar-size-vertical: 1; }
    """

    BINDINGS = [Binding("escape,q", "close", "Back")]

    def __init__(self, state: RunState | None = None) -> None:
        super().__init__()
        self.state = state  # the run this view follows (None: a view of something fixed, a profile table)
        self._seen_version = -1  # the version of its part of the state that it last drew

    def show_state(self, state: RunState) -> None:
        """Redraw from the run state if what this view shows changed (called at every app redraw)."""

    def action_close(self) -> None:
        self.dismiss(None)
