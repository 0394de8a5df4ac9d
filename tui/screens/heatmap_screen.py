"""The heatmap (``H``): modules (or blocks) × the recent measured steps, each cell the log10 of one figure: the
gradient norm, the update-to-weight ratio ‖Δθ‖/‖θ‖ or the weight norm (``f`` cycles). A layer that stopped learning
is a row gone dark; a block whose updates blew up after a change, a bright band from that step on.

Each cell is a glyph of eight heights (``▁`` to ``█``) as well as a colour, so the scale reads without colour; the
legend says what the lowest, middle and highest glyphs stand for. Rows are modules, or blocks (``v``, as the gradient
table groups them: a block's norm is its modules' norms added in squares, its ratio its update's norm over its
weights'), grouped from the start where the modules would not fit the screen; columns are the newest steps the width
holds. The cursor (arrows) names a cell's module, step and value on the line below. Under the update ratio, a cell
where a module of its row was flagged frozen or thrashed (the gradient table's rule, ``update_flag``) is ``▽`` or
``△`` in place of its height, and the line below names the module: a block's ratio, its modules' weighed by their
weights, would hide a small layer that stopped.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Label

from torchlab.tui.formatting import format_number
from torchlab.tui.gradient_flags import group_name, update_flag
from torchlab.tui.health_history import FIGURES, HealthHistory
from torchlab.tui.screens.view_screen import ViewScreen, closing_key
from torchlab.tui.state import RunState

#: Low to high: the glyph scale, readable without colour.
GLYPHS = "▁▂▃▄▅▆▇█"
#: Each glyph's colour, dark to bright (perceptually ordered, as viridis).
COLOURS = ("#440154", "#46327e", "#365c8d", "#277f8e", "#1fa187", "#4ac16d", "#a0da39", "#fde725")
#: The narrowest module column, and the widest.
LABEL_MIN, LABEL_MAX = 12, 32
#: What each figure is, in the title.
MEANING = {"grad norm": "each module's gradient norm", "update ratio": "‖Δθ‖/‖θ‖: how far a step moved the weights",
           "weight norm": "each module's weight norm ‖θ‖"}


#: A cell of the update ratio where a module of its row was flagged (``update_flag``), in place of its height glyph:
#: a block's ratio, weighed by its modules' weights, would hide a small layer that stopped.
FLAG_GLYPHS = {"frozen": "▽", "thrashed": "△"}


@dataclass(frozen=True)
class Grid:
    """What the heatmap draws: row labels, the steps of its columns, a value per cell (None: not measured), and per
    cell the modules of its row the update's flags name ("blocks.3.ln_1 frozen (1e-07)"; update ratio only)."""

    labels: list[str]
    steps: list[int]
    cells: list[list[float | None]]  # [row][column]
    flags: list[list[list[str]]]  # [row][column]: the flagged modules, said

    def flag_glyph(self, row: int, column: int) -> str | None:
        said = self.flags[row][column]
        if not said:
            return None
        return FLAG_GLYPHS["thrashed"] if any(" thrashed " in text for text in said) else FLAG_GLYPHS["frozen"]


def grid_of(history: HealthHistory, modules: list[str], figure: str, grouped: bool, columns: int) -> Grid:
    """The newest ``columns`` steps of ``figure``, a row per module or per block (``group_name``)."""
    count = min(columns, len(history.steps))
    steps = list(history.steps)[len(history.steps) - count:] if count > 0 else []
    values = list(history.columns[figure])[len(history.steps) - count:] if count > 0 else []
    flagged = [_flagged(modules, column) if figure == "update ratio" else {} for column in values]
    if not grouped:
        return Grid(list(modules), steps, [[column[row] for column in values] for row in range(len(modules))],
                    [[[said] if (said := flags.get(row)) else [] for flags in flagged] for row in range(len(modules))])
    groups: dict[str, list[int]] = {}
    for index, name in enumerate(modules):
        groups.setdefault(group_name(name), []).append(index)
    weights = list(history.columns["weight norm"])[len(history.steps) - count:] if count > 0 else []
    cells = [[_combined(figure, [column[i] for i in members], [weight[i] for i in members])
              for column, weight in zip(values, weights)] for members in groups.values()]
    flags = [[[flags[i] for i in members if i in flags] for flags in flagged] for members in groups.values()]
    return Grid(list(groups), steps, cells, flags)


def _flagged(modules: list[str], ratios: list[float | None]) -> dict[int, str]:
    """The modules of one step whose update ratio is flagged (as the gradient table flags it), by index, said."""
    present = [ratio for ratio in ratios if ratio is not None and math.isfinite(ratio)]
    median = statistics.median(present) if present else None
    said = {}
    for index, ratio in enumerate(ratios):
        flag = update_flag(ratio, ratio / median if ratio is not None and median else None)
        if flag:
            said[index] = f"{modules[index]} {flag} ({format_number(ratio)})"
    return said


def _combined(figure: str, values: list[float | None], weights: list[float | None]) -> float | None:
    """A block's figure from its modules': norms add in squares (their parameters are disjoint); a ratio is the
    block's update norm over its weight norm, each module's update being its ratio times its weight norm."""
    if figure != "update ratio":
        present = [value for value in values if value is not None]
        return math.sqrt(sum(value * value for value in present)) if present else None
    pairs = [(ratio * weight, weight) for ratio, weight in zip(values, weights) if ratio is not None and weight]
    if not pairs:
        return None
    return math.sqrt(sum(update * update for update, _ in pairs)) / math.sqrt(sum(weight * weight for _, weight in pairs))


@dataclass(frozen=True)
class Scale:
    """log10 of a positive value onto ``GLYPHS``: from ``low`` to ``high`` (whole decades around the values)."""

    low: float
    high: float

    @classmethod
    def of(cls, cells: list[list[float | None]]) -> Scale | None:
        logs = [math.log10(value) for row in cells for value in row if value is not None and value > 0]
        if not logs:
            return None
        low, high = math.floor(min(logs)), math.ceil(max(logs))
        return cls(low, high if high > low else low + 1)

    def level(self, value: float | None) -> int | None:
        """The glyph's index for ``value``; None for no value (a blank cell), 0 for zero."""
        if value is None:
            return None
        if value <= 0:
            return 0
        share = (math.log10(value) - self.low) / (self.high - self.low)
        return min(len(GLYPHS) - 1, max(0, int(share * len(GLYPHS))))

    def legend(self) -> Text:
        """The glyphs with what they stand for: lowest, middle and highest."""
        text = Text("scale (log10): ")
        for index, glyph in enumerate(GLYPHS):
            text.append(glyph, style=COLOURS[index])
        middle = len(GLYPHS) // 2
        for index, exponent in ((0, self.low), (middle, self.low + (self.high - self.low) * middle / len(GLYPHS)),
                                (len(GLYPHS) - 1, self.high)):
            text.append("  " if index == 0 else " · ")
            text.append(GLYPHS[index], style=COLOURS[index])
            text.append(f" {'≥ ' if index == middle else ''}{_power(exponent)}")
        text.append(" · blank: not measured")
        return text


def _power(exponent: float) -> str:
    """10 to ``exponent`` as a legend says it: 1e-4, 3.2e-3, 0.32, 3.2, 320, 1e3."""
    whole = math.floor(exponent)
    mantissa = 10 ** (exponent - whole)
    if -1 <= whole <= 2:
        value = mantissa * 10**whole
        return f"{value:.2g}" if value < 10 else f"{value:.0f}"
    return f"1e{whole}" if round(mantissa, 1) == 1 else f"{mantissa:.1f}e{whole}"


class HeatmapView(Widget, can_focus=True):
    """The grid, its cursor and what the cursor is on (posted to the screen's status line)."""

    BINDINGS = [
        Binding("left", "move(0, -1)", show=False), Binding("right", "move(0, 1)", show=False),
        Binding("up", "move(-1, 0)", show=False), Binding("down", "move(1, 0)", show=False),
    ]
    DEFAULT_CSS = "HeatmapView { height: 1fr; }"

    cursor: reactive[tuple[int, int]] = reactive((0, -1), layout=False)

    class CursorMoved(Message):
        """The cursor is on another cell (or the cells under it changed)."""

    def __init__(self) -> None:
        super().__init__(id="heatmap")
        self.grid: Grid | None = None
        self.scale: Scale | None = None
        self.label_width = LABEL_MIN

    def show(self, grid: Grid, label_width: int) -> None:
        self.grid, self.label_width = grid, label_width
        self.scale = Scale.of(grid.cells)
        row, column = self.cursor
        self.cursor = (min(row, max(0, len(grid.labels) - 1)), column)
        self.refresh()

    def action_move(self, rows: int, columns: int) -> None:
        if self.grid is None or not self.grid.labels:
            return
        row, column = self.cursor
        width = len(self.grid.steps)
        column = (width - 1 if column < 0 else column) + columns  # -1: the newest column, as it moves on
        self.cursor = (min(max(0, row + rows), len(self.grid.labels) - 1),
                       -1 if column >= width - 1 else max(0, column))

    def cell(self) -> tuple[str, int, float | None, list[str]] | None:
        """The module (or block), step, value and flagged modules under the cursor."""
        grid = self.grid
        if grid is None or not grid.labels or not grid.steps:
            return None
        row, column = self.cursor
        column = len(grid.steps) - 1 if column < 0 else min(column, len(grid.steps) - 1)
        return grid.labels[row], grid.steps[column], grid.cells[row][column], grid.flags[row][column]

    def watch_cursor(self) -> None:
        self.refresh()
        self.post_message(self.CursorMoved())

    def render(self) -> Text:
        grid, scale = self.grid, self.scale
        if grid is None or scale is None:
            return Text("")
        height = max(1, self.size.height)
        cursor_row, cursor_column = self.cursor
        first = min(max(0, cursor_row - height + 1), max(0, len(grid.labels) - height))  # the cursor's row in view
        cursor_column = len(grid.steps) - 1 if cursor_column < 0 else cursor_column
        lines = []
        for row in range(first, min(len(grid.labels), first + height)):
            label = _fit(grid.labels[row], self.label_width)
            line = Text(f"{label:<{self.label_width}} ", style="bold" if row == cursor_row else "")
            for column, value in enumerate(grid.cells[row]):
                level = scale.level(value)
                glyph, style = (" ", "") if level is None else (grid.flag_glyph(row, column) or GLYPHS[level], COLOURS[level])
                if row == cursor_row and column == cursor_column:
                    style = f"{style} reverse".strip() if level is not None else "reverse"
                line.append(glyph, style=style)
            lines.append(line)
        return Text("\n").join(lines)


def _fit(name: str, width: int) -> str:
    """A name in ``width`` cells: whole, or its end (where modules differ) after an ellipsis."""
    return name if len(name) <= width else "…" + name[len(name) - width + 1:]


class HeatmapScreen(ViewScreen):
    """Modules × recent steps, one figure at a time (see the module docstring)."""

    DEFAULT_CSS = """
    HeatmapScreen #heatmap-legend { height: 1; text-wrap: nowrap; text-overflow: ellipsis; }
    HeatmapScreen #heatmap-cell { height: 1; color: $text; }
    """

    BINDINGS = [closing_key("H"), Binding("f", "next_figure", "Figure", show=False),
                Binding("v", "toggle_grouped", "Group", show=False)]

    def __init__(self, state: RunState | None = None) -> None:
        super().__init__(state)
        self.figure = FIGURES[1] if state is not None and state.health.has(FIGURES[1]) else FIGURES[0]
        self.grouped: bool | None = None  # None: grouped where the modules would not fit
        self._drawn: tuple | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="view"):
            yield Label("", id="heatmap-status", classes="view-status")
            yield HeatmapView()
            yield Label("", id="heatmap-legend")
            yield Label("", id="heatmap-cell")
            yield Label("esc back · f figure · v modules/blocks · ←↑↓→ a cell", classes="view-keys")

    def on_mount(self) -> None:
        self.query_one("#view").border_title = "heatmap"
        self.query_one(HeatmapView).focus()
        self.show_state(self.state)

    def on_resize(self) -> None:
        self._drawn = None
        self.show_state(self.state)

    def action_next_figure(self) -> None:
        self.figure = FIGURES[(FIGURES.index(self.figure) + 1) % len(FIGURES)]
        self._drawn = None
        self.show_state(self.state)

    def action_toggle_grouped(self) -> None:
        self.grouped = not self._is_grouped(self.state)
        self._drawn = None
        self.show_state(self.state)

    def _is_grouped(self, state: RunState) -> bool:
        if self.grouped is not None:
            return self.grouped
        view = self.query_one(HeatmapView)
        rows = view.size.height if view.size.height > 0 else self.app.size.height - 6
        return len(state.modules) > rows

    def show_state(self, state: RunState) -> None:
        if state is None or not self.is_mounted:
            return
        view = self.query_one(HeatmapView)
        grouped = self._is_grouped(state)
        key = (state.health.version, self.figure, grouped, self.size.width)
        if key == self._drawn:
            return
        self._drawn = key
        modules = [module.name for module in state.modules]
        labels = list(dict.fromkeys(group_name(name) for name in modules)) if grouped else modules
        label_width = min(LABEL_MAX, max([LABEL_MIN, *(len(label) for label in labels)]))
        columns = max(1, self.size.width - 4 - label_width - 1)
        grid = grid_of(state.health, modules, self.figure, grouped, columns)
        view.show(grid, label_width)
        status = self.query_one("#heatmap-status", Label)
        legend = self.query_one("#heatmap-legend", Label)
        if view.scale is None:
            what = ("no step has measured it yet: the probe measures a step now and then (--probe-every)"
                    if self.figure != "update ratio" else
                    "no step has measured it yet (the probe's steps measure it; a run from before it had none)")
            status.update(f"{self.figure}: {what}")
            legend.update("")
        else:
            rows = f"{len(grid.labels)} {'blocks' if grouped else 'modules'}"
            flags = (" · ▽ a module frozen, △ thrashed (as the gradient table flags them)"
                     if any(said for row in grid.flags for said in row) else "")
            status.update(f"{self.figure} ({MEANING[self.figure]}) · {rows} × the last {len(grid.steps)} measured steps "
                          f"({grid.steps[0]}–{grid.steps[-1]}){flags}")
            legend.update(view.scale.legend())
        self._show_cell()

    def on_heatmap_view_cursor_moved(self, _message: HeatmapView.CursorMoved) -> None:
        self._show_cell()

    def _show_cell(self) -> None:
        cell = self.query_one(HeatmapView).cell()
        text = "" if cell is None else " · ".join([f"{cell[0]}", f"step {cell[1]}", f"{self.figure} {format_number(cell[2])}",
                                                   *cell[3]])
        self.query_one("#heatmap-cell", Label).update(text)
