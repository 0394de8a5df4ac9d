"""The event log: acknowledgements with their step, refusals with the reason, checkpoints, trainer output."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import RichLog

from torchlab.tui.state import LogEntry

#: level -> (mark, style)
LEVEL_MARKS = {
    "info": ("·", "dim"),
    "applied": ("✓", "bold green"),
    "refused": ("✗", "bold red"),
    "checkpoint": ("◆", "bold cyan"),
    "warning": ("!", "bold yellow"),
    "error": ("✖", "bold red"),
    "trainer": ("│", "dim"),
    "profile": ("◷", "bold magenta"),
    "impact": ("Δ", "bold magenta"),
}


class EventLog(RichLog):
    """A bounded, scrolling log; it keeps the last ``max_lines`` lines so a long run stays small."""

    DEFAULT_CSS = """
    EventLog {
        scrollbar-size-vertical: 1;
    }
    """

    def __init__(self, *, max_lines: int = 2000, id: str | None = None, classes: str | None = None) -> None:
        # min_width: lines wrap at the panel's width (RichLog's default of 78 cuts them in a narrower panel)
        super().__init__(max_lines=max_lines, min_width=20, wrap=True, markup=False, highlight=False, id=id, classes=classes)
        #: every line written, as plain text: tests and the clipboard read this, not the rendered strips
        self.lines_written: list[str] = []

    def add(self, entry: LogEntry) -> None:
        mark, style = LEVEL_MARKS.get(entry.level, ("·", ""))
        step = f"{entry.step:>6}" if entry.step is not None else " " * 6
        gutter = Text.assemble((step, "dim"), " ", (mark, style), " ")
        body = Text(entry.text, style="dim" if entry.level == "trainer" else ("red" if entry.level == "error" else ""))
        self.write(_hanging(gutter, body))
        self.lines_written.append(gutter.plain + body.plain)
        if len(self.lines_written) > self.max_lines:
            del self.lines_written[: len(self.lines_written) - self.max_lines]


def _hanging(gutter: Text, body: Text) -> Table:
    """The entry with a hanging indent: where the text needs a second row (a long reason, a trainer's warning at
    80 columns) it goes on under the text, so the step column shows only steps and each entry reads as one."""
    grid = Table.grid()
    grid.add_column(width=gutter.cell_len, no_wrap=True)
    grid.add_column(ratio=1, overflow="fold")  # a path longer than the row is folded, not cut
    grid.add_row(gutter, body)
    return grid
