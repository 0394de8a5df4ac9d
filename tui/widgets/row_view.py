"""A keyed, fixed-column row list drawn with the Line API: only rows whose text changed are re-rendered.

Textual's ``DataTable`` invalidates the render cache of every visible row on any ``update_cell``, so a
table whose numbers stream in re-renders in full on every update (50-100 ms at 120x40). Here each row's
``Strip`` is cached by its cell values and how it is drawn (cursor, even or odd), and ``set_rows`` only
refreshes the lines whose content or position changed: a new set of gradient norms costs a few lines.

Cells are ``(text, style)`` pairs rather than ``rich.text.Text``: tuples of strings compare exactly
(``Text`` equality ignores the base style), and that comparison is what decides what to redraw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

#: One cell: its text and a Rich style string ("" for none).
Cell = tuple[str, str]
#: One row: its key and its cells, one per column.
Row = tuple[str, tuple[Cell, ...]]


@dataclass(frozen=True)
class Column:
    """A column: its key (for ``get_cell`` and header clicks), header label, width in cells, alignment."""

    key: str
    label: str
    width: int
    justify: Literal["left", "right"] = "left"


class RowView(ScrollView, can_focus=True):
    """A header line over keyed rows with zebra stripes and a row cursor that stays on its key."""

    DEFAULT_CSS = """
    RowView {
        background: $surface;
        color: $foreground;
        overflow-x: hidden;
        &:focus {
            background-tint: $foreground 5%;
            & > .row-view--cursor {
                background: $block-cursor-background;
                color: $block-cursor-foreground;
                text-style: $block-cursor-text-style;
            }
        }
        &:dark > .row-view--even-row {
            background: $surface-darken-1 40%;
        }
        & > .row-view--header {
            text-style: bold;
            background: $panel;
            color: $foreground;
        }
        & > .row-view--even-row {
            background: $surface-lighten-1 50%;
        }
        & > .row-view--cursor {
            background: $block-cursor-blurred-background;
            color: $block-cursor-blurred-foreground;
            text-style: $block-cursor-blurred-text-style;
        }
    }
    """

    COMPONENT_CLASSES = {"row-view--header", "row-view--even-row", "row-view--odd-row", "row-view--cursor"}

    BINDINGS = [
        Binding("up", "cursor_up", "Up", show=False),
        Binding("down", "cursor_down", "Down", show=False),
        Binding("pageup", "page_up", "Page up", show=False),
        Binding("pagedown", "page_down", "Page down", show=False),
        Binding("home", "first", "First", show=False),
        Binding("end", "last", "Last", show=False),
        Binding("enter", "select", "Select", show=False),
    ]

    class RowSelected(Message):
        """Enter (or a click on the cursor row) chose a row."""

        def __init__(self, row_view: RowView, row_key: str) -> None:
            super().__init__()
            self.row_view = row_view
            self.row_key = row_key

        @property
        def control(self) -> RowView:
            return self.row_view

    class HeaderSelected(Message):
        """A click on a column's header."""

        def __init__(self, row_view: RowView, column_key: str) -> None:
            super().__init__()
            self.row_view = row_view
            self.column_key = column_key

        @property
        def control(self) -> RowView:
            return self.row_view

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.columns: tuple[Column, ...] = ()
        self._keys: list[str] = []
        self._cells: dict[str, tuple[Cell, ...]] = {}
        self._index: dict[str, int] = {}
        self.cursor_row = 0
        #: row key -> (cells, variant, width, strip): a row is drawn again only when one of these changes
        self._strips: dict[str, tuple[tuple[Cell, ...], str, int, Strip]] = {}
        self._header: tuple[int, Strip] | None = None

    # ------------------------------------------------------------------ content

    @property
    def row_count(self) -> int:
        return len(self._keys)

    @property
    def row_keys(self) -> list[str]:
        """Row keys in display order."""
        return list(self._keys)

    @property
    def cursor_key(self) -> str | None:
        return self._keys[self.cursor_row] if self._keys else None

    def get_cell(self, row_key: str, column_key: str) -> str:
        """The text shown in one cell; ``KeyError`` for an unknown row or column."""
        index = next((i for i, column in enumerate(self.columns) if column.key == column_key), None)
        if index is None:
            raise KeyError(column_key)
        return self._cells[row_key][index][0]

    def set_columns(self, columns: Sequence[Column]) -> None:
        """New columns invalidate every drawn row; the caller sets the rows again to match them."""
        self.columns = tuple(columns)
        self._strips.clear()
        self._header = None
        self._keys, self._cells, self._index = [], {}, {}
        self._update_virtual_size()
        self.refresh()

    def set_rows(self, rows: Sequence[Row]) -> None:
        """Show these rows in this order, redrawing only lines whose row or cells changed.

        The cursor stays on its row key when that row is still shown (else at the same index, clamped), and
        the view scrolls only as far as needed to keep the cursor visible.
        """
        old_keys, old_cells, cursor_key = self._keys, self._cells, self.cursor_key
        self._keys = [key for key, _ in rows]
        self._cells = dict(rows)
        self._index = {key: index for index, key in enumerate(self._keys)}
        for key in [key for key in self._strips if key not in self._cells]:
            del self._strips[key]
        old_cursor = self.cursor_row
        if cursor_key in self._index:
            self.cursor_row = self._index[cursor_key]
        else:
            self.cursor_row = max(0, min(self.cursor_row, len(self._keys) - 1))
        if len(old_keys) != len(self._keys):
            self._update_virtual_size()
            self.refresh()
        else:
            changed = {
                index
                for index, key in enumerate(self._keys)
                if old_keys[index] != key or old_cells.get(key) != self._cells[key]
            }
            if old_cursor != self.cursor_row:
                changed |= {old_cursor, self.cursor_row}
            # Rows out of view are drawn (from the cells, or the cache if unchanged) when scrolled to;
            # when most of the view changed, one refresh of the widget costs less than one per line.
            top = int(self.scroll_offset.y)
            shown = [index for index in changed if top <= index < top + self._page]
            if len(shown) > self._page // 2:
                self.refresh()
            else:
                for index in shown:
                    self._refresh_row(index)
        self._scroll_to_cursor()

    # ------------------------------------------------------------------ cursor

    def move_cursor(self, row: int) -> None:
        """Put the cursor on a row (clamped), redraw the two lines concerned and keep it in view."""
        if not self._keys:
            return
        row = max(0, min(row, len(self._keys) - 1))
        if row != self.cursor_row:
            self._refresh_row(self.cursor_row)
            self.cursor_row = row
            self._refresh_row(row)
        self._scroll_to_cursor()

    @property
    def _page(self) -> int:
        """Rows on one screen (the header takes a line)."""
        return max(1, self.scrollable_content_region.height - 1)

    def action_cursor_up(self) -> None:
        self.move_cursor(self.cursor_row - 1)

    def action_cursor_down(self) -> None:
        self.move_cursor(self.cursor_row + 1)

    def action_page_up(self) -> None:
        self.move_cursor(self.cursor_row - self._page)

    def action_page_down(self) -> None:
        self.move_cursor(self.cursor_row + self._page)

    def action_first(self) -> None:
        self.move_cursor(0)

    def action_last(self) -> None:
        self.move_cursor(len(self._keys) - 1)

    def action_select(self) -> None:
        if self._keys:
            self.post_message(self.RowSelected(self, self._keys[self.cursor_row]))

    def _on_click(self, event: events.Click) -> None:
        """A header click names its column; a row click moves the cursor there, or selects the cursor row."""
        offset = event.get_content_offset(self)
        if offset is None:
            return
        if offset.y == 0:
            column = self._column_at(offset.x)
            if column is not None:
                self.post_message(self.HeaderSelected(self, column.key))
            return
        row = int(self.scroll_offset.y) + offset.y - 1
        if 0 <= row < len(self._keys):
            if row == self.cursor_row:
                self.action_select()
            else:
                self.move_cursor(row)

    def _column_at(self, x: int) -> Column | None:
        left = 0
        for column in self.columns:
            if left <= x < left + column.width:
                return column
            left += column.width
        return None

    def _scroll_to_cursor(self) -> None:
        """Scroll the least that puts the cursor's row in view."""
        top = int(self.scroll_offset.y)
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False)
        elif self.cursor_row >= top + self._page:
            self.scroll_to(y=self.cursor_row - self._page + 1, animate=False)

    # ------------------------------------------------------------------ drawing

    def _update_virtual_size(self) -> None:
        self.virtual_size = Size(sum(column.width for column in self.columns), len(self._keys) + 1)

    def _refresh_row(self, index: int) -> None:
        self.refresh_line(index + 1)  # line 0 of the virtual space is the header's

    def notify_style_update(self) -> None:
        """Focus, theme and CSS changes restyle rows: the cached strips were drawn with the old styles."""
        super().notify_style_update()
        self._strips.clear()
        self._header = None

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        if y == 0:
            return self._header_strip(width)
        index = int(self.scroll_offset.y) + y - 1
        if not 0 <= index < len(self._keys):
            return Strip.blank(width, self.rich_style)
        key = self._keys[index]
        cells = self._cells[key]
        variant = "cursor" if index == self.cursor_row else ("even-row" if index % 2 == 0 else "odd-row")
        cached = self._strips.get(key)
        if cached is not None and cached[0] == cells and cached[1] == variant and cached[2] == width:
            return cached[3]
        base = self.get_component_rich_style(f"row-view--{variant}")
        strip = self._draw(cells, base, width)
        self._strips[key] = (cells, variant, width, strip)
        return strip

    def _header_strip(self, width: int) -> Strip:
        if self._header is None or self._header[0] != width:
            base = self.get_component_rich_style("row-view--header")
            self._header = (width, self._draw(tuple((column.label, "") for column in self.columns), base, width))
        return self._header[1]

    def _draw(self, cells: tuple[Cell, ...], base: Style, width: int) -> Strip:
        """One line: each cell fitted to its column, its style over the row's; the rest of the width blank."""
        segments = []
        for column, (text, style) in zip(self.columns, cells):
            segments.append(Segment(_fit(text, column.width, column.justify), base + Style.parse(style) if style else base))
        used = sum(column.width for column in self.columns)
        if width > used:
            segments.append(Segment(" " * (width - used), base))
        return Strip(segments).crop(0, width)


def _fit(text: str, width: int, justify: str) -> str:
    """Pad or cut text to exactly ``width`` cells, on the left for right-aligned columns."""
    length = cell_len(text)
    if length > width:
        return set_cell_size(text, width)
    padding = " " * (width - length)
    return padding + text if justify == "right" else text + padding
