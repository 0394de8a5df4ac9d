"""Runs compared: one figure of every run on one chart (loss, val loss, LR, samples/s, the workload's own
metrics, each phase's time a step; against step or training time), the settings that differ between them, where
each run's time went, and each run's option changes.

Opened by ``torchlab-tui compare RUN_A RUN_B ...`` (core/launch/compare.py) or, in the app, from the command
palette against an earlier run of the same workload.

The table fits the screen's width, whatever it is: each run's column gets a share of what the setting names
leave, a value longer than its column goes on over more lines (broken after a space or one of ``/,:.-``, so a
path breaks between its folders), and the table is laid out again when the terminal is resized. At 80
columns a second run's column used to start past the edge, behind a path.
"""

from __future__ import annotations

import re

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.markup import escape
from textual.widgets import DataTable, Label, Static

from torchlab.tui.formatting import format_duration
from torchlab.tui.run_history import RunHistory, differences, figure_name
from torchlab.tui.screens.view_screen import ViewScreen
from torchlab.tui.widgets.line_chart import ChartLine, LineChart, marker

#: The setting names' column takes at most this share of the width, and never less than the narrowest.
LABEL_SHARE = 0.2
MIN_LABEL_WIDTH = 8
#: A run's column is never narrower (more runs than fit that scroll sideways).
MIN_RUN_WIDTH = 12
#: What the table spends on each column besides its text (DataTable's cell padding, one cell each side), and the
#: vertical scrollbar it keeps room for (ViewScreen's DataTable: 1 wide).
CELL_PADDING = 2
SCROLLBAR = 1
#: A piece of a value that a line may end after: the text up to and including a space, "/", ",", "-", ":" or ".".
_PIECES = re.compile(r"[^ /,:.-]*[ /,:.-]*")


class CompareScreen(ViewScreen):
    """A figure of each run, against step or time (``f`` the next figure, ``x`` step/time), then the settings
    that differ and the option changes."""

    DEFAULT_CSS = """
    CompareScreen #compare-chart { height: 1fr; min-height: 6; }
    CompareScreen #compare-legend { height: auto; }
    CompareScreen #compare-differences { height: auto; max-height: 12; }
    """

    BINDINGS = [
        Binding("f", "next_figure", "Figure"),
        Binding("x", "toggle_x", "Step/time"),
    ]

    def __init__(self, runs: list[RunHistory]) -> None:
        super().__init__()
        self.runs = runs
        shared = [key for key in runs[0].figures() if all(key in run.by_step for run in runs[1:])]
        # The figures every run has come first; one only some have still compares those.
        others = [key for run in runs for key in run.figures() if key not in shared]
        self.figures = shared + list(dict.fromkeys(others))
        self.figure = self.figures[0] if self.figures else "loss"
        self.by_time = False
        self._rows = table_rows(runs)
        self._table_width = 0  # the width the table was last laid out for

    def compose(self) -> ComposeResult:
        with Vertical(id="view"):
            yield Label(id="compare-status", classes="view-status")
            yield LineChart(id="compare-chart", empty_text="no run has this figure")
            yield Static(id="compare-legend")
            yield DataTable(id="compare-differences", cursor_type="none", zebra_stripes=True)
            yield Label("f next figure · x step or time · esc back", classes="view-keys")

    def on_mount(self) -> None:
        self.query_one("#view").border_title = "compare: " + " · ".join(escape(run.name) for run in self.runs)
        self._draw()
        self.call_after_refresh(self._fit_table)

    def on_resize(self) -> None:
        self.call_after_refresh(self._fit_table)  # once the table has its new width

    def _fit_table(self) -> None:
        width = self.query_one("#compare-differences", DataTable).size.width
        if width and width != self._table_width:
            self._table_width = width
            self._fill_table(width)
            self._draw()  # the legend, packed for the new width

    def _fill_table(self, width: int) -> None:
        """The settings that differ and the option changes, in columns that share ``width``: a value wider than its
        column goes on over more lines of its row."""
        table = self.query_one("#compare-differences", DataTable)
        table.clear(columns=True)
        names = [run.name for run in self.runs]
        label_width, run_widths = column_widths(["setting", *(setting for setting, _ in self._rows)],
                                                [[name, *(values[index] for _, values in self._rows)]
                                                 for index, name in enumerate(names)], width)
        headers = [fold(name, run_width) for name, run_width in zip(names, run_widths)]
        table.header_height = max(len(lines) for lines in headers)
        table.add_column("setting", key="setting", width=label_width)
        for index, (lines, run_width) in enumerate(zip(headers, run_widths)):
            table.add_column(Text("\n".join(lines), style="bold"), key=f"run-{index}", width=run_width)
        for setting, values in self._rows:
            cells = [fold(setting, label_width), *(fold(value, run_width) for value, run_width in zip(values, run_widths))]
            # Text, not a str: a value such as "[60:clip=0.5]" is shown as it is, never read as markup.
            table.add_row(*(Text("\n".join(lines)) for lines in cells), height=max(len(lines) for lines in cells))

    def action_next_figure(self) -> None:
        if self.figures:
            self.figure = self.figures[(self.figures.index(self.figure) + 1) % len(self.figures)]
            self._draw()

    def action_toggle_x(self) -> None:
        self.by_time = not self.by_time
        self._draw()

    def _draw(self) -> None:
        chart = self.query_one("#compare-chart", LineChart)
        lines, entries = [], []
        for index, run in enumerate(self.runs):
            series = (run.by_time if self.by_time else run.by_step).get(self.figure)
            style = index % LineChart.STYLES
            if series is not None and len(series):
                lines.append(ChartLine(series, run.name, style=style))
            # The line's marker as well as its colour: without colour (NO_COLOR), the marker says which run is which.
            entries.append(Text.assemble(
                (f"━{marker(style)}━ ", chart.get_component_rich_style(f"line-chart--series-{style}")),
                run.name + ("" if series is not None and len(series) else " (has no such figure)"),
            ))
        chart.lines = lines
        chart.x_name = "time" if self.by_time else "step"
        chart.x_format = format_duration if self.by_time else (lambda x: str(int(x)))
        chart.data_changed()
        self.query_one("#compare-legend", Static).update(packed(entries, self._table_width))
        against = "training time" if self.by_time else "step"
        self.query_one("#compare-status", Label).update(
            f"{figure_name(self.figure)} against {against} ({self.figures.index(self.figure) + 1} of {len(self.figures)} figures)"
            if self.figures else "these runs have no figures yet"
        )


def packed(entries: list[Text], width: int) -> Text:
    """The legend's entries two spaces apart, in lines of ``width`` (0: one line), an entry never broken across
    two: its marker stays beside its run's name."""
    legend, used = Text(), 0
    for entry in entries:
        if used and width and used + 2 + entry.cell_len > width:
            legend.append("\n")
            used = 0
        elif used:
            legend.append("  ")
            used += 2
        legend.append_text(entry)
        used += entry.cell_len
    return legend


def table_rows(runs: list[RunHistory]) -> list[tuple[str, list[str]]]:
    """The table's rows: each setting that differs, where each run's time went, then each run's option changes side
    by side, with each run's value; one row saying so when there are none of these."""
    rows = differences(runs)
    if any(run.bottleneck is not None for run in runs):  # where each run's last steps' time went
        rows.append(("time went", [run.bottleneck.text if run.bottleneck is not None else "—" for run in runs]))
    if any(run.compiled is not None for run in runs):  # what torch.compile did in each
        rows.append(("compiled", [run.compiled if run.compiled is not None else "—" for run in runs]))
    if any(run.ranks is not None for run in runs):  # a straggler, a hang: what held each run's ranks back
        rows.append(("ranks held", [run.ranks if run.ranks is not None else "—" for run in runs]))
    for index in range(max((len(run.changes) for run in runs), default=0)):
        rows.append(("option change" if index == 0 else "",
                     [run.changes[index] if index < len(run.changes) else "" for run in runs]))
    return rows or [("settings", ["the same, no option change" for _ in runs])]


def column_widths(labels: list[str], columns: list[list[str]], width: int) -> tuple[int, list[int]]:
    """The width of the setting names' column, and of each run's (``columns``: each run's texts, its name first),
    for a table ``width`` cells wide: the names take their longest, up to a fifth; the runs share the rest, a
    run whose texts are narrower than its share giving what it does not need to the others."""
    room = width - SCROLLBAR - CELL_PADDING * (len(columns) + 1)
    label = max(MIN_LABEL_WIDTH, min(max(map(len, labels)), int(room * LABEL_SHARE)))
    natural = [max(len(text) for text in texts) for texts in columns]
    widths = [0] * len(columns)
    left, waiting = room - label, sorted(range(len(columns)), key=lambda index: natural[index])
    while waiting:
        share = max(MIN_RUN_WIDTH, left // len(waiting))
        index = waiting.pop(0)
        widths[index] = min(natural[index], share)
        left -= widths[index]
    return label, widths


def fold(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` cells, each ending after a space, "/", ",", "-", ":" or "." where there
    is one (a path breaks between its folders, a class's name between its modules); a piece no line holds is cut
    after its last "_" that fits (a setting's name between its words: ``schedule_`` / ``extensions``, not
    ``schedule_exte`` / ``nsions``), else at the width; at least one line."""
    lines, line = [], ""
    for piece in _PIECES.findall(text):
        if len(line) + len(piece.rstrip()) > width and line:
            lines.append(line.rstrip())
            line = ""
        while len(piece) > width:  # a piece no line holds: cut it between words where it can be
            cut = piece.rfind("_", 0, width) + 1 or width
            lines.append(piece[:cut])
            piece = piece[cut:]
        line += piece
    return [*lines, line.rstrip()] if line.strip() or not lines else lines
