"""Profiler snapshots: the list of a run's snapshots, one snapshot's table, and two side by side.

``P`` opens the list; enter opens a snapshot's table (sortable by any column with ``o`` or a click on
its header, ``+``/``-`` for the top N, ``g`` to group by input shape); space marks two snapshots and
``c`` compares them with ratio columns (after / before), e.g. before and after turning AMP on.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Label, Static
from textual.widgets.data_table import CellDoesNotExist

from torchlab.tui.profiles import (
    COLUMNS_BY_KEY,
    DEFAULT_TOP_N,
    TOP_N_CHOICES,
    FIGURE_KEYS,
    FIGURES,
    NAME,
    SHAPES,
    ProfileColumn,
    ProfileRows,
    ProfileSnapshot,
    compare_entries,
    format_figure,
    format_times,
    has_device_times,
    next_top_n,
    snapshot_rows,
    sort_rows,
    top,
    total,
)
from torchlab.tui.screens.view_screen import ViewScreen, closing_key
from torchlab.tui.state import RunState

#: Input shapes can be long lists of lists: cut to what leaves the figures on screen (at most this wide;
#: table_by_shape.txt has them whole).
SHAPES_WIDTH = 48
DEVICE_KEYS = frozenset({"self_device_us", "device_total_us", "self_device_memory_bytes"})

TABLE_KEYS = "o sort · r reverse · click a header to sort by it · +/- top N · g by input shape · esc back"


def _figure_cell(kind: str, value: Any, style: str = "") -> Text:
    return Text(format_figure(kind, value), style=style, justify="right")


def _shapes_cell(shapes: Any, width: int) -> Text:
    text = str(shapes or "")
    return Text(text if len(text) <= width else text[: width - 1] + "…", style="dim")


def fitting_top_n(screen_height: int) -> int:
    """The first top-N choice that fills the screen (a table's frame and notes take about 8 lines)."""
    visible = screen_height - 8
    return next((choice for choice in TOP_N_CHOICES if choice >= visible), 0)


def _top_label(top_n: int) -> str:
    return "all" if top_n <= 0 else f"top {top_n}"


class ProfileListScreen(ViewScreen):
    """Every snapshot of the run, newest last; live: a snapshot that arrives while it is open appears."""

    BINDINGS = [
        Binding("space", "mark", "Mark"),
        Binding("c", "compare", "Compare"),
        closing_key("P"),
    ]

    def __init__(self, state: RunState) -> None:
        super().__init__(state)
        self.marked: list[int] = []  # snapshot numbers, at most two

    def compose(self) -> ComposeResult:
        with Vertical(id="view"):
            yield Static("", id="profiles-status", classes="view-status")
            yield DataTable(id="profiles-table", cursor_type="row", zebra_stripes=True)
            yield Label("enter open · space mark two · c compare (the marked two, or this one with the one before) · esc back",
                        classes="view-keys")

    def on_mount(self) -> None:
        self.query_one("#view").border_title = "profiler snapshots"
        table = self.query_one(DataTable)
        for label, key in (("", "mark"), ("#", "number"), ("steps", "steps"), ("ops", "ops"), ("top op", "top"),
                           ("built", "built"), ("folder", "dir")):
            table.add_column(label, key=key)
        self.show_state(self.state)
        if self.state.profiles:
            table.move_cursor(row=len(self.state.profiles) - 1)  # the newest: usually the one just asked for
        table.focus()

    def show_state(self, state: RunState) -> None:
        if state.profiles_version == self._seen_version:
            return
        self._seen_version = state.profiles_version
        table = self.query_one(DataTable)
        cursor = table.cursor_row
        table.clear()
        for snapshot in state.profiles:
            if snapshot.error:
                ops, top_op = Text("–", justify="right"), Text(f"failed: {snapshot.error}", style="red")
            else:
                ops, top_op = Text(str(len(snapshot.rows)), justify="right"), Text(snapshot.top_op())
            table.add_row(
                self._mark(snapshot.number), Text(str(snapshot.number), justify="right"), snapshot.steps, ops, top_op,
                Text(f"{snapshot.build_s:.1f} s", justify="right"), Text(self.state.within_run(snapshot.dir), style="dim"),
                key=str(snapshot.number),
            )
        if state.profiles:
            table.move_cursor(row=min(cursor, len(state.profiles) - 1))
        count = len(state.profiles)
        status = self.query_one("#profiles-status", Static)
        coming = " · one more is on its way (recording, then building its tables)" if state.profile_pending else ""
        if count == 0:
            status.update("A snapshot is on its way: the steps are being recorded, then its tables are built "
                          "(seconds on a big model); it appears here when ready." if state.profile_pending else
                          "No snapshots yet: press p on the main screen to profile the next steps; "
                          "each snapshot appears here when its tables are built.")
        else:
            status.update(f"{count} snapshot{'s' if count != 1 else ''} of this run{coming} · enter opens the table · "
                          "mark two with space, then c compares them · in each folder: trace.json (ui.perfetto.dev or "
                          "chrome://tracing), table.txt, table.csv")

    def _mark(self, number: int) -> Text:
        if number not in self.marked:
            return Text(" ")
        return Text("AB"[self.marked.index(number)] if len(self.marked) == 2 else "✓", style="bold magenta")

    def _snapshot_at_cursor(self) -> ProfileSnapshot | None:
        table = self.query_one(DataTable)
        if not self.state.profiles or table.row_count == 0:
            return None
        return self.state.profiles[min(table.cursor_row, len(self.state.profiles) - 1)]

    @on(DataTable.RowSelected, "#profiles-table")
    def _open(self, event: DataTable.RowSelected) -> None:
        snapshot = self._snapshot_at_cursor()
        if snapshot is not None:
            self.app.push_screen(ProfileTableScreen(snapshot))

    def action_mark(self) -> None:
        snapshot = self._snapshot_at_cursor()
        if snapshot is None:
            return
        if snapshot.number in self.marked:
            self.marked.remove(snapshot.number)
        else:
            self.marked = (self.marked + [snapshot.number])[-2:]
        table = self.query_one(DataTable)
        for other in self.state.profiles:
            table.update_cell(str(other.number), "mark", self._mark(other.number))

    def action_compare(self) -> None:
        by_number = {snapshot.number: snapshot for snapshot in self.state.profiles}
        if len(self.marked) == 2:
            pair = [by_number[number] for number in sorted(self.marked)]
        else:
            current = self._snapshot_at_cursor()
            if current is None or current.number - 1 not in by_number:
                self.app.notify("compare needs two snapshots: mark two with space (or stand on a later one)", severity="warning")
                return
            pair = [by_number[current.number - 1], current]
        failed = [snapshot.label for snapshot in pair if snapshot.error]
        if failed:
            self.app.notify(f"{', '.join(failed)} failed and has no table to compare", severity="warning")
            return
        self.app.push_screen(ProfileCompareScreen(pair[0], pair[1]))


class _TableScreen(ViewScreen):
    """Sorting, top N and grouping by shape, shared by the snapshot table and the comparison."""

    BINDINGS = [
        Binding("o", "cycle_sort", "Sort"),
        Binding("r", "reverse", "Reverse"),
        Binding("plus,equals_sign", "top(1)", "More rows"),
        Binding("minus", "top(-1)", "Fewer rows"),
        Binding("g", "toggle_shapes", "By shape"),
    ]

    sort_key: str = "self_cpu_us"
    reverse: bool = False
    top_n: int = DEFAULT_TOP_N
    by_shape: bool = False

    def sort_columns(self) -> list[str]:
        """The keys ``o`` cycles through: the columns shown."""
        raise NotImplementedError

    def redraw(self) -> None:
        raise NotImplementedError

    def action_cycle_sort(self) -> None:
        keys = self.sort_columns()
        position = keys.index(self.sort_key) if self.sort_key in keys else -1
        self.sort_key = keys[(position + 1) % len(keys)]
        self.reverse = False
        self.redraw()

    def action_reverse(self) -> None:
        self.reverse = not self.reverse
        self.redraw()

    def action_top(self, step: int) -> None:
        self.top_n = next_top_n(self.top_n, step)
        self.redraw()

    def action_toggle_shapes(self) -> None:
        self.by_shape = not self.by_shape
        self.redraw()

    @on(DataTable.HeaderSelected)
    def _header_clicked(self, event: DataTable.HeaderSelected) -> None:
        key = str(event.column_key.value)
        if key not in self.sort_columns():
            return
        if key == self.sort_key:
            self.reverse = not self.reverse
        else:
            self.sort_key, self.reverse = key, False
        self.redraw()

    def shapes_width(self) -> int:
        """Room for input shapes: the rest of the screen after a name and the figures, within 16..48."""
        return max(16, min(SHAPES_WIDTH, self.size.width - 62))

    def header(self, key: str, label: str) -> Text:
        if key != self.sort_key:
            return Text(label)
        return Text(f"{label} {'↑' if self.reverse else '↓'}", style="bold")

    def order_words(self, key: str) -> str:
        if key in (NAME.key, SHAPES.key):
            return "Z to A" if self.reverse else "A to Z"
        return "smallest first" if self.reverse else "largest first"

    def fill(self, columns: list[tuple[str, Text]], rows: list[list[Any]], keys: list[str]) -> None:
        """Replace the table's columns and rows, keeping the cursor on the same op where it is still shown."""
        table = self.query_one(DataTable)
        was = None
        if table.row_count:
            try:
                was = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
            except CellDoesNotExist:  # the cursor is past the rows: start at the top
                was = None
        table.clear(columns=True)
        for key, label in columns:
            table.add_column(label, key=key)
        seen: set[str] = set()
        for key, row in zip(keys, rows):
            unique = key if key not in seen else f"{key}#{len(seen)}"
            seen.add(unique)
            table.add_row(*row, key=unique)
        if was is not None and was in seen:
            table.move_cursor(row=table.get_row_index(was))


class ProfileTableScreen(_TableScreen):
    """One snapshot's ``key_averages()`` table: name, calls, self/total CPU and device time, memory."""

    def __init__(self, snapshot: ProfileSnapshot) -> None:
        super().__init__()
        self.snapshot = snapshot
        self.sort_key = snapshot.sort if snapshot.sort in FIGURE_KEYS else "self_cpu_us"
        self._rows: dict[bool, ProfileRows] = {}

    def compose(self) -> ComposeResult:
        with Vertical(id="view"):
            yield Static("", id="profile-status", classes="view-status")
            if self.snapshot.communication is not None:  # with ranks: how much of the steps' time collectives ran
                yield Static(Text(self.snapshot.communication), id="profile-communication", classes="view-status")
            if self.snapshot.error:
                yield Static(Text(f"This snapshot failed: {self.snapshot.error}", style="bold red"), id="profile-error",
                             classes="view-empty")
            else:
                yield DataTable(id="profile-table", cursor_type="row", zebra_stripes=True)
            yield Label("esc back" if self.snapshot.error else TABLE_KEYS, classes="view-keys")

    def on_mount(self) -> None:
        self.top_n = fitting_top_n(self.size.height)
        snapshot = self.snapshot
        self.query_one("#view").border_title = f"profile {snapshot.label}"
        self.query_one("#view").border_subtitle = snapshot.dir
        if snapshot.error:
            self.query_one("#profile-status", Static).update(f"steps {snapshot.steps} · files (if any) in {snapshot.dir}")
            return
        self.redraw()
        self.query_one(DataTable).focus()

    def rows(self) -> ProfileRows:
        if self.by_shape not in self._rows:
            self._rows[self.by_shape] = snapshot_rows(self.snapshot, self.by_shape)
        return self._rows[self.by_shape]

    def columns(self) -> list[ProfileColumn]:
        shown = [NAME] + ([SHAPES] if self.by_shape else [])
        device = has_device_times(self.rows().rows)
        return shown + [column for column in FIGURES if device or column.key not in DEVICE_KEYS]

    def sort_columns(self) -> list[str]:
        return [column.key for column in self.columns()]

    def redraw(self) -> None:
        if self.snapshot.error:
            return
        loaded = self.rows()
        columns = self.columns()
        if self.sort_key not in [column.key for column in columns]:
            self.sort_key = "self_cpu_us"
        ordered = sort_rows(loaded.rows, self.sort_key, self.reverse)
        shown = top(ordered, self.top_n)
        cells = []
        for row in shown:
            line: list[Any] = []
            for column in columns:
                if column.key == NAME.key:
                    line.append(Text(str(row.get("name", ""))))
                elif column.key == SHAPES.key:
                    line.append(_shapes_cell(row.get("input_shapes"), self.shapes_width()))
                else:
                    line.append(_figure_cell(column.kind, row.get(column.key)))
            cells.append(line)
        keys = [f"{row.get('name', '')}|{row.get('input_shapes', '') if self.by_shape else ''}" for row in shown]
        self.fill([(column.key, self.header(column.key, column.label)) for column in columns], cells, keys)
        sort_label = COLUMNS_BY_KEY[self.sort_key].label
        device = "" if has_device_times(loaded.rows) else " · no device time: device columns hidden"
        grouping = "by op and input shape" if self.by_shape else "by op"
        self.query_one("#profile-status", Static).update(
            f"{grouping} · sorted by {sort_label}, {self.order_words(self.sort_key)} · "
            f"{_top_label(self.top_n)} of {loaded.note}{device}"
        )


class ProfileCompareScreen(_TableScreen):
    """Two snapshots side by side on one figure (``m`` picks it), with ``after / before`` and the difference."""

    BINDINGS = [Binding("m", "cycle_metric", "Figure")]

    def __init__(self, before: ProfileSnapshot, after: ProfileSnapshot) -> None:
        super().__init__()
        self.before = before
        self.after = after
        self.metric = "self_cpu_us"
        self.sort_key = "size"
        self._rows: dict[bool, tuple[ProfileRows, ProfileRows]] = {}

    def compose(self) -> ComposeResult:
        with Vertical(id="view"):
            yield Static("", id="compare-status", classes="view-status")
            yield Static("", id="compare-total", classes="view-status")
            yield DataTable(id="compare-table", cursor_type="row", zebra_stripes=True)
            yield Label(f"m figure · {TABLE_KEYS}", classes="view-keys")

    def on_mount(self) -> None:
        self.top_n = fitting_top_n(self.size.height)
        self.query_one("#view").border_title = f"compare {self.before.label} → {self.after.label}"
        before, after = self.rows()
        if has_device_times(before.rows, after.rows):
            self.metric = "self_device_us"  # on a GPU run the device time is what AMP and friends change
        self.redraw()
        self.query_one(DataTable).focus()

    def rows(self) -> tuple[ProfileRows, ProfileRows]:
        if self.by_shape not in self._rows:
            self._rows[self.by_shape] = (snapshot_rows(self.before, self.by_shape), snapshot_rows(self.after, self.by_shape))
        return self._rows[self.by_shape]

    def metrics(self) -> list[str]:
        before, after = self.rows()
        device = has_device_times(before.rows, after.rows)
        return [key for key in FIGURE_KEYS if device or key not in DEVICE_KEYS]

    def columns(self) -> list[tuple[str, str, str]]:
        """(key, header, kind) of the comparison's columns."""
        figure = COLUMNS_BY_KEY[self.metric]
        a, b = f"#{self.before.number}", f"#{self.after.number}"
        shown = [(NAME.key, NAME.label, "text")] + ([(SHAPES.key, SHAPES.label, "text")] if self.by_shape else [])
        shown += [
            ("before", f"{figure.label} {a}", figure.kind),
            ("after", f"{figure.label} {b}", figure.kind),
            ("ratio", f"{b}/{a}", "ratio"),
            ("change", "change", figure.kind),
        ]
        if self.metric != "calls":
            shown += [("calls_before", f"calls {a}", "count"), ("calls_after", f"calls {b}", "count")]
        return shown

    def sort_columns(self) -> list[str]:
        return ["size"] + [key for key, _, _ in self.columns()]

    def action_cycle_metric(self) -> None:
        metrics = self.metrics()
        self.metric = metrics[(metrics.index(self.metric) + 1) % len(metrics)] if self.metric in metrics else metrics[0]
        self.redraw()

    def redraw(self) -> None:
        before, after = self.rows()
        if self.metric not in self.metrics():
            self.metric = "self_cpu_us"
        columns = self.columns()
        if self.sort_key not in self.sort_columns():
            self.sort_key = "size"
        entries = compare_entries(before.rows, after.rows, self.metric, by_shape=self.by_shape)
        ordered = sort_rows(entries, self.sort_key, self.reverse)
        shown = top(ordered, self.top_n)
        smaller_is_better = COLUMNS_BY_KEY[self.metric].kind in ("us", "bytes")
        cells = []
        for entry in shown:
            line: list[Any] = []
            for key, _, kind in columns:
                if key == NAME.key:
                    line.append(Text(entry["name"]))
                elif key == SHAPES.key:
                    line.append(_shapes_cell(entry["input_shapes"], self.shapes_width()))
                elif key == "ratio":
                    line.append(self._ratio_cell(entry, smaller_is_better))
                elif key == "change" and isinstance(entry[key], (int, float)) and entry[key] > 0:
                    line.append(Text("+" + format_figure(kind, entry[key]), justify="right"))
                else:
                    line.append(_figure_cell(kind, entry[key]))
            cells.append(line)
        keys = [f"{entry['name']}|{entry['input_shapes']}" for entry in shown]
        headers = [(key, self.header(key, label)) for key, label, _ in columns]
        self.fill(headers, cells, keys)
        figure = COLUMNS_BY_KEY[self.metric]
        grouping = "by op and input shape" if self.by_shape else "by op"
        a, b = f"#{self.before.number}", f"#{self.after.number}"
        if self.sort_key == "size":
            order = f"the larger of {a} and {b}" + (", smallest first" if self.reverse else "")
        else:
            order = f"{dict((key, label) for key, label, _ in columns).get(self.sort_key, self.sort_key)}, {self.order_words(self.sort_key)}"
        sources = f"{a}, {b}: {before.note}" if before.note == after.note else f"{a}: {before.note} · {b}: {after.note}"
        status = f"{figure.label} {grouping} · sorted by {order} · {_top_label(self.top_n)} of {len(entries)} · {sources}"
        self.query_one("#compare-status", Static).update(status)
        self.query_one("#compare-total", Static).update(self._total_line(before.rows, after.rows))

    def _ratio_cell(self, entry: dict[str, Any], smaller_is_better: bool) -> Text:
        if entry["only_in"]:
            number = self.before.number if entry["only_in"] == "before" else self.after.number
            return Text(f"only #{number}", style="dim", justify="right")
        value = entry["ratio"]
        style = ""
        if value is not None and smaller_is_better:
            style = "green" if value < 0.9 else ("red" if value > 1.1 else "")
        return Text(format_times(value), style=style, justify="right")

    def _total_line(self, before: list[dict[str, Any]], after: list[dict[str, Any]]) -> Text:
        """The sum over all ops, where it means something: self times and self memory add up, totals overlap."""
        figure = COLUMNS_BY_KEY[self.metric]
        if not (self.metric.startswith("self_") or self.metric == "calls"):
            return Text(f"{figure.label} includes child ops, so it has no meaningful sum over ops; m picks another figure",
                        style="dim")
        a, b = total(before, self.metric), total(after, self.metric)
        ratio = b / a if a and b is not None else None
        text = Text(f"all ops, {figure.label}: ")
        text.append(f"{format_figure(figure.kind, a)} → {format_figure(figure.kind, b)}", style="bold")
        text.append(f"  ({format_times(ratio)})" if ratio is not None else "")
        if figure.kind == "us":  # recorded one after the other, as the impact table's segments: the machine decides too
            text.append("  · taken at different times, so a load that changed shows too; a trial (T) does not",
                        style="dim")
        return text
