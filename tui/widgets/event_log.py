"""The event log: acknowledgements with their step, refusals with the reason, checkpoints, trainer output.

RichLog renders a line once, at the width of the moment: after the terminal shrank (200x50 to 80x24) the log
kept lines cut at the old width and its scroll position among old lines. It keeps its entries and renders
them again when its width changes, and shows the newest line after any resize, as after any new line."""

from __future__ import annotations

import re
from collections import deque

from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment
from rich.text import Text
from textual import events
from textual.widgets import RichLog

from torchlab.tui.log_levels import EntryLevel
from torchlab.tui.state import LogEntry

#: level -> (mark, style)
LEVEL_MARKS: dict[EntryLevel, tuple[str, str]] = {
    EntryLevel.INFO: ("·", "dim"),
    EntryLevel.APPLIED: ("✓", "bold green"),
    EntryLevel.REFUSED: ("✗", "bold red"),
    EntryLevel.CHECKPOINT: ("◆", "bold cyan"),
    EntryLevel.WARNING: ("!", "bold yellow"),
    EntryLevel.ERROR: ("✖", "bold red"),
    EntryLevel.TRAINER: ("│", "dim"),
    EntryLevel.PROFILE: ("◷", "bold magenta"),
    EntryLevel.IMPACT: ("Δ", "bold magenta"),
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
        #: what is shown, to render again at a new width (an entry is at least one line: as many are kept)
        self._entries: deque[HangingEntry] = deque(maxlen=max_lines)
        self._rendered_width = 0

    def add(self, entry: LogEntry) -> None:
        mark, style = LEVEL_MARKS.get(entry.level, ("·", ""))
        step = f"{entry.step:>6}" if entry.step is not None else " " * 6
        gutter = Text.assemble((step, "dim"), " ", (mark, style), " ")
        body = Text(entry.text, style="dim" if entry.level == EntryLevel.TRAINER else ("red" if entry.level == EntryLevel.ERROR else ""))
        shown = HangingEntry(gutter, body)
        self._entries.append(shown)
        self.write(shown)
        self.lines_written.append(gutter.plain + body.plain)
        if len(self.lines_written) > self.max_lines:
            del self.lines_written[: len(self.lines_written) - self.max_lines]

    def on_resize(self, event: events.Resize) -> None:
        """Render the entries again at a new width, and show the newest, as every new entry does (auto_scroll)."""
        super().on_resize(event)
        if not self._size_known:
            return
        width = self.scrollable_content_region.width
        if width != self._rendered_width:
            self._rendered_width = width
            self.clear()
            for entry in self._entries:
                self.write(entry, scroll_end=False)
        self.scroll_end(animate=False, immediate=False, x_axis=False)


#: Where a line may break: at a run of spaces, except one between a number and its unit ("-5 %", "22.2 s",
#: "4.11 MiB"), which Rich's own wrap would split ("memory -5" at the end of a row, "%" under it).
_BREAKS = re.compile(r"(?<![0-9]) +| +(?!(?:%|ms|µs|s|min|h|x|B|KiB|MiB|GiB|TiB)(?:[\s,;:.)]|$))")


class HangingEntry:
    """An entry with a hanging indent: where the text needs a second row (a long reason, a trainer's warning at
    80 columns) it goes on under the text, so the step column shows only steps and each entry reads as one. Rows
    break between words, never between a figure and its unit; a word longer than a row (a path) is folded."""

    def __init__(self, gutter: Text, body: Text) -> None:
        self.gutter, self.body = gutter, body

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        indent = self.gutter.cell_len
        room = max(options.max_width - indent, 8)
        for index, row in enumerate(wrap_keeping_figures(self.body, room)):
            yield from (self.gutter if index == 0 else Text(" " * indent)).render(console)
            yield from row.render(console)
            yield Segment.line()


def wrap_keeping_figures(text: Text, width: int) -> list[Text]:
    """``text`` in rows of at most ``width`` cells, broken only where ``_BREAKS`` allows (the spaces at a break
    dropped), a word wider than a row folded; styles kept."""
    plain = text.plain
    words: list[tuple[int, int]] = []  # [start, end) of each unbreakable run, spaces inside it included
    start = 0
    for gap in _BREAKS.finditer(plain):
        if gap.start() > start:
            words.append((start, gap.start()))
        start = gap.end()
    if start < len(plain) or not words:
        words.append((start, len(plain)))
    rows: list[Text] = []
    row_start = row_end = None
    for word_start, word_end in words:
        while word_end - word_start > width:  # a path or a URL: fold it, after what the row already holds
            if row_start is not None:
                rows.append(text[row_start:row_end])
                row_start = None
            rows.append(text[word_start:word_start + width])
            word_start += width
        if row_start is not None and word_end - row_start <= width:
            row_end = word_end
            continue
        if row_start is not None:
            rows.append(text[row_start:row_end])
        row_start, row_end = word_start, word_end
    if row_start is not None:
        rows.append(text[row_start:row_end])
    return rows
