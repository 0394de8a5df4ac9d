"""The run failed: say why, show the traceback or the non-finite report, and offer a way on."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

from torchlab.tui.state import Failure

#: What the screen dismisses with.
RESTART, CLOSE, QUIT = "restart", "close", "quit"


class ErrorScreen(ModalScreen[str]):
    """Shows a ``Failure``; dismisses with "restart", "close" (look at the run) or "quit".

    The app underneath keeps draining the link and drawing, so the curves up to the failure stay
    visible behind the dialog and after it closes.
    """

    DEFAULT_CSS = """
    ErrorScreen {
        align: center middle;
        background: $background 60%;
    }
    ErrorScreen > #error-dialog {
        width: 90%;
        max-width: 120;
        height: 90%;
        border: thick $error;
        background: $surface;
        padding: 0 1;
    }
    ErrorScreen #error-title { text-style: bold; color: $error; width: 1fr; }
    ErrorScreen #error-message { width: 1fr; margin-bottom: 1; }
    ErrorScreen #error-detail-scroll { height: 1fr; border: round $panel; }
    ErrorScreen #error-keys { color: $text-muted; width: 1fr; }
    ErrorScreen #error-buttons { height: auto; align-horizontal: right; }
    ErrorScreen #error-buttons Button { margin-left: 1; min-width: 10; }
    """

    AUTO_FOCUS = "#restart"  # on activation, by Textual: also safe when a key dismisses it at once

    BINDINGS = [
        Binding("r", "choose('restart')", "Restart"),
        Binding("escape", "choose('close')", "Close"),
        Binding("q", "choose('quit')", "Quit"),
    ]

    def __init__(self, failure: Failure, restart_from: str | None = None) -> None:
        """``restart_from``: the checkpoint a restart resumes from (None: there is none, it starts over)."""
        super().__init__()
        self.failure = failure
        self.restart_from = restart_from

    def compose(self) -> ComposeResult:
        failure = self.failure
        title = "The run stopped on a non-finite value" if failure.kind == "nonfinite" else "The run failed"
        step = f" at step {failure.step}" if failure.step is not None else ""
        with Vertical(id="error-dialog"):
            yield Label(f"{title}{step}", id="error-title")
            yield Static(Text(failure.message), id="error-message")
            with VerticalScroll(id="error-detail-scroll"):
                yield Static(Text(failure.detail or "(no details)"), id="error-detail")
            restart = f"r restarts from {self.restart_from}" if self.restart_from else "r starts the run over (no checkpoint yet)"
            yield Label(f"{restart} · esc closes this to look at the run · q quits", id="error-keys")
            with Horizontal(id="error-buttons"):
                yield Button("Restart", id="restart", variant="primary",
                             tooltip=f"Start a new trainer from {self.restart_from}" if self.restart_from else "Start the run over")
                yield Button("Close", id="close")
                yield Button("Quit", id="quit", variant="error")

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id or CLOSE)

    def action_choose(self, choice: str) -> None:
        self.dismiss(choice)
