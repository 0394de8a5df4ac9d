"""The system panel at full size: for a small terminal, where the main screen has room for one line of it."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Label

from torchlab.tui.screens.view_screen import ViewScreen
from torchlab.tui.state import RunState
from torchlab.tui.widgets.system_panel import SystemPanel


class SystemScreen(ViewScreen):
    """Every GPU, host CPU and RAM, the trainer's memory and its history; live."""

    DEFAULT_CSS = """
    SystemScreen SystemPanel { height: 1fr; }
    """

    BINDINGS = [Binding("t", "close", "Back", show=False)]

    def __init__(self, state: RunState) -> None:
        super().__init__()
        self.state = state
        self._seen_version = -1

    def compose(self) -> ComposeResult:
        with Vertical(id="view"):
            yield SystemPanel(id="system-detail")
            yield Label("esc back · figures about once a second; n/a = the driver does not report it", classes="view-keys")

    def on_mount(self) -> None:
        self.query_one("#view").border_title = "system"
        self.show_state(self.state)

    def show_state(self, state: RunState) -> None:
        if state.telemetry_version != self._seen_version:
            self._seen_version = state.telemetry_version
            self.query_one(SystemPanel).show(state)
