"""The impact table: one row per option segment, so "bf16: 1.7x faster, -38 % memory" is read, not guessed.

Each step time shows its 90 % interval as "±x %" beside it, and the verdict sits next to it: it says
faster or slower only when the intervals of the two segments do not overlap, so the noise of a busy
machine reads as noise. Live: the trainer sends the table about once a second and at every change;
rows update in place, so the cursor stays where it is.

The trainer compares each segment with the nearest one before it that it could judge. ``b`` makes the row under
the cursor the baseline of every row instead, ``s`` the run's start; the app then judges each row against it with
``compare_segments``, the trainer's own definition of a verdict, from the rows' figures. Segments ran one after
the other, so ``T`` tries a row's change as a controlled trial, whose arms run on the same batches from one state.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rich.cells import cell_len
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Label, Static
from textual.widgets.data_table import ColumnKey

from torchlab.core.analysis.impact import SEGMENT_OPTIONS, WARMUP_STEPS, compare_segments, segment_name
from torchlab.core.analysis.step_times import MIN_TIMED_STEPS, SPREAD_AS_RATIO, plus_minus
from torchlab.core.analysis.trial_words import parse_trial, trial_verdict
from torchlab.core.options import TRIAL_KEY, OptionChangeError, format_option_value, parse_option_value
from torchlab.core.wire.payloads import ImpactSegment
from torchlab.core.wire.protocol import TrialCommand, TrialResult
from torchlab.tui.profiles import format_bytes, format_us
from torchlab.tui.screens.view_screen import ViewScreen, closing_key
from torchlab.tui.state import RunState

#: (key, header): the verdict beside the step time it judges, so that both fit in 80 columns
COLUMNS = (
    ("change", "change"),
    ("steps", "steps"),
    ("step_time", "step time"),
    ("verdict", "vs the segment before"),  # or the baseline chosen: ``baseline_header``
    ("samples", "samples/s"),
    ("data_wait", "data wait"),
    ("activations", "activations"),
    ("memory", "memory"),
    ("predicted", "predicted"),
    ("slope", "loss slope"),
)


#: Where the change and the verdict are in a row of cells (``COLUMNS``)
CHANGE, VERDICT = 0, 3

#: Columns of a table before its verdict: their widths decide how wide the verdict may be.
BEFORE_VERDICT = 3
#: The narrowest a verdict is wrapped to so that every column after it stays on the screen: narrower, it would take
#: more lines than the columns after it are worth, and those go a scroll away instead.
MIN_VERDICT_BESIDE = 40
#: Where the table is wider than the screen, a change ("accum=2, lr_scale=0.5") wraps between its options to this
#: width, so that the verdict beside it keeps its room at 80 columns.
CHANGE_WIDTH = 16
#: The narrowest a verdict is wrapped to, on a screen narrower than 80 columns (at 80, with the change wrapped, the
#: verdict has twice this): narrower, a verdict would be a column of single words.
MIN_VERDICT_WIDTH = 14
#: What the frame and a table's scrollbar take from the screen's width, and a cell's padding (one each side).
FRAME_WIDTH, SCROLLBAR_WIDTH, CELL_PADDING = 4, 1, 2
ELLIPSIS = "…"


def wrap_verdict(verdict: str, width: int) -> str:
    """``verdict`` in lines of at most ``width`` where it is wider: broken after a part's comma ("1.72x faster,"
    / "memory -36 %") or before a parenthesis, never inside a figure, so at 80 columns it is read whole instead of
    being cut at the screen's edge. A part wider than ``width`` is broken between its words ("could not run: cannot
    run here: changing the world size ..."), never inside a figure ("4.2 → 0.1 ms")."""
    if len(verdict) <= width:
        return verdict
    tokens: list[tuple[str, str]] = []  # (what joins it to the token before, the token)
    for index, part in enumerate(verdict.split(", ")):
        head, parenthesis, rest = part.partition(" (")
        tokens.append(("" if index == 0 else ", ", head))
        if parenthesis:
            tokens.append((" ", "(" + rest))
    lines, line = [], ""
    for joiner, token in tokens:
        if not line:
            line = token
        elif len(line) + len(joiner) + len(token) <= width:
            line += joiner + token
        else:
            lines.append(line + joiner.rstrip())
            line = token
        if len(line) > width:  # a part of its own too wide: its words, as far as they go
            *whole, line = _word_lines(line, width)
            lines.extend(whole)
    return "\n".join([*lines, line])


#: A space that joins a figure's parts, never broken: before a unit, around an arrow ("4.2 → 0.1 ms").
_WITHIN_A_FIGURE = re.compile(r" (?=%|ms\b|µs\b|s\b|x\b|MiB\b|GiB\b|KiB\b|→)|(?<=→) ")


def _word_lines(text: str, width: int) -> list[str]:
    """``text`` broken between words into lines of at most ``width``; never inside a figure (``_WITHIN_A_FIGURE``),
    which keeps its line whole where it is wider (at 80 columns a verdict has twice the widest figure's room)."""
    words = _WITHIN_A_FIGURE.sub("\0", text).split(" ")
    lines: list[str] = []
    for word in (word.replace("\0", " ") for word in words):
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def fit_words(text: str, width: int) -> str:
    """``text`` as it fits ``width``: whole, or cut after its last word that fits, ending in "…" ("vs the segment…"),
    never inside a word unless the first alone is wider."""
    if len(text) <= width:
        return text
    cut = text[: width - len(ELLIPSIS) + 1]
    words = cut[: cut.rfind(" ")].rstrip(" ,(") if " " in cut else ""
    return (words or text[: width - len(ELLIPSIS)]) + ELLIPSIS


def column_widths(rows: list[list[Text]], headers: list[str]) -> list[int]:
    """Each column's width with its padding, as wide as its widest cell's widest line, or its header."""
    return [max([len(header), *(_widest_line(row[column]) for row in rows)]) + CELL_PADDING
            for column, header in enumerate(headers)]


def _widest_line(cell: Text) -> int:
    return max((cell_len(line) for line in cell.plain.splitlines()), default=0)


def verdict_width(screen_width: int, rows: list[list[Text]], headers: list[str]) -> int | None:
    """The verdict column's width where the table is wider than the screen, else None (every column as wide as
    its content). Where the other columns leave the verdict ``MIN_VERDICT_BESIDE`` or more, that is its width: a
    long verdict wraps, and every column stays on the screen (at 160 columns, "no clear difference (±20 %, segments
    ran in turn, ...)" pushed samples/s and memory past its edge). Else it is what is left on the screen once the
    frame and the ``BEFORE_VERDICT`` columns are taken: the verdict ends at the screen's edge and the columns after
    it are a scroll away, none of them seen cut (a fixed least width once ran it past the edge: a header read "vs the
    segment be"). The column is made that wide and the verdict wrapped one narrower (the scrollbar may take one)."""
    widths = column_widths(rows, headers)
    room = screen_width - FRAME_WIDTH - SCROLLBAR_WIDTH
    if sum(widths) <= room:
        return None
    beside_the_others = room - (sum(widths) - widths[BEFORE_VERDICT]) - CELL_PADDING
    if beside_the_others >= MIN_VERDICT_BESIDE:
        return beside_the_others
    return max(MIN_VERDICT_WIDTH, screen_width - FRAME_WIDTH - sum(widths[:BEFORE_VERDICT]) - CELL_PADDING)


def segment_cells(segment: ImpactSegment, *, baseline: bool = False) -> list[Text]:
    """One segment as table cells, in ``COLUMNS`` order; a missing figure reads "–". ``baseline``: the row every
    other is compared with, which its verdict cell says."""
    steps = f"{segment.first_step}–{segment.last_step}"
    step_time = step_time_text(segment)
    samples = segment.median_samples_per_s
    allocated, tensors = segment.peak_allocated_bytes, segment.tensor_bytes
    memory = f"{format_bytes(allocated)} peak" if allocated is not None else format_bytes(tensors)
    slope = segment.loss_slope_per_100_steps
    # The verdict repeats the change ("amp=bf16: 1.72x faster, ..."): the table shows what follows it.
    change, verdict = segment.change, segment.verdict
    verdict = verdict[len(change) + 2 :] if verdict.startswith(change + ": ") else ("" if verdict == change else verdict)
    speedup = segment.speedup
    verdict_style = "" if speedup is None else ("green" if speedup >= 1.05 else ("red" if speedup <= 0.95 else ""))
    if baseline:
        verdict, verdict_style = "baseline", "bold reverse"
    return [
        Text(change, style="bold"),
        Text(steps, justify="right"),
        Text(step_time, justify="right"),
        Text(verdict or "–", style=verdict_style),
        Text(f"{samples:,.0f}" if samples is not None else "–", justify="right"),
        Text(format_us(segment.median_data_wait_s * 1e6) if segment.median_data_wait_s is not None else "–", justify="right"),
        Text(format_bytes(segment.activations_bytes), justify="right"),
        Text(memory, justify="right"),
        Text(predicted_text(segment), justify="right"),
        Text(f"{slope:+.3g}" if slope is not None else "–", justify="right"),
    ]


def predicted_text(segment: ImpactSegment) -> str:
    """``26.9 MiB, -1.5 %``: what the forecast predicted of the memory beside it and how far the measured figure is
    from it; "–" where the segment's settings were not predicted ("what fits", F, asks)."""
    if segment.predicted_bytes is None or segment.prediction_error is None:
        return "–"
    return f"{format_bytes(segment.predicted_bytes)}, {segment.prediction_error * 100:+.1f} %"


def step_time_text(segment: ImpactSegment) -> str:
    """``12.3 ms ±4 %``: the median and how far its 90 % interval reaches on its wider side (an interval
    need not be symmetric: a burst of slow steps stretches only its upper end); the median alone where
    there were too few steps for an interval."""
    median, low, high = segment.median_step_time_s, segment.step_time_low_s, segment.step_time_high_s
    if median is None:
        return "–"
    if low is None or high is None or median <= 0:
        return format_us(median * 1e6)
    spread = max(high - median, median - low) / median
    # From 100 % on only the upper end can reach that far: as a ratio ("≤3.9x") it reads, as "±290 %" it does not.
    return f"{format_us(median * 1e6)} {plus_minus(spread) if spread < SPREAD_AS_RATIO else f'≤{1 + spread:.1f}x'}"


@dataclass(frozen=True)
class RowTrial:
    """The trial that ``T`` on an impact row asks for, and how it was chosen from the row (for the log)."""

    command: TrialCommand
    why: str


def row_trial(segments: list[ImpactSegment], index: int, state: RunState) -> RowTrial:
    """A controlled trial of row ``index``'s change (option=value), checked as the trial prompt checks one, or
    OptionChangeError saying why there is none: the start changed nothing, a trial tries one option, not the world size.

    Where the run has the row's value already, a trial of it would compare the run with itself: the trial is of
    the value the row changed from (``checkpointing=off`` against the run as it is, with checkpointing on)."""
    if not 0 <= index < len(segments):
        raise OptionChangeError("no row under the cursor")
    row = segments[index]
    if index == 0:
        raise OptionChangeError(f"the {row.change} changed no option: choose the row of a change")
    before = segments[index - 1].options
    changed = [name for name in SEGMENT_OPTIONS if before.get(name) != row.options.get(name)]
    if len(changed) != 1:
        raise OptionChangeError(f"a trial tries one option; this row changed {' and '.join(changed) or 'none'} at once: "
                            f"T on the main screen tries one of them")
    name = changed[0]
    value, why = row.options.get(name), ""
    if value == state.option(name):
        value = before.get(name)
        why = f" (the row's change undone: the run has {name}={format_option_value(name, row.options.get(name))} now)"
    command = parse_trial(f"{name}={format_option_value(name, value)}")  # refuses what the prompt refuses
    reason = state.would_refuse(name, parse_option_value(name, command.value))
    if reason is not None:
        raise OptionChangeError(reason)
    return RowTrial(command, why)


def baseline_header(baseline: ImpactSegment | None) -> str:
    """The verdict column's header: what every row is compared with."""
    return COLUMNS[3][1] if baseline is None else f"vs {segment_name(baseline)}"


#: How to read the table, in one line at 80 columns: the rows keep the screen (eight lines of it left two rows at 24).
SHORT_EXPLANATION = "medians of timed steps, ± their 90 % interval; judged where intervals part"
#: The whole of it, on ``e`` (and at first where the screen has ``EXPLAINED_FROM_ROWS`` rows).
EXPLANATION = (
    f"Each option change starts a segment. Step time, samples/s and data wait are medians without a change's first "
    f"{WARMUP_STEPS} steps, profiled or compiling steps; ± is how far the step time's 90 % interval reaches (≤3.9x: up "
    f"to 3.9 times the median). Faster or slower only where the intervals do not overlap, with {MIN_TIMED_STEPS} timed "
    "steps a side (a shorter segment is skipped over: the verdict names the one it compares with) and other processes' "
    "CPU use steady; segments ran in turn, so a changing load can decide: T runs a trial. Activations: saved for "
    "backward; memory: the CUDA allocator's peak, else the tensors' total (M); predicted: that figure as the "
    "forecast predicted it (F), and how far the measured is from it; loss slope per 100 steps, not judged."
)
EXPLAINED_FROM_ROWS = 40

#: The view's keys, in one line at 80 columns; where columns are a scroll away, the keys that scroll to them too.
KEYS = "b baseline · s vs start · T trial of the row's change · e explain · esc back"
KEYS_SCROLLED = "b baseline · s vs start · T trial of the row · ← → columns · e explain · esc"

#: (key, header) of the trials' table
TRIAL_COLUMNS = (("step", "step"), ("trial", "trial"), ("steps", "steps"), ("verdict", "vs as it is"))


def trial_cells(result: TrialResult) -> list[Text]:
    """One trial as table cells, in ``TRIAL_COLUMNS`` order (the verdict fourth: ``BEFORE_VERDICT`` columns precede it)."""
    trial = result.arms[0].label if result.arms else f"{result.option}={result.value}"
    style = "yellow" if result.error is not None or any(arm.error for arm in result.arms) else ""
    return [Text(str(result.step), justify="right"), Text(trial, style="bold"), Text(str(result.steps), justify="right"),
            Text(trial_verdict(result), style=style)]


class ImpactScreen(ViewScreen):
    """Per segment: median step time with its interval, the verdict against the one before, samples/s,
    memory and loss slope."""

    DEFAULT_CSS = """
    ImpactScreen #impact-table { min-height: 4; scrollbar-size-horizontal: 0; }
    ImpactScreen #trials-title { text-style: bold; padding: 1 0 0 0; }
    ImpactScreen #trials-table { height: auto; max-height: 30%; scrollbar-size-horizontal: 0; }
    """

    BINDINGS = [
        closing_key("i"),
        Binding("b", "mark_baseline", "Baseline"),
        Binding("s", "baseline_start", "Vs start"),
        Binding(TRIAL_KEY, "trial_row", "Trial"),
        Binding("e", "explain", "Explain"),
    ]

    def compose(self) -> ComposeResult:
        with Vertical(id="view"):
            yield Static("", id="impact-latest")
            yield DataTable(id="impact-table", cursor_type="row", zebra_stripes=True)
            yield Static("", id="impact-empty", classes="view-empty")
            yield Label("trials (T): each changed option against as it is, same batches, same state",
                        id="trials-title")
            yield DataTable(id="trials-table", cursor_type="row", zebra_stripes=True)
            yield Static(SHORT_EXPLANATION, id="impact-explanation", classes="view-status")
            # One row at 80 columns (it ended "... to start a n…" there).
            yield Label(KEYS, classes="view-keys")

    def __init__(self, state: RunState | None = None) -> None:
        super().__init__(state)
        self._row_heights: list[int] = []  # the lines each segment's row was added with (its verdict's)
        self._trials_width: int | None = None  # the width the trials' verdicts were wrapped to
        #: the first step of the row every row is compared with (``b``, ``s``); None: the trainer's own verdicts
        self.baseline_step: int | None = None
        self._header = COLUMNS[3][1]  # the verdict column's header, as drawn
        self.explained = False  # the whole explanation shown (``e``), not its one line

    def on_mount(self) -> None:
        self.query_one("#view").border_title = "impact of each option change"
        self._explain(self.app.size.height >= EXPLAINED_FROM_ROWS)
        self._add_columns(self.query_one("#impact-table", DataTable))
        trials = self.query_one("#trials-table", DataTable)
        for key, label in TRIAL_COLUMNS:
            trials.add_column(label, key=key)
        self.show_state(self.state)
        self.query_one("#impact-table", DataTable).focus()

    def _add_columns(self, table: DataTable) -> None:
        for key, label in COLUMNS:
            table.add_column(self._header if key == "verdict" else label, key=key)

    # ------------------------------------------------------------------ keys

    def action_mark_baseline(self) -> None:
        """The row under the cursor becomes every row's baseline; on the baseline again, back to the trainer's."""
        segments = self.state.impact
        row = self.query_one("#impact-table", DataTable).cursor_row
        if 0 <= row < len(segments):
            step = segments[row].first_step
            self._choose_baseline(None if step == self.baseline_step else step)

    def action_baseline_start(self) -> None:
        """Every row compared with the run's start (its first segment); again: back to the trainer's."""
        segments = self.state.impact
        if segments:
            step = segments[0].first_step
            self._choose_baseline(None if step == self.baseline_step else step)

    def _choose_baseline(self, step: int | None) -> None:
        """Every row against the segment beginning at ``step`` (None: the trainer's verdicts); refused, saying why,
        for a segment too short to judge by (every verdict against it would read "too few steps to judge")."""
        chosen = next((row for row in self.state.impact if row.first_step == step), None)
        if chosen is not None and chosen.step_time_low_s is None:
            self.app.refuse_request(f"{segment_name(chosen)} as the baseline: too few timed steps to judge against "
                                    f"(steps {chosen.first_step}–{chosen.last_step}); choose a longer segment")
            return
        self.baseline_step = step
        self._seen_version = -1
        self.show_state(self.state)

    def action_explain(self) -> None:
        """How to read the table: the whole explanation, or back to its one line."""
        self._explain(not self.explained)

    def _explain(self, whole: bool) -> None:
        self.explained = whole
        self.query_one("#impact-explanation", Static).update(EXPLANATION if whole else SHORT_EXPLANATION)

    def action_trial_row(self) -> None:
        """A controlled trial of the change of the row under the cursor, sent as the trial prompt sends one."""
        segments = self.state.impact
        index = self.query_one("#impact-table", DataTable).cursor_row
        try:
            trial = row_trial(segments, index, self.state)
        except OptionChangeError as refusal:
            change = segments[index].change if 0 <= index < len(segments) else "the impact table"
            self.app.refuse_request(f"trial of {change}: {refusal} (nothing sent)")
            return
        self.app.request_trial(trial.command, trial.why)

    # ------------------------------------------------------------------ drawing

    def shown_rows(self, segments: list[ImpactSegment]) -> tuple[list[ImpactSegment], ImpactSegment | None]:
        """The rows as the table shows them, and the baseline chosen (None: the trainer's verdicts, each against
        the segment before it that it could judge). A chosen baseline that the table no longer holds (a new
        trainer's table) is forgotten."""
        baseline = next((row for row in segments if row.first_step == self.baseline_step), None)
        if baseline is None:
            self.baseline_step = None
            return segments, None
        return [row if row is baseline else compare_segments(row, baseline) for row in segments], baseline

    def on_resize(self) -> None:
        self._seen_version = -1  # the verdicts wrap to the new width at the next redraw

    def show_state(self, state: RunState) -> None:
        if state.impact_version == self._seen_version:
            return
        self._seen_version = state.impact_version
        table = self.query_one("#impact-table", DataTable)
        segments, baseline = self.shown_rows(state.impact)
        cursor = table.cursor_row  # where it goes back to once the rows are there again, if they are drawn anew
        if baseline_header(baseline) != self._header:  # a header is set when its column is added: the columns again
            self._header = baseline_header(baseline)
            table.clear(columns=True)
            self._add_columns(table)
            self._row_heights = []
        rows = [segment_cells(segment, baseline=segment is baseline) for segment in segments]
        headers = [header for _, header in COLUMNS]
        headers[VERDICT] = self._header
        screen_width = self.app.size.width
        width = verdict_width(screen_width, rows, headers)
        if width is not None and width < MIN_VERDICT_BESIDE:  # columns a scroll away: a change of several options
            for cells in rows:                                # takes lines, not the verdict's room
                cells[CHANGE] = _wrapped(cells[CHANGE], CHANGE_WIDTH)
            width = verdict_width(screen_width, rows, headers)
        others = sum(column_widths(rows, headers)) - column_widths(rows, headers)[VERDICT]
        past_the_edge = width is not None and others + width > screen_width - FRAME_WIDTH - SCROLLBAR_WIDTH
        self.query_one(".view-keys", Label).update(KEYS_SCROLLED if past_the_edge else KEYS)
        verdicts = table.columns[ColumnKey("verdict")]
        verdicts.width, verdicts.auto_width = width or 0, width is None
        verdicts.label = Text(fit_words(self._header, width - CELL_PADDING) if width is not None else self._header)
        if width is not None:
            for cells in rows:
                cells[VERDICT] = _wrapped(cells[VERDICT], width - SCROLLBAR_WIDTH)
        heights = [max(len(cells[column].plain.splitlines()) for column in (CHANGE, VERDICT)) or 1 for cells in rows]
        if heights[: table.row_count] != self._row_heights:
            # A row's height is fixed when it is added: one whose verdict now takes more (or fewer) lines, or a new
            # trainer's table (a restart), is drawn again from the top, the cursor kept where it was.
            table.clear()
            self._row_heights = []
        for index, cells in enumerate(rows):
            key = str(index)
            if index < table.row_count:
                for (column, _), cell in zip(COLUMNS, cells):
                    table.update_cell(key, column, cell, update_width=True)
            else:
                table.add_row(*cells, key=key, height=heights[index])
                self._row_heights.append(heights[index])
        if table.cursor_row != cursor and cursor < table.row_count:
            table.move_cursor(row=cursor)
        self._show_latest(state.impact)
        self._show_trials(state.trials)

    def _show_latest(self, segments: list[ImpactSegment]) -> None:
        """The newest change's verdict as the trainer gave it, whatever the baseline chosen; or why there is none."""
        latest = self.query_one("#impact-latest", Static)
        changed = [segment for segment in segments[1:] if segment.verdict]
        if changed:
            newest = changed[-1]
            text = Text("latest: ", style="dim")
            text.append(newest.verdict, style="bold")
            text.append(f" (steps {newest.first_step}–{newest.last_step})", style="dim")
            latest.update(text)
        else:
            latest.update(Text("no option change yet: this run has one segment", style="dim"))
        empty = self.query_one("#impact-empty", Static)
        empty.display = not segments
        empty.update("No segments yet: the first starts with the first metrics." if not segments else "")

    def _show_trials(self, results: list[TrialResult]) -> None:
        trials = self.query_one("#trials-table", DataTable)
        trial_rows = [trial_cells(result) for result in results]
        width = verdict_width(self.app.size.width, trial_rows, [header for _, header in TRIAL_COLUMNS])
        if width != self._trials_width:  # their verdicts were wrapped to another width: again, at this one
            trials.clear()
            self._trials_width = width
            verdicts = trials.columns[ColumnKey("verdict")]  # as wide as they were wrapped: the table fits the screen
            verdicts.width, verdicts.auto_width = width or 0, width is None
        for cells in trial_rows[trials.row_count :]:
            if width is not None:  # the verdict is the trials' last column: it wraps, and nothing comes after it
                cells[-1] = _wrapped(cells[-1], width - SCROLLBAR_WIDTH)
            trials.add_row(*cells, height=len(cells[-1].plain.splitlines()) or 1)
        trials.display = self.query_one("#trials-title").display = bool(results)


def _wrapped(cell: Text, width: int) -> Text:
    """A verdict cell wrapped by ``wrap_verdict``, in its style."""
    return Text(wrap_verdict(cell.plain, width), style=cell.style, justify=cell.justify)
