"""The impact table: what each option change cost or saved, read off the run instead of guessed.

Every change of a live option starts a new segment. Per segment: median step time with its 90 %
interval, median samples/s, median data wait (the part of a step spent waiting for its batches), memory,
and the loss slope (least squares, per 100 steps). Steps whose time says nothing about the options stay
out of the medians: the first after a change or a (re)start, those under the profiler, those during which
torch.compile compiled (``compiling`` in the row) and those a compiled run ran uncompiled to sample
activation statistics (``eager``). Memory is what
the tensors hold, measured on the trainer's memory steps (core/engine/measure/memory.py): the activations saved
for backward, and the total with parameters, gradients and optimizer state; on CUDA the memory figure
is the allocator's peak (the trainer resets it at each change); beside it, what NVML sees of the run
(shown, not judged: the allocator's cache it counts only grows). Never the process RSS, which only
grows: after a profiler snapshot it would read as the next option's cost. Each segment is compared
with the nearest one before it that has enough timed steps for an interval (``nearest_judged``): "checkpointing=on:
1.33x slower, activations -92 %, memory -60 %" when the two step-time intervals do not overlap,
"lr_scale=0.5: no clear difference (±6 %, segments ran in turn, ...), same memory" when they do; "workers=2: 1.31x
faster, data wait 4.2 → 0.1 ms" where the data wait moved by at least ``DATA_WAIT_SHOWN`` of the earlier step time.
A segment too short to judge (a one-step ``accum=2``) is skipped over: the next one is compared with the one
before it, and its verdict names it and what differs from it: "(vs the start, changed since: clip=1.0,
accum=2)". The app compares every row with a baseline the user chooses through the same ``compare_segments``.
The loss slope is shown, never judged: loss falls faster early in any run, so a later segment's flatter slope
says nothing about its option.

Segments run one after the other and cannot be interleaved as a trial's arms are, so a load that changed
between them can decide their verdict: where it is "no clear difference", its noise says so and suggests a trial.

A resume (``--resume``, the app's restart) continues the run, and its table too: a resumed process's tracker first
reads the run's journals back up to the checkpoint's step (``ImpactTracker._rebuild``), so a changed option starts a
segment after the run's earlier ones instead of a table of one.

Streaming and standard library only: the trainer's run directory and the app use the same class.
"""

from __future__ import annotations

import heapq
import json
import statistics
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from torchlab.core.analysis.step_times import MIN_TIMED_STEPS, compare_step_times, load_shift, median_interval
from torchlab.core.errors import StorageError
from torchlab.core.records.rundir import metrics_rows, rows_of
from torchlab.core.records.storage import write_atomically
from torchlab.core.analysis.compile_payback import payback_words
from torchlab.core.records.compile_history import RunCompileTime
from torchlab.core.wire.compile_report import CompileReport
from torchlab.core.wire.events import (
    OomRescued, PredictionChecked, ProfileStarted, ResumedFromCheckpoint, RunEnded, RunStarted,
)
from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.wire.observer import TrainerObserver
from torchlab.core.options import LIVE_OPTIONS, LiveOptions, format_option_value
from torchlab.core.wire.payloads import ImpactSegment, TelemetrySample
from torchlab.core.wire.protocol import Error, Message, NonFinite, ProfileReady
from torchlab.core.wire.typed_json import UnreadableValue, read_object

WARMUP_STEPS = 2  # the first steps after a change pay one-off costs (allocator, autotuning)
#: A new trainer process (start, resume, a world-size relaunch) warms up for longer: its first steps'
#: times stay out of the medians too, or a segment that begins with a relaunch looks slow.
PROCESS_WARMUP_STEPS = 5
#: Step times a segment keeps for its medians: the most recent ones, so a 100k-step segment costs
#: the same to summarise (about once a second, for the app) as a short one.
MEDIAN_WINDOW = 4096
#: A verdict says how the data wait moved when it moved by this share of the earlier segment's step time.
DATA_WAIT_SHOWN = 0.05
#: The options whose changes begin a segment (``LiveOption.shapes_a_step``), in the registry's order.
SEGMENT_OPTIONS = tuple(option.name for option in LIVE_OPTIONS if option.shapes_a_step)


@dataclass
class Segment:
    options: dict[str, Any]
    change: str
    first_step: int
    last_step: int = 0
    step_times: deque[float] = field(default_factory=lambda: deque(maxlen=MEDIAN_WINDOW))
    throughputs: deque[float] = field(default_factory=lambda: deque(maxlen=MEDIAN_WINDOW))
    data_waits: deque[float] = field(default_factory=lambda: deque(maxlen=MEDIAN_WINDOW))
    peak_allocated_bytes: int | None = None
    nvml_run_bytes: int | None = None  # the most NVML attributed to the run's processes, in the segment's samples
    # HostSample.others_cpu_percent as it stood at each timed step: the load beside the very steps whose times
    # are compared (a median over time instead weighed a paused run's or a trial's seconds, and no step, alike)
    others_cpu: deque[float] = field(default_factory=lambda: deque(maxlen=MEDIAN_WINDOW))
    activations_bytes: int | None = None  # the largest measured in the segment (the same on every step of one shape)
    tensor_bytes: int | None = None  # likewise, parameters + gradients + optimizer state + activations
    predicted_bytes: int | None = None  # the forecast's of its memory, once a memory step checked it (prediction_checked)
    prediction_error: float | None = None
    _n: int = 0
    _sx: float = 0.0
    _sy: float = 0.0
    _sxx: float = 0.0
    _sxy: float = 0.0

    def add(self, row: MetricsRow, timed: bool = True, others_cpu_percent: float | None = None) -> None:
        """One report; ``timed=False`` keeps its step time out of the medians (a profiled step), as do the row
        itself where it says it compiled or ran uncompiled, and the segment's first ``WARMUP_STEPS`` steps. A
        segment of warm-up steps only has no step time: a warm-up step's would read as the option's.
        ``others_cpu_percent``: the newest telemetry's load beside the run, counted with a timed step's time."""
        self.last_step = row.step
        timed = timed and not row.compiling and not row.eager
        if timed and row.step - self.first_step >= WARMUP_STEPS:
            self.step_times.append(row.step_time_s)
            if others_cpu_percent is not None:
                self.others_cpu.append(others_cpu_percent)
            self.throughputs.append(row.samples_per_s)
            if row.data_wait_s is not None:
                self.data_waits.append(row.data_wait_s)
        memory = row.memory
        if memory is not None:  # on the trainer's memory steps
            self.activations_bytes = max(self.activations_bytes or 0, memory.activations_bytes)
            self.tensor_bytes = max(self.tensor_bytes or 0, memory.total_bytes)
            if memory.allocator_peak_bytes is not None:
                self.peak_allocated_bytes = max(self.peak_allocated_bytes or 0, memory.allocator_peak_bytes)
        loss = row.loss
        if loss == loss:  # NaN never enters the slope
            x = float(row.step)
            self._n += 1
            self._sx += x
            self._sy += loss
            self._sxx += x * x
            self._sxy += x * loss

    @property
    def loss_slope_per_100(self) -> float | None:
        denominator = self._n * self._sxx - self._sx * self._sx
        if self._n < 3 or denominator == 0:
            return None
        return 100 * (self._n * self._sxy - self._sx * self._sy) / denominator

    def summary(self, baseline: ImpactSegment | None, *, name_baseline: bool = False) -> ImpactSegment:
        """This segment as a row of the table, compared with ``baseline`` (``compare_segments``)."""
        step_time = statistics.median(self.step_times) if self.step_times else None
        interval = median_interval(self.step_times)
        if step_time is not None and interval is not None:
            # Where steps alternate between two speeds, the median of them all can fall just outside the
            # inner block medians: the interval always holds the figure it is shown beside.
            interval = min(interval[0], step_time), max(interval[1], step_time)
        low, high = interval or (None, None)
        figures = ImpactSegment(
            change=self.change,
            options=self.options,
            first_step=self.first_step,
            last_step=self.last_step,
            median_step_time_s=step_time,
            step_time_low_s=low,
            step_time_high_s=high,
            median_samples_per_s=statistics.median(self.throughputs) if self.throughputs else None,
            median_data_wait_s=statistics.median(self.data_waits) if self.data_waits else None,
            peak_allocated_bytes=self.peak_allocated_bytes,
            nvml_run_bytes=self.nvml_run_bytes,
            others_cpu_percent=statistics.median(self.others_cpu) if self.others_cpu else None,
            activations_bytes=self.activations_bytes,
            tensor_bytes=self.tensor_bytes,
            loss_slope_per_100_steps=self.loss_slope_per_100,
            speedup=None,
            memory_change=None,
            activations_change=None,
            verdict=self.change,
            predicted_bytes=self.predicted_bytes,
            prediction_error=self.prediction_error,
        )
        return compare_segments(figures, baseline, name_baseline=name_baseline)


def samples_per_step_ratio(baseline: ImpactSegment | None, row: ImpactSegment) -> float:
    """How many times the baseline's samples a step of ``row`` takes: its accumulation over the baseline's (the batch
    size does not change within a run, and with ranks it is the global one). A step of ``accum=2`` trains twice the
    samples, so it is judged by its time per sample: 'accum=2: 1.69x slower' was a step twice as big, 1.18x faster
    per sample."""
    if baseline is None:
        return 1.0
    return row.options.get("accum", 1) / baseline.options.get("accum", 1)


def compare_segments(row: ImpactSegment, baseline: ImpactSegment | None, *, name_baseline: bool = False) -> ImpactSegment:
    """``row`` judged against ``baseline`` from the two rows' figures alone: its ``speedup``, ``memory_change``,
    ``activations_change``, ``baseline_step`` and ``verdict`` (the first row, without a baseline: none, and the
    change alone). The one definition of a verdict: the trainer's table (against ``nearest_judged``) and the app's
    (against the row the user marked, or the start) both come from here. ``name_baseline``: the verdict ends
    saying which segment it was compared with and every option that differs from it, "(vs the start, changed since:
    clip=1.0, accum=2)", where no column header says it."""
    interval = (row.step_time_low_s, row.step_time_high_s) if row.step_time_low_s is not None and row.step_time_high_s is not None else None
    per_sample = samples_per_step_ratio(baseline, row)
    median = row.median_step_time_s if row.median_step_time_s is None else row.median_step_time_s / per_sample
    interval = interval and (interval[0] / per_sample, interval[1] / per_sample)
    speedup, speed = compare_step_times(baseline, median, interval, in_turn=True)
    if speedup is not None and per_sample != 1:
        speed += " per sample"  # a step of accum=2 takes twice the samples: its time is not the baseline's unit
    if baseline is not None and interval is not None and baseline.step_time_low_s is None:
        speed = NO_BASELINE  # this row has the steps: what it would be judged by has not (``nearest_judged``)
    if speedup is not None and (shift := load_shift(baseline and baseline.others_cpu_percent, row.others_cpu_percent)) is not None:
        speedup, speed = None, shift
    memory_change = _change(baseline and _memory(baseline.peak_allocated_bytes, baseline.tensor_bytes),
                            _memory(row.peak_allocated_bytes, row.tensor_bytes))
    activations_change = _change(baseline and baseline.activations_bytes, row.activations_bytes)
    ranks = max(row.options.get("world_size", 1), baseline.options.get("world_size", 1) if baseline else 1)
    words = verdict(row.change, speed, activations_change, memory_change, data_wait_moved(baseline, row.median_data_wait_s),
                    per_rank=ranks > 1)
    if name_baseline and baseline is not None:  # what it is compared with differs in more than this row's change
        words += f" (vs {segment_name(baseline)}, changed since: {_describe_change(baseline.options, row.options)})"
    return replace(row, speedup=speedup, memory_change=memory_change, activations_change=activations_change, verdict=words,
                   baseline_step=baseline.first_step if baseline is not None else None)


#: The speed words of a segment long enough to judge that has nothing to be judged by: every segment before it was
#: too short (a 127-step segment read "too few steps to judge" where the one before had 2 steps and the start 4).
NO_BASELINE = f"not judged: no segment before it has {MIN_TIMED_STEPS} timed steps"


def nearest_judged(rows: Sequence[ImpactSegment]) -> ImpactSegment | None:
    """The row the segment after ``rows`` is compared with: the nearest with a step-time interval (enough timed steps
    to judge), so that a segment too short to judge (a one-step ``accum=2``) never blocks the next verdict, which
    names the row it was compared with. Where none has one, the last row (for memory; the speed words are then
    ``NO_BASELINE``, or "too few steps to judge" where the segment is short too); None for the first segment."""
    return next((row for row in reversed(rows) if row.step_time_low_s is not None), rows[-1] if rows else None)


def segment_name(row: ImpactSegment) -> str:
    """A segment as a verdict or a header names it: "the start", "clip=1.0 at step 21"."""
    return "the start" if row.change == "start" else f"{row.change} at step {row.first_step}"


class ImpactTracker(TrainerObserver):
    """Builds the segments from metrics and telemetry; writes ``impact.json`` if given a path."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.segments: list[Segment] = []
        # From a profile's start until its tables are built, steps run under the profiler (and beside
        # the table build): their times say what profiling costs, not what the options do.
        self._profiling = False
        self._warming_up = 0  # steps of a freshly started process still to leave out of the medians
        self._closed_rows: list[ImpactSegment] = []  # the rows of every segment but the newest, which no report changes
        # The last row's options, and the segment options read from them: rows share the options object that
        # was in force (a frozen value) until a command changes it, so it is read once per change, not per row.
        self._options_in_force: LiveOptions | None = None
        self._segment_options: dict[str, Any] = {}
        self._others_cpu_now: float | None = None  # the newest telemetry's HostSample.others_cpu_percent
        # options the OOM rescue set, with the step it set them for: the segment that row begins says so (a measured
        # step's row, held for its update figures, can arrive after the next step's rescue)
        self._rescued: dict[str, int] = {}
        self._compiled = RunCompileTime()  # what torch.compile cost the run and did: a compile row's payback and breaks
        self._total_steps: int | None = None

    def on_metrics(self, row: MetricsRow) -> None:
        if row.options is not self._options_in_force:  # a new value only where a command changed the options
            self._options_in_force = row.options
            self._segment_options = {key: getattr(row.options, key) for key in SEGMENT_OPTIONS}
        options = self._segment_options
        current = self.segments[-1] if self.segments else None
        if current is None or current.options != options:
            change = "start" if current is None else _describe_change(current.options, options)
            if current is not None and any(current.options.get(name) != options.get(name)
                                           for name, step in self._rescued.items() if step <= row.step):
                change += " (OOM rescue)"
            self.segments.append(Segment(options=options, change=change, first_step=row.step))
            if current is not None:
                self.write()
        if self._rescued:
            self._rescued = {name: step for name, step in self._rescued.items() if step > row.step}
        self.segments[-1].add(row, timed=not self._profiling and self._warming_up <= 0, others_cpu_percent=self._others_cpu_now)
        self._warming_up -= 1

    def on_telemetry(self, sample: TelemetrySample) -> None:
        if not self.segments:
            return
        segment = self.segments[-1]
        allocated = sample.torch.peak_allocated_bytes
        if allocated is not None:
            segment.peak_allocated_bytes = max(segment.peak_allocated_bytes or 0, allocated)
        nvml = sample.run_gpu_memory_bytes
        if nvml is not None:
            segment.nvml_run_bytes = max(segment.nvml_run_bytes or 0, nvml)
        self._others_cpu_now = sample.host.others_cpu_percent

    def on_event(self, event: Message) -> None:
        match event:
            case ResumedFromCheckpoint() if not self.segments and self.path is not None:
                # A resume continues the run: its segments so far are in the run directory's journals. (Not on a
                # world-size relaunch, which resumes in a process whose tracker holds them already.)
                self._rebuild(self.path.parent, event.step)
            case RunStarted() | ProfileStarted() | ProfileReady():
                self._total_steps = event.steps if isinstance(event, RunStarted) else self._total_steps
                self._follow(event.journal_event())
            case CompileReport():
                self._compiled.reported(event)
            case OomRescued():
                self._follow(OomRescued.type, event.step, event.option)
            case PredictionChecked():
                self._predicted(event.predicted_bytes, event.error)
            case RunEnded():
                self.write()
            case Error() | NonFinite():  # a failed process's end: its last segment kept where the disk still takes it
                try:
                    self.write()
                except StorageError:
                    pass  # a full disk is what the failure itself says, or soon will: its paragraph must still go out

    def _predicted(self, predicted_bytes: Any, error: Any) -> None:
        """The newest segment's memory as the forecast predicted it: its settings' check (``prediction_checked``), from
        the forecaster or read back from the journal's ``prediction`` record."""
        if self.segments and isinstance(predicted_bytes, int) and isinstance(error, (int, float)):
            self.segments[-1].predicted_bytes, self.segments[-1].prediction_error = predicted_bytes, float(error)

    def _follow(self, event: str, step: int = 0, option: str | None = None) -> None:
        """What an event (by its name in ``events.jsonl``) means for the medians: the trainer's events as they come
        and a resumed run's journal read back (``_rebuild``) alike."""
        if event == RunStarted.journal_event():
            self._warming_up = PROCESS_WARMUP_STEPS
            self._compiled.process_started()
        elif event == OomRescued.journal_event() and option is not None:
            self._rescued[option] = step
        elif event == ProfileStarted.journal_event():
            self._profiling = True
        elif event == ProfileReady.journal_event():
            self._profiling = False

    def _rebuild(self, run_dir: Path, step: int) -> None:
        """The segments of the run's steps up to ``step`` (the checkpoint a resume starts from; the app's restart is
        one) from its journals: each metrics row, and the events and system samples that decide what is timed, in
        the order they were written, as the trainer reported them. A resumed run's impact table so continues the
        run's, and its first verdict compares the resume's changed options with the segment the checkpoint was in.
        Rows after ``step`` were trained over and are left out."""
        journals = [
            ((row.time, row) for row in metrics_rows_if_any(run_dir / "metrics.jsonl") if row.step <= step),
            ((record["time"], record) for record in records_if_any(run_dir / "events.jsonl")
             if record["step"] <= step and record.get("event") in _FOLLOWED and _is_time(record.get("time"))),
            ((sample.time, sample) for sample in samples_if_any(run_dir / "system.jsonl") if sample.step <= step),
        ]
        path, self.path = self.path, None  # impact.json is written once, rebuilt, not at each segment read back
        try:
            for _, item in heapq.merge(*journals, key=lambda timed: timed[0]):
                match item:
                    case MetricsRow():
                        self.on_metrics(item)
                    case TelemetrySample():
                        self.on_telemetry(item)
                    case dict() if item["event"] == _PREDICTION:
                        self._predicted(item.get("predicted_bytes"), item.get("error"))
                    case dict() if item["event"] == _COMPILED:
                        self._compiled.read(item)
                    case _:
                        self._follow(item["event"], item["step"], item.get("option"))
        finally:
            self.path = path
        # This process's own start, profiles and rescues come as its events.
        self._warming_up, self._profiling, self._rescued, self._others_cpu_now = 0, False, {}, None
        self.write()

    def table(self) -> list[ImpactSegment]:
        """Segment summaries, each with ratios to the nearest earlier segment with enough timed steps.

        Only the newest segment still changes (reports and telemetry go to it alone), so the others' rows are
        summarised once, when the next segment begins, and kept: the app asks for the table about once a
        second, on the training thread, and a row costs two sorts of up to ``MEDIAN_WINDOW`` step times."""
        for segment in self.segments[len(self._closed_rows) : -1]:
            self._closed_rows.append(self._summary(segment))
        if not self.segments:
            return []
        return [*self._closed_rows, self._summary(self.segments[-1])]

    def _summary(self, segment: Segment) -> ImpactSegment:
        """``segment``'s row against the nearest earlier row judged (``nearest_judged``), named where it is not the
        row just before."""
        baseline = nearest_judged(self._closed_rows)
        row = segment.summary(baseline, name_baseline=baseline is not None and baseline is not self._closed_rows[-1])
        bought = payback_words(row, baseline, self._compiled, self._total_steps)  # where compile came on: what it bought
        return replace(row, verdict=f"{row.verdict}; {bought}") if bought else row

    def write(self) -> None:
        """Replace ``impact.json`` whole (a reader never sees half of it); a full disk is a StorageError."""
        if self.path is not None:
            write_atomically(self.path, json.dumps([asdict(row) for row in self.table()], indent=1), then="resume")


#: The events ``ImpactTracker._rebuild`` reads back, by their names in ``events.jsonl``: those ``_follow`` takes, and
#: a setting's prediction checked.
_PREDICTION = PredictionChecked.journal_event()
_COMPILED = CompileReport.journal_event()
_FOLLOWED = frozenset([*(event.journal_event() for event in (RunStarted, OomRescued, ProfileStarted, ProfileReady)),
                       _PREDICTION, _COMPILED])


def metrics_rows_if_any(path: Path) -> Iterator[MetricsRow]:
    """``metrics_rows(path)``, or none where the run has no such journal yet (a resume into a new run directory)."""
    if path.exists():
        yield from metrics_rows(path)


def records_if_any(path: Path) -> Iterator[dict[str, Any]]:
    if path.exists():
        yield from rows_of(path)


def samples_if_any(path: Path) -> Iterator[TelemetrySample]:
    """The system samples of ``path`` (``system.jsonl``) that read as today's ``TelemetrySample``; an older line is
    left out (its load figure is then unknown, as on a box that cannot measure it)."""
    for record in records_if_any(path):
        try:
            yield read_object(TelemetrySample, record, "system.jsonl", nested=False)
        except UnreadableValue:
            continue


def _is_time(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def data_wait_moved(previous: ImpactSegment | None, data_wait: float | None) -> str | None:
    """``data wait 4.2 → 0.1 ms`` where the median data wait moved by ``DATA_WAIT_SHOWN`` of the earlier
    segment's step time or more (a wait that small is noise next to the step); else None."""
    if previous is None or data_wait is None or previous.median_data_wait_s is None or not previous.median_step_time_s:
        return None
    before = previous.median_data_wait_s
    if abs(data_wait - before) < DATA_WAIT_SHOWN * previous.median_step_time_s:
        return None
    return f"data wait {_ms(before)} → {_ms(data_wait)} ms"


def _ms(seconds: float) -> str:
    milliseconds = 1000 * seconds
    return f"{milliseconds:.1f}" if milliseconds < 100 else f"{milliseconds:.0f}"


def verdict(change: str, speed: str | None, activations_change: float | None, memory_change: float | None,
            data_wait: str | None = None, *, per_rank: bool = False) -> str:
    """One line a person reads: ``checkpointing=on: 1.33x slower, activations -92 %, memory -60 %``;
    ``speed`` from ``compare_step_times``, ``data_wait`` from ``data_wait_moved``. Memory is measured, not
    sampled noise: a change that rounds to 0 % is none, and where both figures say so, "same memory".
    ``per_rank``: either side trained with ranks, whose memory figures are rank 0's: the words say so
    ("world_size=2: memory per rank -30 %", where the run as a whole holds more)."""
    parts = [speed] if speed is not None else []
    if data_wait is not None:
        parts.append(data_wait)
    of = " per rank" if per_rank else ""
    changes = [(name + of, change) for name, change in (("activations", activations_change), ("memory", memory_change))
               if change is not None]
    shown = [f"{name} {100 * change:+.0f} %" for name, change in changes if round(100 * change) != 0]
    if shown:
        parts.extend(shown)
    elif changes:
        parts.append(f"same memory{of}")
    return f"{change}: {', '.join(parts)}" if parts else change


def _memory(peak_allocated_bytes: int | None, tensor_bytes: int | None) -> int | None:
    """The memory a segment is judged by: the CUDA allocator's peak where there is one (it also holds the
    workspace and what the caching allocator keeps), else the tensors' total."""
    return peak_allocated_bytes if peak_allocated_bytes is not None else tensor_bytes


def _change(before: float | None, after: float | None) -> float | None:
    return (after - before) / before if before and after is not None else None


def _describe_change(before: dict[str, Any], after: dict[str, Any]) -> str:
    changed = [f"{key}={format_option_value(key, after[key])}" for key in SEGMENT_OPTIONS if before.get(key) != after.get(key)]
    return ", ".join(changed)
