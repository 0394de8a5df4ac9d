"""The impact table: one row per option segment, so "bf16: 1.7x faster, -38 % memory" is read, not guessed.

Each step time shows its 90 % interval as "±x %" beside it, and the verdict sits next to it: it says
faster or slower only when the intervals of the two segments do not overlap, so the noise of a busy
machine reads as noise. Live: the trainer sends the table about once a second and at every change;
rows update in place, so the cursor stays where it is.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Label, Static

from torchlab.core.wire.impact import MIN_TIMED_STEPS, WARMUP_STEPS, plus_minus
from torchlab.core.wire.payloads import ImpactSegment
from torchlab.core.wire.protocol import TrialResult
from torchlab.core.wire.trials import trial_verdict
from torchlab.tui.profiles import format_bytes, format_us
from torchlab.tui.screens.view_screen import ViewScreen
from torchlab.tui.state import RunState

#: (key, header): the verdict beside the step time it judges, so that both fit in 80 columns
COLUMNS = (
    ("change", "change"),
    ("steps", "steps"),
    ("step_time", "step time"),
    ("verdict", "vs the segment before"),
    ("samples", "samples/s"),
    ("data_wait", "data wait"),
    ("activations", "activations"),
    ("memory", "memory"),
    ("slope", "loss slope"),
)


def segment_cells(segment: ImpactSegment) -> list[Text]:
    """One segment as table cells, in ``COLUMNS`` order; a missing figure reads "–"."""
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
    return [
        Text(change, style="bold"),
        Text(steps, justify="right"),
        Text(step_time, justify="right"),
        Text(verdict or "–", style=verdict_style),
        Text(f"{samples:,.0f}" if samples is not None else "–", justify="right"),
        Text(format_us(segment.median_data_wait_s * 1e6) if segment.median_data_wait_s is not None else "–", justify="right"),
        Text(format_bytes(segment.activations_bytes), justify="right"),
        Text(memory, justify="right"),
        Text(f"{slope:+.3g}" if slope is not None else "–", justify="right"),
    ]


def step_time_text(segment: ImpactSegment) -> str:
    """``12.3 ms ±4 %``: the median and how far its 90 % interval reaches on its wider side (an interval
    need not be symmetric: a burst of slow steps stretches only its upper end); the median alone where
    there were too few steps for an interval."""
    median, low, high = segment.median_step_time_s, segment.step_time_low_s, segment.step_time_high_s
    if median is None:
        return "–"
    if low is None or high is None or median <= 0:
        return format_us(median * 1e6)
    return f"{format_us(median * 1e6)} {plus_minus(max(high - median, median - low) / median)}"


#: (key, header) of the trials' table
TRIAL_COLUMNS = (("step", "step"), ("trial", "trial"), ("steps", "steps"), ("verdict", "vs as it is"))


def trial_cells(result: TrialResult) -> list[Text]:
    """One trial as table cells, in ``TRIAL_COLUMNS`` order."""
    trial = result.arms[0].label if result.arms else f"{result.option}={result.value}"
    style = "yellow" if result.error is not None or any(arm.error for arm in result.arms) else ""
    return [Text(str(result.step), justify="right"), Text(trial, style="bold"), Text(str(result.steps), justify="right"),
            Text(trial_verdict(result), style=style)]


class ImpactScreen(ViewScreen):
    """Per segment: median step time with its interval, the verdict against the one before, samples/s,
    memory and loss slope."""

    DEFAULT_CSS = """
    ImpactScreen #trials-title { text-style: bold; padding: 1 0 0 0; }
    ImpactScreen #trials-table { max-height: 40%; }
    """

    BINDINGS = [Binding("i", "close", "Back", show=False)]

    def compose(self) -> ComposeResult:
        with Vertical(id="view"):
            yield Static("", id="impact-latest")
            yield DataTable(id="impact-table", cursor_type="row", zebra_stripes=True)
            yield Static("", id="impact-empty", classes="view-empty")
            yield Label("trials (T): each changed option against as it is, same batches, same state",
                        id="trials-title")
            yield DataTable(id="trials-table", cursor_type="row", zebra_stripes=True)
            yield Static(
                f"Each option change starts a segment. Step time, samples/s and data wait (for batches) are medians, without "
                f"the first {WARMUP_STEPS} steps after a change or steps that compiled; ± is how far the step time's 90 % interval "
                "reaches. The verdict calls a segment faster or slower than the one before only when their intervals do not "
                f"overlap, and needs {MIN_TIMED_STEPS} timed steps on each side. Activations: saved for backward; memory: the CUDA allocator's peak, else the tensors' total (M shows them); "
                "loss slope: per 100 steps, not judged (loss falls faster early in any run).",
                classes="view-status",
            )
            yield Label("esc back · change an option on the main screen (a, c, g, m, l) to start a new segment", classes="view-keys")

    def on_mount(self) -> None:
        self.query_one("#view").border_title = "impact of each option change"
        table = self.query_one("#impact-table", DataTable)
        for key, label in COLUMNS:
            table.add_column(label, key=key)
        trials = self.query_one("#trials-table", DataTable)
        for key, label in TRIAL_COLUMNS:
            trials.add_column(label, key=key)
        self.show_state(self.state)
        table.focus()

    def show_state(self, state: RunState) -> None:
        if state.impact_version == self._seen_version:
            return
        self._seen_version = state.impact_version
        table = self.query_one("#impact-table", DataTable)
        segments = state.impact
        if len(segments) < table.row_count:  # a new trainer (restart) began a new table
            table.clear()
        for index, segment in enumerate(segments):
            cells = segment_cells(segment)
            key = str(index)
            if index < table.row_count:
                for (column, _), cell in zip(COLUMNS, cells):
                    table.update_cell(key, column, cell, update_width=True)
            else:
                table.add_row(*cells, key=key)
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
        trials = self.query_one("#trials-table", DataTable)
        for result in state.trials[trials.row_count:]:
            trials.add_row(*trial_cells(result))
        trials.display = self.query_one("#trials-title").display = bool(state.trials)
