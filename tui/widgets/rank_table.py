"""The ranks of a data-parallel run side by side, so a straggler stands out: step time, data wait,
allocator memory and RSS per rank, with the figure that makes a rank a straggler flagged.

Drawn from ``RunState.ranks`` (the newest ``Ranks`` message: at each probe, and about once a second) as a table sized to
the widget: columns that do not fit are left out, least useful first; with more ranks than rows, the
flagged and the slowest are shown. On a small terminal (``compact``) it is one summary line. Nothing of
it is shown at world size 1: the app hides the widget (``RunState.has_ranks``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rich.text import Text
from textual.geometry import Size
from textual.reactive import reactive
from textual.widget import Widget

from torchlab.core.wire.run_status import RunStatus
from torchlab.core.wire.straggler import Straggler
from torchlab.tui.state import RunState
from torchlab.core.analysis.stragglers import ComparedRank
from torchlab.core.units import format_bytes, format_seconds
from torchlab.tui.formatting import fit_parts
from torchlab.tui.widgets.system_panel import NA

FLAG_STYLE = "bold yellow"
FLAG_MARK = "⚑"
#: Rows of ranks the main screen shows (the system view, ``t``, shows more).
MAIN_ROWS = 8
#: Two spaces between columns.
GAP = "  "


@dataclass(frozen=True)
class RankColumn:
    """One column: its header, its width, and a rank's cell; ``flags`` names the straggler flag its figure
    raises, so a flagged rank's cell in it is coloured."""

    header: str
    width: int
    cell: Callable[[ComparedRank], str]
    flags: str = ""  # "step time", "data wait" (ComparedRank.flag), or "" for figures that flag nothing
    align: str = "right"


def _host_column(width: int) -> RankColumn:
    return RankColumn("host", width, lambda row: _clip(row.host, width), align="left")


RANK = RankColumn("rank", 4, lambda row: str(row.figures.rank))
STEP = RankColumn("step", 7, lambda row: format_seconds(row.figures.step_time_s), flags="step time")
VERSUS = RankColumn("vs others", 9, lambda row: format_versus(row.step_vs_others), flags="step time")
WAIT = RankColumn("data wait", 9, lambda row: format_seconds(row.figures.data_wait_s), flags="data wait")
ALLOC = RankColumn("alloc", 8, lambda row: _size(row.figures.allocated_bytes))
PEAK = RankColumn("peak", 8, lambda row: _size(row.figures.peak_allocated_bytes))
RESERVED = RankColumn("reserved", 8, lambda row: _size(row.figures.reserved_bytes))
RSS = RankColumn("rss", 8, lambda row: _size(row.figures.rss_bytes))
#: Each rank's machine, where the ranks span several (the host column is shown): its CPU busy and memory available.
HOST_CPU = RankColumn("host cpu", 8, lambda row: _percent(row.figures.host_cpu_percent))
HOST_FREE = RankColumn("host free", 9, lambda row: _size(row.figures.host_available_bytes))
#: Where each rank's steps went since the figures before (its phase clock's means), where the width allows.
FORWARD = RankColumn("forward", 8, lambda row: format_seconds(row.figures.forward_s))
BACKWARD = RankColumn("backward", 8, lambda row: format_seconds(row.figures.backward_s))
OPTIMIZER = RankColumn("optim", 7, lambda row: format_seconds(row.figures.optimizer_s))
#: The flag in words ("data wait 6.7× others") needs this much room after the figures, or it is left out
#: (the ⚑ beside the rank and the flagged figure's colour still say it).
FLAG_WORDS_MIN = 14


class RankTable(Widget):
    """Per-rank figures with stragglers flagged; one summary line when ``compact``."""

    DEFAULT_CSS = """
    RankTable {
        height: auto;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    compact: reactive[bool] = reactive(False)
    """One summary line instead of the table: for small terminals."""

    def __init__(self, *, max_rows: int = MAIN_ROWS, compact: bool = False, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.max_rows = max_rows
        self.set_reactive(RankTable.compact, compact)
        self._state: RunState | None = None

    def show(self, state: RunState) -> None:
        """Redraw from the run state (the app calls this when the rank figures changed)."""
        self._state = state
        count = len(state.ranks) or state.world_size
        at = f" · step {state.ranks_step}" if state.ranks_step is not None else ""
        self.border_title = f"{count} ranks{at}" if state.ranks else "ranks"
        self.refresh(layout=True)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._text(width, self.max_rows).plain.splitlines()) or 1

    def render(self) -> Text:
        # Held to fewer lines than it asked for (a max-height), it shows fewer ranks and says so.
        rows = min(self.max_rows, self.content_size.height - 1) if self.content_size.height > 1 else self.max_rows
        return self._text(self.content_size.width, rows)

    def _text(self, width: int, rows: int) -> Text:
        width = max(width, 20)
        if self.compact:
            return summary_line(self._state, width)
        return table_text(self._state, width, rows)


# ---------------------------------------------------------------------- the table

def table_text(state: RunState | None, width: int, max_rows: int) -> Text:
    """A header and a row per rank for ``width`` columns, in at most ``max_rows`` lines after the header
    (with more ranks than that, the last line says how many more)."""
    waiting = _waiting_text(state)
    if waiting is not None:
        return Text(waiting, style="dim italic")
    assert state is not None
    ranks = state.ranks
    columns, flag_words = layout_columns(ranks, width)
    shown = _rows_to_show(ranks, max_rows)
    lines = [_header(columns)]
    lines += [_row(row, columns, flag_words) for row in shown]
    shown_ranks = {row.figures.rank for row in shown}
    hidden = [row for row in ranks if row.figures.rank not in shown_ranks]
    if hidden:
        flagged = sum(1 for row in hidden if row.flag)
        lines.append(Text(f"… and {len(hidden)} more ranks, {flagged or 'none'} flagged", style="dim"))
    if state.straggler is not None:  # the trainer's verdict, over the window: not one report's flag (the log has it whole)
        lines.append(Text(_clip(verdict_line(state.straggler), width), style=FLAG_STYLE))
    return Text("\n").join(lines)


def layout_columns(ranks: list[ComparedRank], width: int) -> tuple[list[RankColumn], int]:
    """The columns that fit ``width``, and the room left for the flag in words (0: none): the figures
    first, then the hosts (when the ranks span several), the flag's words, peak and reserved memory."""
    on_cuda = any(row.figures.allocated_bytes is not None for row in ranks)
    hosts = {row.host for row in ranks if row.host}
    columns = [RANK, STEP, VERSUS, WAIT, ALLOC, RSS]
    used = _width(columns)
    if len(hosts) > 1:
        host = _host_column(min(16, max(len(name) for name in hosts)))
        if used + len(GAP) + host.width <= width:
            columns.insert(1, host)
            used += len(GAP) + host.width
            at = columns.index(RSS) + 1
            for telemetry in (HOST_CPU, HOST_FREE):  # each node's machine, after the figures that flag a straggler
                if used + len(GAP) + telemetry.width + len(GAP) + FLAG_WORDS_MIN <= width:
                    columns.insert(at, telemetry)
                    at, used = at + 1, used + len(GAP) + telemetry.width
    # The words' room is kept whether or not a rank is flagged now, so columns do not jump as flags come and go.
    words = FLAG_WORDS_MIN if used + len(GAP) + FLAG_WORDS_MIN <= width else 0
    if words:
        used += len(GAP) + words
    if on_cuda:
        extras = []
        for extra in (PEAK, RESERVED):  # the peak matters more: it is what runs out
            if used + len(GAP) + extra.width <= width:
                extras.append(extra)
                used += len(GAP) + extra.width
        at = columns.index(RSS)
        columns[at:at] = [extra for extra in (RESERVED, PEAK) if extra in extras]  # shown as torch names them
    timed, at = any(row.figures.forward_s is not None for row in ranks), columns.index(WAIT) + 1
    for phase in (FORWARD, BACKWARD, OPTIMIZER) if timed else ():  # after what runs out: memory
        if used + len(GAP) + phase.width <= width:
            columns.insert(at, phase)
            at, used = at + 1, used + len(GAP) + phase.width
    if words:
        words += width - used  # whatever is left
    return columns, words


def _width(columns: list[RankColumn]) -> int:
    return sum(column.width for column in columns) + len(GAP) * (len(columns) - 1)


def _header(columns: list[RankColumn]) -> Text:
    text = Text(style="dim")
    for index, column in enumerate(columns):
        if index:
            text.append(GAP)
        text.append(_align(column.header, column))
    return text


def _row(row: ComparedRank, columns: list[RankColumn], flag_words: int) -> Text:
    text = Text()
    for index, column in enumerate(columns):
        if index:
            text.append(GAP)
        if column is RANK and row.flag:
            text.append(_align(f"{FLAG_MARK} {row.figures.rank}", column), style=FLAG_STYLE)
        else:
            style = FLAG_STYLE if row.flag and column.flags == row.flag else ""
            text.append(_align(column.cell(row), column), style=style)
    if flag_words and row.flag:
        text.append(GAP)
        text.append(_clip(flag_text(row), flag_words), style=FLAG_STYLE)
    return text


def flag_text(row: ComparedRank) -> str:
    """``data wait 6.7× others``: the figure that makes the rank a straggler, against the others' median."""
    ratio = row.wait_vs_others if row.flag == "data wait" else row.step_vs_others
    times = f" {_ratio(ratio)} others" if ratio is not None else ""
    return f"{row.flag}{times}"


def verdict_line(verdict: Straggler) -> str:
    """The trainer's straggler verdict in a table's line (the log has its sentence whole): ``⚑ rank 1 +49.6 ms a step
    (20 %) for 32 steps: data wait``."""
    return (f"{FLAG_MARK} rank {verdict.rank} +{format_seconds(verdict.excess_s)} a step ({verdict.step_share * 100:.0f} %) "
            f"for {verdict.step - verdict.since_step:,} steps: {verdict.part}")


def _rows_to_show(ranks: list[ComparedRank], max_rows: int) -> list[ComparedRank]:
    """Every rank when they fit; else the flagged, then the slowest, in rank order, with a line for the rest."""
    if len(ranks) <= max_rows:
        return list(ranks)
    room = max(1, max_rows - 1)
    interesting = sorted(ranks, key=lambda row: (not row.flag, -(row.figures.step_time_s or 0.0), row.figures.rank))[:room]
    return sorted(interesting, key=lambda row: row.figures.rank)


def _align(value: str, column: RankColumn) -> str:
    value = _clip(value, column.width)
    return value.ljust(column.width) if column.align == "left" else value.rjust(column.width)


# ---------------------------------------------------------------------- one line for small terminals

def summary_line(state: RunState | None, width: int) -> Text:
    """``2 ranks · slowest rank 1 +17 % · data wait ≤0.48 ms · rss ≤381 MiB``; a straggler comes first.

    Whole figures only (one that does not fit is left out). The slowest rank against the others, not its time: the ranks' figures are one step's (gathered about once a
    second), and beside the stats bar's step time, the newest step's, that rank's time read as a second step time
    that disagreed with it (``step 47.6 ms`` above ``slowest rank 0 +3 % (154 ms)``). The table (``t``) has each
    rank's time, under the step it was measured at."""
    waiting = _waiting_text(state)
    if waiting is not None:
        relaunching = state is not None and state.state == RunStatus.RELAUNCHING
        subject = "ranks: " if relaunching else ""  # "2 ranks: waiting…" says it already
        return Text(f"{subject}{waiting}", style="dim italic")
    assert state is not None
    ranks = state.ranks
    parts = [Text(f"{len(ranks)} ranks", style="bold")]
    flagged = [row for row in ranks if row.flag]
    if flagged:
        worst = max(flagged, key=lambda row: (row.wait_vs_others if row.flag == "data wait" else row.step_vs_others) or 0.0)
        more = f" (+{len(flagged) - 1} more)" if len(flagged) > 1 else ""
        parts.append(Text(f"{FLAG_MARK} rank {worst.figures.rank} straggles: {flag_text(worst)}{more}", style=FLAG_STYLE))
    timed = [row for row in ranks if row.figures.step_time_s is not None]
    if timed:
        slowest = max(timed, key=lambda row: row.figures.step_time_s or 0.0)
        parts.append(Text.assemble(("slowest ", "dim"), (f"rank {slowest.figures.rank} {format_versus(slowest.step_vs_others)}", "bold")))
    for label, values, formatter in (
        ("data wait", [row.figures.data_wait_s for row in ranks], format_seconds),
        ("alloc", [row.figures.allocated_bytes for row in ranks], _size),
        ("rss", [row.figures.rss_bytes for row in ranks], _size),
    ):
        known = [value for value in values if value is not None]
        if known:  # no allocator on a CPU run: left out here (the table says n/a)
            parts.append(Text.assemble((f"{label} ", "dim"), (f"≤{formatter(max(known))}", "bold")))
    return fit_parts(parts, width, Text(" · ", style="dim"))  # whole figures: one that does not fit is left out


def _waiting_text(state: RunState | None) -> str | None:
    """What to say instead of figures, or None when there are figures to show."""
    if state is None or not state.has_ranks:
        return "single process: no per-rank figures"
    if state.state == RunStatus.RELAUNCHING:
        count = state.relaunch_to
        if state.relaunch_with:  # the same ranks, holding the model another way
            return f"relaunching the {count} ranks{state.relaunch_with}… figures once they train"
        if count == 1:
            return "relaunching as a single process…"
        target = f" as {count} processes" if count else ""
        return f"relaunching{target}… figures once the new ranks train"
    if not state.ranks:
        return f"{state.world_size} ranks: waiting for their first figures (gathered at each probe, about once a second)"
    return None


# ---------------------------------------------------------------------- formatting

def _percent(value: float | None) -> str:
    return NA if value is None else f"{value:.0f} %"


def format_versus(ratio: float | None) -> str:
    """A rank's figure against the others' median, as a difference: ``+17 %``, ``-4 %``, ``±0 %``."""
    if ratio is None:
        return "–"
    if ratio == float("inf"):
        return "∞"
    percent = round((ratio - 1) * 100)
    return f"{percent:+d} %" if percent else "±0 %"


def _ratio(ratio: float) -> str:
    if ratio == float("inf"):
        return "∞×"
    return f"{ratio:.1f}×" if ratio < 10 else f"{ratio:.0f}×"


def _clip(value: str, width: int) -> str:
    return value if len(value) <= width else value[: width - 1] + "…"


def _size(count: float | None) -> str:
    return format_bytes(count, missing=NA)
