"""Per-module gradient norms: which layer's gradient is vanishing or exploding, right now and lately.

The rows are drawn by ``RowView`` (the Line API), not ``DataTable``: any ``DataTable.update_cell``
re-renders every visible row, which at 2 Hz cost 50-100 ms a frame; ``RowView`` redraws only the lines
whose text changed. The cursor stays on its module across updates and re-sorts, and the scroll position
stays where the user left it. A model with hundreds of modules starts in the grouped view, one row per
``blocks.N``-style prefix, and Enter on a group drills into it. ``/`` filters the rows by name: every key typed
after it goes into the filter, however fast, until Enter (keep the filter) or Esc (clear it) gives the keys back
to the table and the app (``key_order``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Input

from torchlab.tui.formatting import format_number, format_ratio, sparkline
from torchlab.tui.gradient_flags import combine_norms, flag_for, group_name
from torchlab.tui.names import shorten_names
from torchlab.tui.state import RunState
from torchlab.tui.state_metrics import ModuleStats
from torchlab.tui.widgets.fitted_line import FittedLine
from torchlab.tui.widgets.in_order_input import InOrderInput
from torchlab.tui.widgets.row_view import Cell, Column, RowView

#: The flat view is the default up to this many modules; above it, the grouped view.
GROUP_ABOVE = 48
#: sort key name -> shown name; ``o`` cycles through them in this order
SORTS = {"order": "model order", "norm": "norm ↓", "ratio": "×median ↓", "name": "name"}
FLAG_STYLES = {"exploding": "bold red", "non-finite": "bold red", "vanishing": "bold blue", "thrashed": "bold magenta",
               "frozen": "bold cyan"}
FLAG_MARKS = {"exploding": "▲ exploding", "non-finite": "✖ non-finite", "vanishing": "▼ vanishing",
              "thrashed": "△ thrashed", "frozen": "▽ frozen"}
FLAG_RANK = {"non-finite": 3, "exploding": 2, "thrashed": 2, "vanishing": 1, "frozen": 1, "": 0}


@dataclass(frozen=True)
class ColumnLayout:
    """Column widths for one table width; cells carry their own gaps (columns have no padding). The module
    column takes the width the others leave (``name``, set when the layout is chosen)."""

    params: bool
    trend: int
    flag_words: bool
    name: int = 0

    @property
    def others(self) -> int:
        """The width of every column but the module's (and the gap after it)."""
        trend = self.trend + 2 if self.trend else 0
        return 1 + (7 if self.params else 0) + 8 + trend + RATIO_WIDTH + (13 if self.flag_words else 2)


#: "0.055" is five characters; one more keeps it off the trend sparkline (cells have no padding).
RATIO_WIDTH = 6
#: A module column this wide shows most names whole, or cut with both ends readable: a layout with more
#: columns is taken only if it leaves the names at least this much (or all they need).
NAME_WIDTH = 24
#: The narrowest trend a layout may keep and still be chosen to show the names whole.
WHOLE_NAMES_TREND = 8

#: From the most columns to the fewest; the table takes the first that shows every name whole without giving
#: up the trend (``WHOLE_NAMES_TREND``), else the first that leaves the names room (``NAME_WIDTH``) and tells
#: every row shown from the others, else the one that leaves them the most.
LAYOUTS = (
    ColumnLayout(params=True, trend=16, flag_words=True),
    ColumnLayout(params=True, trend=8, flag_words=True),
    ColumnLayout(params=False, trend=8, flag_words=True),
    ColumnLayout(params=False, trend=8, flag_words=False),
    ColumnLayout(params=False, trend=4, flag_words=False),
    ColumnLayout(params=False, trend=0, flag_words=False),
)


@dataclass(frozen=True)
class GradRow:
    """One row of the table: a module, or a group of modules in the grouped view."""

    key: str
    label: str
    params: int
    norm: float | None
    trend: str
    ratio: float | None
    flag: str
    flagged_count: int
    position: int  # order in the model
    #: the modules of a group, or the other modules holding a module's tied parameters: the filter finds
    #: a row by any of them
    members: tuple[str, ...] = ()


class GradTable(Vertical):
    """Module, parameters, norm, trend sparkline, ratio to the median and a flag; sortable and filterable."""

    DEFAULT_CSS = """
    GradTable {
        height: 1fr;
    }
    GradTable > #grad-filter {
        height: 1;
        border: none;
        padding: 0 1;
        background: $boost;
    }
    GradTable > #grad-filter:focus {
        background: $primary 20%;
    }
    GradTable > RowView {
        height: 1fr;
        scrollbar-size-vertical: 1;
    }
    GradTable > #grad-status {
        height: 1;
        color: $text-muted;
        padding: 0 1;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    BINDINGS = [
        # Not in the footer: it is for the app's keys; the status line and the help screen name these.
        # The keys into and out of the filter act as they arrive (priority, key_order.py): see action_focus_filter.
        Binding("slash", "focus_filter", "Filter", show=False, priority=True),
        Binding("o", "cycle_sort", "Sort", show=False),
        Binding("v", "toggle_grouped", "Group", show=False),
        Binding("enter", "keep_filter", "Keep filter", show=False, priority=True),
        Binding("escape", "clear_filter", "Clear filter", show=False, priority=True),
    ]

    grouped: reactive[bool] = reactive(False)
    """One row per module group (``blocks.0``) instead of per module."""
    sort_by: reactive[str] = reactive("order")
    """One of ``SORTS``; numeric sorts put the largest first."""
    filter_text: reactive[str] = reactive("")
    """Case-insensitive substring a module name must contain to be shown."""

    class ViewChanged(Message):
        """The user changed what the table shows (sort, filter, grouping): the app may log or persist it."""

        def __init__(self, grad_table: GradTable, description: str) -> None:
            super().__init__()
            self.grad_table = grad_table
            self.description = description

        @property
        def control(self) -> GradTable:
            return self.grad_table

    def __init__(self, *, refresh_interval: float = 0.5, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        #: Least seconds between updates of the norms: they read fine at 2 Hz, and a row whose text changed
        #: is drawn again; the latest norms are never skipped, only delayed.
        self.refresh_interval = refresh_interval
        self._last_update = -math.inf
        self._state: RunState | None = None
        self._status_parts: list[str] = []
        self._modules_version = -1
        self._grads_version = -1
        self._rows: dict[str, GradRow] = {}  # displayed rows by key
        self._labels: dict[str, str] = {}  # row key -> its label as shown, shortened to the module column
        #: (the labels of the rows shown, a width) -> those labels shortened to it: they change with the rows
        #: shown and the width, not with the norms, which update twice a second
        self._shortened: tuple[tuple[frozenset[str], int], dict[str, str]] | None = None
        self._auto_grouped = False
        self.layout_columns = replace(LAYOUTS[-1], name=15)

    def compose(self) -> ComposeResult:
        yield InOrderInput(placeholder="/ filter modules", id="grad-filter")
        yield RowView(id="grad-data")
        yield FittedLine(separator=" · ", id="grad-status")

    def on_mount(self) -> None:
        self._rebuild_rows()

    def on_resize(self) -> None:
        self._rebuild_rows()
        self._show_status()

    @property
    def table(self) -> RowView:
        return self.query_one("#grad-data", RowView)

    @property
    def displayed_keys(self) -> list[str]:
        """Row keys in display order (sorted and filtered), for tests and for the app."""
        return self.table.row_keys

    # ------------------------------------------------------------------ feeding

    def show(self, state: RunState) -> None:
        """Bring the table up to date with the state: in place when only the norms changed."""
        self._state = state
        if state.modules_version != self._modules_version:
            self._modules_version = state.modules_version
            self._grads_version = state.grads_version
            if not self._auto_grouped and len(state.modules) > GROUP_ABOVE:
                self._auto_grouped = True
                self.set_reactive(GradTable.grouped, True)
            self._rebuild_rows()
        elif state.grads_version != self._grads_version and time.monotonic() - self._last_update >= self.refresh_interval:
            self._grads_version = state.grads_version
            self._last_update = time.monotonic()
            self._update_rows()
        self._show_status()

    def _compute_rows(self) -> list[GradRow]:
        state = self._state
        if state is None:
            return []
        rows = self._group_rows(state.modules) if self.grouped else [self._module_row(i, m) for i, m in enumerate(state.modules)]
        needle = self.filter_text.strip().lower()
        if needle:
            rows = [row for row in rows if needle in row.key.lower() or any(needle in name.lower() for name in row.members)]
        return rows

    def _module_row(self, position: int, module: ModuleStats) -> GradRow:
        # Tied parameters count once, here: the other modules that hold them are named beside it (and found
        # by the filter), so lm_head is not simply missing from the table.
        tied = f" = {', '.join(module.tied)}" if module.tied else ""
        return GradRow(
            key=module.name,
            label=module.name + tied,
            params=module.params,
            norm=module.norm,
            trend=sparkline(module.trend, self.layout_columns.trend),
            ratio=module.ratio,
            flag=module.flag,
            flagged_count=1 if module.flag else 0,
            position=position,
            members=module.tied,
        )

    def _group_rows(self, modules: list[ModuleStats]) -> list[GradRow]:
        groups: dict[str, list[ModuleStats]] = {}
        for module in modules:
            groups.setdefault(group_name(module.name), []).append(module)
        norms = {name: combine_norms([m.norm for m in members]) for name, members in groups.items()}
        finite = sorted(n for n in norms.values() if n is not None and math.isfinite(n))
        median = finite[len(finite) // 2] if finite else None
        rows = []
        for position, (name, members) in enumerate(groups.items()):
            trend_length = min(len(m.trend) for m in members)
            trend = [combine_norms([m.trend[i - trend_length] for m in members]) or 0.0 for i in range(trend_length)]
            norm = norms[name]
            ratio = norm / median if norm is not None and median else None
            worst = max((m.flag for m in members), key=FLAG_RANK.__getitem__)
            group_flag = flag_for(norm, ratio, trend)
            if FLAG_RANK[group_flag] > FLAG_RANK[worst]:
                worst = group_flag
            rows.append(
                GradRow(
                    key=name,
                    label=f"{name} ({len(members)})" if len(members) > 1 else name,
                    params=sum(m.params for m in members),
                    norm=norm,
                    trend=sparkline(trend, self.layout_columns.trend),
                    ratio=ratio,
                    flag=worst,
                    flagged_count=sum(1 for m in members if m.flag),
                    position=position,
                    members=tuple(name for m in members for name in (m.name, *m.tied)),
                )
            )
        return rows

    def _sorted(self, rows: list[GradRow]) -> list[GradRow]:
        if self.sort_by == "name":
            return sorted(rows, key=lambda row: row.key)
        if self.sort_by in ("norm", "ratio"):
            def value(row: GradRow) -> float:
                number = getattr(row, self.sort_by)
                return -math.inf if number is None or math.isnan(number) else number

            return sorted(rows, key=value, reverse=True)
        return sorted(rows, key=lambda row: row.position)

    # ------------------------------------------------------------------ the rows

    def _build_columns(self) -> None:
        layout = self.layout_columns
        columns = [Column("module", "module", layout.name + 1)]
        if layout.params:
            columns.append(Column("params", "params", 7, "right"))
        columns.append(Column("norm", "norm", 8, "right"))
        if layout.trend:
            columns.append(Column("trend", "  trend" if layout.trend >= 5 else " trend", layout.trend + 2))
        columns += [
            Column("ratio", "×med", RATIO_WIDTH, "right"),
            Column("flag", " flag" if layout.flag_words else "", 13 if layout.flag_words else 2),
        ]
        self.table.set_columns(columns)

    def _choose_layout(self, labels: list[str]) -> ColumnLayout:
        """The layout with the most columns that leaves the module names room and tells the rows apart."""
        available = self.table.content_size.width - 1  # room for the vertical scrollbar
        if available <= 0:  # not laid out yet: the resize that follows chooses
            return self.layout_columns
        needed = max((len(label) for label in labels), default=0)
        needed = max(needed, len("module"))  # the header's
        fitting = [replace(layout, name=available - layout.others) for layout in LAYOUTS if available - layout.others >= 8]
        if not fitting:
            return replace(LAYOUTS[-1], name=max(8, available - LAYOUTS[-1].others))
        # Whole names, where leaving out the parameter counts and the flags' words is enough: the names say
        # which row is which, the counts do not change, and a flag keeps its mark.
        whole = next((layout for layout in fitting if layout.trend >= WHOLE_NAMES_TREND and layout.name >= needed), None)
        if whole is not None:
            return replace(whole, name=needed)
        for layout in fitting:
            if layout.name >= min(needed, NAME_WIDTH) and self._unique(labels, layout.name):
                return replace(layout, name=min(layout.name, needed))
        widest = fitting[-1]
        return replace(widest, name=min(widest.name, max(needed, 1)))

    def _unique(self, labels: list[str], width: int) -> bool:
        shortened = self._shorten(labels, width)
        return len(set(shortened.values())) == len(shortened)

    def _shorten(self, labels: list[str], width: int) -> dict[str, str]:
        key = (frozenset(labels), width)
        if self._shortened is None or self._shortened[0] != key:
            self._shortened = (key, dict(zip(labels, shorten_names(labels, width))))
        return self._shortened[1]

    def _cells_for(self, row: GradRow) -> tuple[Cell, ...]:
        layout = self.layout_columns
        label = self._labels.get(row.key, row.label)
        style = FLAG_STYLES.get(row.flag, "")
        mark = FLAG_MARKS.get(row.flag, "")
        if not layout.flag_words:
            mark = mark[:1]
        elif mark and self.grouped and row.flagged_count > 1:
            mark = f"{mark} ×{row.flagged_count}"
        cells: tuple[Cell, ...] = ((label, style),)
        if layout.params:
            cells += ((_short_count(row.params), "dim"),)
        cells += ((format_number(row.norm, 3), ""),)
        if layout.trend:
            cells += (("  " + row.trend, "cyan"),)
        return cells + (
            (format_ratio(row.ratio), ""),
            (" " + mark if mark else "", style),
        )

    def _rebuild_rows(self) -> None:
        """Recompute every row from the state and show them sorted; the view redraws only what changed.

        The columns follow the rows shown and the width: the module column takes what the others leave, and
        names that do not fit are cut in the middle so that no two rows read alike (torchlab/tui/names.py)."""
        rows = self._compute_rows()
        labels = [row.label for row in rows]
        layout = self._choose_layout(labels)
        if layout != self.layout_columns or not self.table.columns:
            trend_changed = layout.trend != self.layout_columns.trend
            self.layout_columns = layout
            self._build_columns()
            if trend_changed:  # the sparklines are drawn to the trend column's width
                rows = self._compute_rows()
        shortened = self._shorten(labels, layout.name)
        self._labels = {row.key: shortened[row.label] for row in rows}
        self._rows = {row.key: row for row in rows}
        self._apply_sort()

    def _update_rows(self) -> None:
        """New norms: the same as a rebuild, since ``RowView.set_rows`` compares cell text row by row."""
        self._rebuild_rows()

    def _apply_sort(self) -> None:
        """Show the current rows in the current order; the cursor stays on the same module."""
        self.table.set_rows([(row.key, self._cells_for(row)) for row in self._sorted(list(self._rows.values()))])

    def _show_status(self) -> None:
        state = self._state
        if state is None or not state.modules:
            parts = ["no modules yet"]
        else:
            flagged = sum(1 for module in state.modules if module.flag)
            parts = [f"{flagged} flagged"] if flagged else []
            parts.append(f"{len(state.modules)} modules")
            if self.grouped:
                parts.append("grouped")
            if self.filter_text:
                parts.append(f"{len(self._rows)} match")
            parts.append(SORTS[self.sort_by] if self.sort_by == "order" else f"by {SORTS[self.sort_by]}")
            if state.grad_step is not None:
                parts.append(f"step {state.grad_step}")
            parts.append("/ filter o sort v group")  # the first to go when the line is short
        if parts != self._status_parts:  # called at 10 Hz: repaint only when it says something new
            self._status_parts = parts
            self.query_one("#grad-status", FittedLine).set_parts([Text(part) for part in parts])

    # ------------------------------------------------------------------ reactions

    def watch_grouped(self) -> None:
        if self.is_mounted:
            self._rebuild_rows()
            self._show_status()

    def watch_filter_text(self) -> None:
        if self.is_mounted:
            self._rebuild_rows()
            self._show_status()

    def watch_sort_by(self) -> None:
        if self.is_mounted:
            self._apply_sort()
            self._show_status()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "keep_filter":  # Enter on the table drills into a group
            return self.screen.focused is self.query_one("#grad-filter", Input)
        return True

    def action_focus_filter(self) -> None:
        """Focus the filter now: the key typed after ``/`` is routed as soon as this returns.

        Keys typed fast arrive together. ``/`` without priority acted only once it had come up from the table to
        the app, and ``Widget.focus`` moves the focus later still: ``/blocks`` typed fast put the ``l`` on the main
        screen, where it opened the lr× prompt. With ``/`` acting as it arrives and the focus moved at once, every
        key after it goes to the field, in order; Enter and Esc leave it the same way, so the keys after them are
        the main screen's again.
        """
        self.screen.set_focus(self.query_one("#grad-filter", Input))

    def action_keep_filter(self) -> None:
        # Back to the table so the app's letter keys mean their actions again.
        self.screen.set_focus(self.table)

    def action_clear_filter(self) -> None:
        field = self.query_one("#grad-filter", Input)
        self.screen.set_focus(self.table)
        field.call_later(field.clear)  # behind the keys typed before Esc, on their way to the field

    def action_cycle_sort(self) -> None:
        names = list(SORTS)
        self.sort_by = names[(names.index(self.sort_by) + 1) % len(names)]
        self.post_message(self.ViewChanged(self, f"gradient table sorted by {SORTS[self.sort_by]}"))

    def action_toggle_grouped(self) -> None:
        self.grouped = not self.grouped
        self.post_message(self.ViewChanged(self, "gradient table grouped by module prefix" if self.grouped else "gradient table shows every module"))

    @on(Input.Changed, "#grad-filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value

    @on(RowView.HeaderSelected)
    def _header_selected(self, event: RowView.HeaderSelected) -> None:
        self.sort_by = {"module": "name", "norm": "norm", "ratio": "ratio"}.get(event.column_key, "order")

    @on(RowView.RowSelected)
    def _row_selected(self, event: RowView.RowSelected) -> None:
        """Enter on a group drills into it: the flat view filtered to that prefix."""
        if not self.grouped:
            return
        prefix = event.row_key
        self.grouped = False
        self.query_one("#grad-filter", Input).value = prefix + "."
        self.post_message(self.ViewChanged(self, f"gradient table shows the modules of {prefix}"))


def _short_count(count: int) -> str:
    if count >= 1_000_000:
        return f"{count / 1_000_000:.1f}M"
    if count >= 1_000:
        return f"{count / 1_000:.1f}k"
    return str(count)
