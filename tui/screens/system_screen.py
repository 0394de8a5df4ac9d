"""The system panel at full size, and the rank table above world size 1: for a small terminal, where the
main screen has room for one line of each."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label

from torchlab.tui.screens.view_screen import ViewScreen, closing_key
from torchlab.tui.state import RunState
from torchlab.tui.widgets.rank_table import RankTable
from torchlab.tui.widgets.system_panel import SystemPanel

#: Ranks listed in this view before the rest are summed up in a line.
VIEW_ROWS = 32


class SystemScreen(ViewScreen):
    """Every GPU, host CPU and RAM, the trainer's memory and its history, each core, the run's processes and its disk
    reads and writes; live."""

    DEFAULT_CSS = """
    SystemScreen SystemPanel { height: 1fr; }
    SystemScreen RankTable { max-height: 60%; border-top: solid $panel-lighten-2; border-title-color: $text; }
    """

    BINDINGS = [closing_key("t")]

    def __init__(self, state: RunState) -> None:
        super().__init__(state)
        self._seen_ranks: tuple[bool, int] | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="view"):
            yield SystemPanel(id="system-detail")
            yield RankTable(max_rows=VIEW_ROWS, id="ranks-detail")
            yield Label("esc back · figures about once a second; n/a = the driver does not report it", classes="view-keys")

    def on_mount(self) -> None:
        self.query_one("#view").border_title = "system"
        self.show_state(self.state)

    def show_state(self, state: RunState) -> None:
        if state.telemetry_version != self._seen_version:
            self._seen_version = state.telemetry_version
            self.query_one(SystemPanel).show(state)
        ranks = (state.has_ranks, state.ranks_version)
        if ranks != self._seen_ranks:
            self._seen_ranks = ranks
            table = self.query_one(RankTable)
            table.display = state.has_ranks
            table.show(state)
