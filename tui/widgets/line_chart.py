"""A braille line chart of one or more ``Series``, drawn with the line API so a redraw stays cheap.

Why not a plotting library: textual-plotext needed 30–45 ms a frame even on thinned data, and a chart
here only needs lines, a y range and the first/last step. Each terminal cell holds a 2x4 braille dot
grid, so an 60x10 cell chart has 120x40 pixels; every series is min/max-thinned to about two points a
pixel column before drawing (spikes survive), and the drawn strips are cached until the data or the
size changes. Redraw cost is a few milliseconds regardless of history length.

Where a chart has several lines, colour alone does not tell them apart (NO_COLOR, a monochrome terminal,
a colour-blind reader): each line also carries its own marker (``marker(style)``: ● ▲ ■ ◆ ▼ ○) every few
columns along it and at its newest point, and whatever names the lines (a title, a legend) shows the marker
beside each name.

A chart may mark steps on its top row (``marks``: the loss chart's spikes, ``MARK``), in a style of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip
from textual.widget import Widget

from torchlab.tui.thinning import Series

# Braille dot bits, indexed [row 0..3][column 0..1] within a cell (Unicode 2800 block layout).
_DOTS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))
_LABEL_WIDTH = 9
#: The marker of each line style, in the order of ``line-chart--series-N``: shapes that differ in outline, not only
#: in colour.
MARKERS = ("●", "▲", "■", "◆", "▼", "○")
#: A marked step, on the chart's top row: no line's marker, and not a braille dot.
MARK = "×"
#: Cells without a line: a style of their own, never None (Textual's NO_COLOR filter reads every cell's style).
_NO_STYLE = Style()


def marker(style: int) -> str:
    """The marker of the lines drawn in ``style`` (``ChartLine.style``): what a title or legend shows beside a name."""
    return MARKERS[style % len(MARKERS)]


@dataclass(frozen=True)
class ChartLine:
    """One series on a chart, drawn in the style of component class ``line-chart--series-<style>``."""

    series: Series
    label: str
    style: int | None = None  # default: the line's position on the chart


class LineChart(Widget):
    """Lines of one or more series against step, with the y range on the left and the step range below."""

    COMPONENT_CLASSES = {
        "line-chart--axis",
        "line-chart--empty",
        "line-chart--series-0",
        "line-chart--series-1",
        "line-chart--series-2",
        "line-chart--series-3",
        "line-chart--series-4",
        "line-chart--series-5",
        "line-chart--mark",
    }

    DEFAULT_CSS = """
    LineChart {
        height: 1fr;
        min-height: 3;
    }
    LineChart > .line-chart--axis { color: $text-muted; }
    LineChart > .line-chart--empty { color: $text-muted; text-style: italic; }
    LineChart > .line-chart--series-0 { color: $primary-lighten-2; }
    LineChart > .line-chart--series-1 { color: $warning; }
    LineChart > .line-chart--series-2 { color: $success; }
    LineChart > .line-chart--series-3 { color: $accent; }
    LineChart > .line-chart--series-4 { color: $error; }
    LineChart > .line-chart--series-5 { color: $secondary; }
    LineChart > .line-chart--mark { color: $error; text-style: bold; }
    """
    #: the styles there are: a chart of more lines reuses them in turn
    STYLES = 6

    def __init__(
        self,
        *lines: ChartLine,
        marks: Sequence[float] = (),
        value_format: Callable[[float], str] | None = None,
        empty_text: str = "waiting for the first steps…",
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.lines = list(lines)
        #: steps marked on the top row (``MARK``), those within the lines' range of steps
        self.marks = marks
        self.value_format = value_format
        self.empty_text = empty_text
        #: what x is, under the chart's left end ("step 1"), and how its two ends are written
        self.x_name = "step"
        self.x_format: Callable[[float], str] = lambda x: str(int(x))
        self._strips: list[Strip] | None = None
        self._strips_size: tuple[int, int] = (0, 0)

    def data_changed(self) -> None:
        """The series grew or changed: redraw on the next frame."""
        self._strips = None
        self.refresh()

    def on_resize(self) -> None:
        self._strips = None

    def render_line(self, y: int) -> Strip:
        width, height = self.size
        if self._strips is None or self._strips_size != (width, height):
            self._strips = self._draw(width, height)
            self._strips_size = (width, height)
        return self._strips[y] if 0 <= y < len(self._strips) else Strip.blank(width, _NO_STYLE)

    # ------------------------------------------------------------------ drawing

    def _draw(self, width: int, height: int) -> list[Strip]:
        """Every row of the chart, as strips: the plot's rows behind their y labels, then the x axis where there is
        room for it (three rows or more)."""
        if width <= 0 or height <= 0:
            return []
        plot_width = width - _LABEL_WIDTH - 1
        show_x_axis = height >= 3
        plot_height = height - 1 if show_x_axis else height
        if plot_width < 2 or plot_height < 1:
            return [Strip.blank(width, _NO_STYLE) for _ in range(height)]
        pixel_w, pixel_h = plot_width * 2, plot_height * 4
        thinned = [line.series.thinned(pixel_w * 2) for line in self.lines]
        points = [(xs, ys) for xs, ys in thinned if xs]
        if not points:
            return self._draw_empty(width, height)
        scale = _Scale.fitting(points, pixel_w, pixel_h)
        cells = [[0] * plot_width for _ in range(plot_height)]
        owner = [[-1] * plot_width for _ in range(plot_height)]
        paths = {index: [scale.pixel(x, y) for x, y in zip(xs, ys)] for index, (xs, ys) in enumerate(thinned) if xs}
        for index, pixels in paths.items():
            _plot_path(pixels, cells, owner, index)
        marks = self._marks(paths, plot_width) if len(self.lines) > 1 else {}
        for column in self._marked_columns(scale):
            marks.setdefault(0, {})[column] = len(self.lines)
        strips = self._plot_rows(cells, owner, marks, self._y_labels(scale.y_low, scale.y_high, plot_height), width)
        if show_x_axis:
            axis_style = self.get_component_rich_style("line-chart--axis")
            strips.append(Strip([Segment(self._x_axis(scale.x_low, scale.x_high, width), axis_style)], width))
        return strips

    def _plot_rows(self, cells: list[list[int]], owner: list[list[int]], marks: dict[int, dict[int, int]],
                   labels: list[str], width: int) -> list[Strip]:
        """The plot's rows, each behind its y label: braille cells in the style of the line that owns them, and a
        marker (a line's, or a marked step's ``MARK``) in place of each cell in ``marks``."""
        axis_style = self.get_component_rich_style("line-chart--axis")
        styles, markers = self._styles_and_markers()
        strips: list[Strip] = []
        for row, label in enumerate(labels):
            segments = [Segment(label.rjust(_LABEL_WIDTH)[:_LABEL_WIDTH], axis_style),
                        Segment("┤" if label.strip() else "│", axis_style)]
            for column, index in marks.get(row, {}).items():
                owner[row][column] = index
            row_marks = {column: markers[index] for column, index in marks.get(row, {}).items()}
            segments.extend(_row_segments(cells[row], owner[row], styles, row_marks))
            strips.append(Strip(segments, width))
        return strips

    def _styles_and_markers(self) -> tuple[list[Style], list[str]]:
        """Each line's style and marker by the line's index; where steps are marked, theirs come after the lines'
        (at index ``len(self.lines)``)."""
        styles = [self.get_component_rich_style(f"line-chart--series-{self.style_of(i) % self.STYLES}")
                  for i in range(len(self.lines))]
        markers = [marker(self.style_of(i)) for i in range(len(self.lines))]
        if self.marks:
            styles.append(self.get_component_rich_style("line-chart--mark"))
            markers.append(MARK)
        return styles, markers

    def _marked_columns(self, scale: _Scale) -> list[int]:
        """The plot columns of the marked steps (``marks``) that lie within the lines' range of steps."""
        return [scale.pixel_x(x) >> 1 for x in self.marks if scale.x_low <= x <= scale.x_high]

    def _marks(self, paths: dict[int, list[tuple[int, int]]], plot_width: int) -> dict[int, dict[int, int]]:
        """Where each line's marker goes: row -> {column: the line's index}. Each line's markers are set off from the
        others' by a share of their spacing, so lines that run together still show each one's."""
        marks: dict[int, dict[int, int]] = {}
        spacing = max(8, plot_width // 6)
        for index, pixels in paths.items():
            for row, column in _marker_cells(pixels, spacing, offset=index * spacing // len(self.lines)):
                marks.setdefault(row, {})[column] = index
        return marks

    def style_of(self, index: int) -> int:
        """The style (colour and marker) of the chart's line at ``index``: its own, or its position."""
        style = self.lines[index].style
        return index if style is None else style

    def _draw_empty(self, width: int, height: int) -> list[Strip]:
        style = self.get_component_rich_style("line-chart--empty")
        strips = [Strip.blank(width, _NO_STYLE) for _ in range(height)]
        text = self.empty_text[:width]
        strips[height // 2] = Strip([Segment(text.center(width), style)], width)
        return strips

    def _y_labels(self, low: float, high: float, rows: int) -> list[str]:
        values = {0: high}
        if rows > 1:
            values[rows - 1] = low
        if rows >= 5:
            values[rows // 2] = (low + high) / 2
        labels = [""] * rows
        if self.value_format is not None:
            for row, value in values.items():
                labels[row] = self.value_format(value)
            return labels
        # One notation for the whole axis, chosen by its largest magnitude (an LR axis reads 1.00e-03 .. 1.00e-04).
        scientific = not 0.01 <= max(abs(low), abs(high)) < 100_000
        for row, value in values.items():
            labels[row] = f"{value:.2e}" if scientific else f"{value:.4g}"
        return labels

    def _x_axis(self, low: float, high: float, width: int) -> str:
        left = f"{self.x_name} {self.x_format(low)}"
        right = self.x_format(high)
        gap = width - _LABEL_WIDTH - 1 - len(left) - len(right)
        if gap < 1:
            return right.rjust(width)
        return " " * (_LABEL_WIDTH + 1) + left + " " * gap + right


@dataclass(frozen=True)
class _Scale:
    """Where a (step, value) point lands among the plot's braille pixels: the lines' range of steps spread over the
    pixel columns, their range of values over the pixel rows, highest on top (a flat line gets a band around it)."""

    x_low: float
    x_high: float
    y_low: float
    y_high: float
    pixel_w: int
    pixel_h: int

    @classmethod
    def fitting(cls, points: list[tuple[list[float], list[float]]], pixel_w: int, pixel_h: int) -> _Scale:
        """The scale that fits every point of the lines, ``(xs, ys)`` each, xs in order, none empty."""
        x_low = min(xs[0] for xs, _ in points)
        x_high = max(xs[-1] for xs, _ in points)
        y_low = min(min(ys) for _, ys in points)
        y_high = max(max(ys) for _, ys in points)
        if y_high == y_low:
            pad = abs(y_high) * 0.05 or 1.0
            y_low, y_high = y_low - pad, y_high + pad
        return cls(x_low, x_high, y_low, y_high, pixel_w, pixel_h)

    def pixel_x(self, x: float) -> int:
        """The pixel column of step ``x`` (one step alone sits at the left edge)."""
        return round((x - self.x_low) / ((self.x_high - self.x_low) or 1.0) * (self.pixel_w - 1))

    def pixel(self, x: float, y: float) -> tuple[int, int]:
        """The pixel (column, row) of the point ``(x, y)``."""
        return self.pixel_x(x), round((self.y_high - y) / (self.y_high - self.y_low) * (self.pixel_h - 1))


def _plot_path(pixels: list[tuple[int, int]], cells: list[list[int]], owner: list[list[int]], index: int) -> None:
    """Set the braille dots along straight segments joining consecutive pixels."""
    rows, cols = len(cells), len(cells[0])

    def dot(px: int, py: int) -> None:
        col, row = px >> 1, py >> 2
        if 0 <= row < rows and 0 <= col < cols:
            cells[row][col] |= _DOTS[py & 3][px & 1]
            owner[row][col] = index

    previous = pixels[0]
    dot(*previous)
    for current in pixels[1:]:
        x0, y0 = previous
        x1, y1 = current
        steps = max(abs(x1 - x0), abs(y1 - y0))
        for step in range(1, steps + 1):
            dot(x0 + (x1 - x0) * step // steps, y0 + (y1 - y0) * step // steps)
        previous = current


def _marker_cells(pixels: list[tuple[int, int]], spacing: int, offset: int) -> list[tuple[int, int]]:
    """The (row, column) cells of a line where its marker goes: its first point at or after ``offset`` and then
    one every ``spacing`` columns or more (each point of a sparse line, such as an evaluation every 50 steps), and its
    newest point, which takes the place of a marker too close before it."""
    first_in_column: dict[int, int] = {}
    for px, py in pixels:
        first_in_column.setdefault(px >> 1, py >> 2)
    chosen, next_at = [], offset
    for column in sorted(first_in_column):
        if column >= next_at:
            chosen.append(column)
            next_at = column + spacing
    newest_x, newest_y = pixels[-1]
    while chosen and (newest_x >> 1) - chosen[-1] < spacing // 2:
        chosen.pop()
    return [(first_in_column[column], column) for column in chosen] + [(newest_y >> 2, newest_x >> 1)]


def _row_segments(row: list[int], owners: list[int], styles: list[Style], marks: dict[int, str]) -> list[Segment]:
    """One row of braille cells (a marker in place of the cells in ``marks``), grouped into runs of the same series
    so there are few segments."""
    segments: list[Segment] = []
    run: list[str] = []
    run_owner = -2
    for column, (bits, who) in enumerate(zip(row, owners)):
        if who != run_owner and run:
            segments.append(Segment("".join(run), styles[run_owner] if run_owner >= 0 else _NO_STYLE))
            run = []
        run_owner = who
        run.append(marks.get(column) or (chr(0x2800 + bits) if bits else " "))
    if run:
        segments.append(Segment("".join(run), styles[run_owner] if run_owner >= 0 else _NO_STYLE))
    return segments
