"""The ``?`` screen: every key of the workbench and what it does, in one place; ``?``, escape or q closes it."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Label, Static

from torchlab.tui.screens.view_screen import OverlayScreen, closing_key
from torchlab.tui.widgets.stats_bar import PHASE_STYLES


class HelpScreen(OverlayScreen):
    """Lists ``(key, description)`` pairs given by the app, so the help never disagrees with the bindings."""

    DEFAULT_CSS = """
    HelpScreen {
        align: center middle;
        background: $background 60%;
    }
    HelpScreen > VerticalScroll {
        width: 72;
        max-width: 95%;
        height: auto;
        max-height: 90%;
        border: thick $primary;
        background: $surface;
        padding: 0 1;
    }
    HelpScreen #help-title { text-style: bold; }
    HelpScreen #help-footer { color: $text-muted; width: 100%; }  /* a Label is as wide as its text: cut at the edge */
    """

    BINDINGS = [closing_key("escape,question_mark,q", "Close", show=True)]

    def __init__(self, keys: list[tuple[str, str]]) -> None:
        super().__init__()
        self.keys = keys

    def compose(self) -> ComposeResult:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        for key, description in self.keys:
            table.add_row(key, description)
        with VerticalScroll():
            yield Label("torchlab-tui keys", id="help-title")
            yield Static(table)
            yield Static(phase_legend(), id="help-phases")
            yield Label(
                "Changes apply at the next optimizer step; the event log shows the step each took effect at, "
                "or why the trainer refused it. Every action is also in the command palette (ctrl+p).",
                id="help-footer",
            )


def phase_legend() -> Text:
    """The stats line's bar of where a step's time goes, its colours named (tui/widgets/stats_bar.py)."""
    legend = Text("The stats line's bar, where the last steps' time went: ", style="dim")
    for phase, style in PHASE_STYLES.items():
        legend.append(f"█ {phase}  ", style=style)
    return legend

