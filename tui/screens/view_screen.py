"""The frame shared by the app's full-size views (profiles, impact, system): a title, a body, a key line.

They are modal on purpose: the app refuses trainer keys while a modal screen is on top
(``TorchlabApp.check_action``), so a letter typed in a table never changes the run underneath.
The app calls ``show_state`` on the top screen at every redraw; a view redraws when its part of the
state moved.

The views and the help share ``OverlayScreen``: the keys that close them act in the order typed, however fast.
"""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.timer import Timer

from torchlab.tui.key_order import act_on_key
from torchlab.tui.log_levels import EntryLevel
from torchlab.tui.state import RunState
from torchlab.tui.widgets.event_log import LEVEL_MARKS


def closing_key(keys: str, description: str = "Back", *, show: bool = False) -> Binding:
    """A binding of ``keys`` that closes the ``OverlayScreen`` it is on as the key arrives (see there why)."""
    return Binding(keys, "close", description, show=show, priority=True)


class OverlayScreen(ModalScreen[None]):
    """A screen over the main one that a key closes (help, the views); escape or q does.

    Keys typed fast arrive together, and the app routes each to the screen on top before it has handled the one
    typed before it. A closing key without priority acted only once it had come up from the screen to the app; the
    keys after it had gone to this screen, still on top, and came up behind it: in ``? Esc m 2 Enter``, ``m``
    opened the accum prompt, and ``2`` was looked up as a key of the prompt, not typed into its field, so nothing
    was sent. Bound with priority (``closing_key``), a closing key closes the screen as it arrives, and each key
    after it is routed to the screen then on top, a prompt's field included.

    The keys typed before the closing key were routed here, and they act here, each as it reaches this screen
    (``key_order.act_on_key``), and go no further. Left to come up to the app, a key could get there once the
    closing key had closed this screen, and be looked up on the main one: ``t o Esc`` typed fast sorted the
    gradient table. A key that reaches this screen once it has closed stops here.
    """

    BINDINGS = [closing_key("escape,q", show=True)]

    async def on_key(self, event: events.Key) -> None:
        if self in self.app.screen_stack and not self.is_active:
            return  # covered by a screen it opened (a profile's table) since the key was routed: looked up there
        event.stop()
        event.prevent_default()
        if self.is_active:
            await act_on_key(self.focused or self, event.key)

    def action_close(self) -> None:
        self.dismiss(None)


class ViewScreen(OverlayScreen):
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

    def __init__(self, state: RunState | None = None) -> None:
        super().__init__()
        self.state = state  # the run this view follows (None: a view of something fixed, a profile table)
        self._seen_version = -1  # the version of its part of the state that it last drew
        #: the frame's bottom border as the view set it, while a notice stands in it (None: none does)
        self._subtitle_under_notice: str | Text | None = None
        self._notice_timer: Timer | None = None

    def show_notice(self, text: str, level: str, timeout: float) -> None:
        """A notice (an acknowledgement, a refusal: the app's ``show_notice``) in the frame's bottom border for
        ``timeout`` seconds: the view covers the event log, and a toast covered its lines. The border holds no
        data; what the view had there (a profile's directory) comes back after."""
        frame = self.query_one("#view")
        if self._notice_timer is not None:
            self._notice_timer.stop()
        else:
            self._subtitle_under_notice = frame.border_subtitle or ""
        mark, style = LEVEL_MARKS.get(level, ("·", ""))
        frame.border_subtitle = Text.assemble((mark, style), " ", (text, style if level != EntryLevel.INFO else ""))
        self._notice_timer = self.set_timer(timeout, self._end_notice)

    def _end_notice(self) -> None:
        self.query_one("#view").border_subtitle = self._subtitle_under_notice or ""
        self._subtitle_under_notice, self._notice_timer = None, None

    def show_state(self, state: RunState) -> None:
        """Redraw from the run state if what this view shows changed (called at every app redraw)."""
