"""Runs compared: one figure of every run on one chart (loss, val loss, LR, samples/s, the workload's own
metrics; against step or training time), the settings that differ between them, and each run's option changes.

Opened by ``torchlab-tui compare RUN_A RUN_B ...`` (core/launch/compare.py) or, in the app, from the command
palette against an earlier run of the same workload.
"""

from __future__ import annotations

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

    def compose(self) -> ComposeResult:
        with Vertical(id="view"):
            yield Label(id="compare-status", classes="view-status")
            yield LineChart(id="compare-chart", empty_text="no run has this figure")
            yield Static(id="compare-legend")
            yield DataTable(id="compare-differences", cursor_type="none", zebra_stripes=True)
            yield Label("f next figure · x step or time · esc back", classes="view-keys")

    def on_mount(self) -> None:
        self.query_one("#view").border_title = "compare: " + " · ".join(escape(run.name) for run in self.runs)
        table = self.query_one("#compare-differences", DataTable)
        table.add_column("setting", key="setting")
        for index, run in enumerate(self.runs):
            table.add_column(Text(run.name[-24:], style="bold"), key=f"run-{index}")
        rows = differences(self.runs)
        for setting, values in rows:
            table.add_row(setting, *values)
        width = max((len(change) for run in self.runs for change in run.changes), default=0)
        for index in range(max((len(run.changes) for run in self.runs), default=0)):
            table.add_row("option change" if index == 0 else "", *(run.changes[index] if index < len(run.changes) else "" for run in self.runs))
        if not rows and not width:
            table.add_row("settings", *("the same, no option change" for _ in self.runs))
        self._draw()

    def action_next_figure(self) -> None:
        if self.figures:
            self.figure = self.figures[(self.figures.index(self.figure) + 1) % len(self.figures)]
            self._draw()

    def action_toggle_x(self) -> None:
        self.by_time = not self.by_time
        self._draw()

    def _draw(self) -> None:
        chart = self.query_one("#compare-chart", LineChart)
        lines, legend = [], Text()
        for index, run in enumerate(self.runs):
            series = (run.by_time if self.by_time else run.by_step).get(self.figure)
            style = index % LineChart.STYLES
            if series is not None and len(series):
                lines.append(ChartLine(series, run.name, style=style))
            if index:
                legend.append("  ")
            # The line's marker as well as its colour: without colour (NO_COLOR), the marker says which run is which.
            legend.append(f"━{marker(style)}━ ", style=chart.get_component_rich_style(f"line-chart--series-{style}"))
            legend.append(run.name + ("" if series is not None and len(series) else " (has no such figure)"))
        chart.lines = lines
        chart.x_name = "time" if self.by_time else "step"
        chart.x_format = format_duration if self.by_time else (lambda x: str(int(x)))
        chart.data_changed()
        self.query_one("#compare-legend", Static).update(legend)
        against = "training time" if self.by_time else "step"
        self.query_one("#compare-status", Label).update(
            f"{figure_name(self.figure)} against {against} ({self.figures.index(self.figure) + 1} of {len(self.figures)} figures)"
            if self.figures else "these runs have no figures yet"
        )
