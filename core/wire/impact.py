"""The impact table: what each option change cost or saved, read off the run instead of guessed.

Every change of a live option starts a new segment. Per segment: median step time and samples/s,
peak allocator memory (CUDA; the trainer resets the peak at each change) and peak trainer RSS, and
the loss slope (least squares, per 100 steps). Each segment is compared with the one before it:
"amp=bf16: 1.72x faster, -38 % memory".

Streaming and standard library only: the trainer's run directory and the app use the same class.
"""

from __future__ import annotations

import json
import statistics
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from torchlab.core.wire.events import ProfileStarted, RunEnded, RunStarted
from torchlab.core.wire.observer import TrainerObserver
from torchlab.core.wire.options import OPTION_NAMES, format_option_value
from torchlab.core.wire.protocol import Message, ProfileReady
from torchlab.core.wire.payloads import ImpactSegment, TelemetrySample
from torchlab.core.wire.storage import write_atomically

WARMUP_STEPS = 2  # the first steps after a change pay one-off costs (allocator, autotuning)
#: A new trainer process (start, resume, a world-size relaunch) warms up for longer: its first steps'
#: times stay out of the medians too, or a segment that begins with a relaunch looks slow.
PROCESS_WARMUP_STEPS = 5
#: Step times a segment keeps for its medians: the most recent ones, so a 100k-step segment costs
#: the same to summarise (about once a second, for the app) as a short one.
MEDIAN_WINDOW = 4096


@dataclass
class Segment:
    options: dict[str, Any]
    change: str
    first_step: int
    last_step: int = 0
    step_times: deque[float] = field(default_factory=lambda: deque(maxlen=MEDIAN_WINDOW))
    throughputs: deque[float] = field(default_factory=lambda: deque(maxlen=MEDIAN_WINDOW))
    peak_allocated_bytes: int | None = None
    peak_rss_bytes: int | None = None
    _n: int = 0
    _sx: float = 0.0
    _sy: float = 0.0
    _sxx: float = 0.0
    _sxy: float = 0.0

    def add(self, record: dict[str, Any], timed: bool = True) -> None:
        """One report; ``timed=False`` keeps its step time out of the medians (a profiled step)."""
        self.last_step = record["step"]
        if timed and (record["step"] - self.first_step >= WARMUP_STEPS or not self.step_times):
            self.step_times.append(record["step_time_s"])
            self.throughputs.append(record["samples_per_s"])
        loss = record.get("loss")
        if loss is not None and loss == loss:  # NaN never enters the slope
            x = float(record["step"])
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

    def summary(self, previous: ImpactSegment | None) -> ImpactSegment:
        """This segment as a row of the table, compared with the row of the segment before it."""
        step_time = statistics.median(self.step_times) if self.step_times else None
        memory = _memory(self.peak_allocated_bytes, self.peak_rss_bytes)
        speedup = _ratio(previous and previous.median_step_time_s, step_time)
        memory_change = _change(previous and _memory(previous.peak_allocated_bytes, previous.peak_rss_bytes), memory)
        return ImpactSegment(
            change=self.change,
            options=self.options,
            first_step=self.first_step,
            last_step=self.last_step,
            median_step_time_s=step_time,
            median_samples_per_s=statistics.median(self.throughputs) if self.throughputs else None,
            peak_allocated_bytes=self.peak_allocated_bytes,
            peak_rss_bytes=self.peak_rss_bytes,
            loss_slope_per_100_steps=self.loss_slope_per_100,
            speedup=speedup,
            memory_change=memory_change,
            verdict=verdict(self.change, speedup, memory_change),
        )


class ImpactTracker(TrainerObserver):
    """Builds the segments from metrics and telemetry; writes ``impact.json`` if given a path."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.segments: list[Segment] = []
        # From a profile's start until its tables are built, steps run under the profiler (and beside
        # the table build): their times say what profiling costs, not what the options do.
        self._profiling = False
        self._warming_up = 0  # steps of a freshly started process still to leave out of the medians

    def on_metrics(self, record: dict[str, Any]) -> None:
        options = {key: record.get(key) for key in OPTION_NAMES}
        current = self.segments[-1] if self.segments else None
        if current is None or current.options != options:
            change = "start" if current is None else _describe_change(current.options, options)
            self.segments.append(Segment(options=options, change=change, first_step=record["step"]))
            if current is not None:
                self.write()
        self.segments[-1].add(record, timed=not self._profiling and self._warming_up <= 0)
        self._warming_up -= 1

    def on_telemetry(self, sample: TelemetrySample) -> None:
        if not self.segments:
            return
        segment = self.segments[-1]
        allocated = sample.torch.peak_allocated_bytes
        if allocated is not None:
            segment.peak_allocated_bytes = max(segment.peak_allocated_bytes or 0, allocated)
        segment.peak_rss_bytes = max(segment.peak_rss_bytes or 0, sample.host.trainer_rss_bytes)

    def on_event(self, event: Message) -> None:
        if isinstance(event, RunStarted):
            self._warming_up = PROCESS_WARMUP_STEPS
        elif isinstance(event, ProfileStarted):
            self._profiling = True
        elif isinstance(event, ProfileReady):
            self._profiling = False
        elif isinstance(event, RunEnded):
            self.write()

    def table(self) -> list[ImpactSegment]:
        """Segment summaries, each with ratios to the segment before it."""
        rows: list[ImpactSegment] = []
        for segment in self.segments:
            rows.append(segment.summary(rows[-1] if rows else None))
        return rows

    def write(self) -> None:
        """Replace ``impact.json`` whole (a reader never sees half of it); a full disk is a StorageError."""
        if self.path is not None:
            write_atomically(self.path, json.dumps([asdict(row) for row in self.table()], indent=1), then="resume")


def verdict(change: str, speedup: float | None, memory_change: float | None) -> str:
    """One line a person reads: ``amp=bf16: 1.72x faster, -38 % memory``."""
    parts = []
    if speedup is not None:
        parts.append(f"{speedup:.2f}x faster" if speedup >= 1 else f"{1 / speedup:.2f}x slower")
    if memory_change is not None:
        parts.append(f"{100 * memory_change:+.0f} % memory")
    return f"{change}: {', '.join(parts)}" if parts else change


def _memory(peak_allocated_bytes: int | None, peak_rss_bytes: int | None) -> int | None:
    """The memory a segment is judged by: the allocator's peak where there is one (CUDA), else the RSS."""
    return peak_allocated_bytes if peak_allocated_bytes is not None else peak_rss_bytes


def _ratio(before: float | None, after: float | None) -> float | None:
    return before / after if before and after else None


def _change(before: float | None, after: float | None) -> float | None:
    return (after - before) / before if before and after is not None else None


def _describe_change(before: dict[str, Any], after: dict[str, Any]) -> str:
    changed = [f"{key}={format_option_value(key, after[key])}" for key in OPTION_NAMES if before.get(key) != after.get(key)]
    return ", ".join(changed)
