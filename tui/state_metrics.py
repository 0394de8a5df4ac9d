"""The run's curves and gradient norms: the metrics columns and gradient norms the trainer reports, folded into
series (``thinning.Series``), the steps before this app connected read from the run's journals, and each module's
gradient flag.

A part of ``RunState`` (state.py), which dispatches each message here; this part declares the fields it folds into
(``_init_metrics``). Split off because the metrics path is the hot one (50k reports a second): its checks run per
column, in C where they can. The rows of a batch are folded as the columns they travel as, never made into
``MetricsRow`` objects one by one: a row read (``MetricsRow.from_json``: each field checked as its annotation says)
costs ~15 us, most of the app's time at 50k rows a second. Only the batch's last row is read so, for what the newest
row says (the stats bar's figures, the run's clock, the options in force).
"""

from __future__ import annotations

import bisect
import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torchlab.core.analysis.bottleneck import BottleneckWatch
from torchlab.core.wire import protocol
from torchlab.core.wire.compile_report import CompileReport
from torchlab.core.wire.events import HELD_BACK, LET_THROUGH, FlopsCounted, SpikeGuarded, describe
from torchlab.core.wire.metric_names import training_key
from torchlab.core.wire.metrics_row import MetricsRow, column
from torchlab.core.options import SPIKE_GUARD
from torchlab.core.wire.typed_json import UnreadableValue
from torchlab.tui.gradient_flags import flag_for
from torchlab.tui.health_history import HealthHistory
from torchlab.tui.log_levels import EntryLevel
from torchlab.tui.thinning import Series
from torchlab.tui.unchecked_numbers import all_finite_numbers, float_or_none, int_or_none, is_finite_number

if TYPE_CHECKING:
    from torchlab.tui.run_history import RunHistory

#: The columns of a metrics batch the app reads, named once (``column`` fails here, as the app loads, for a name that
#: is no column of the rows: a renamed field would otherwise leave a chart empty without a word).
STEP, LOSS, LR, SAMPLES_PER_S, STEP_TIME, VAL_LOSS = map(column, ("step", "loss", "lr", "samples_per_s", "step_time_s",
                                                                 "val_loss"))
SKIPPED, SPIKE, LRS, METRICS, VAL_METRICS = map(column, ("skipped", "spike", "lrs", "metrics", "val_metrics"))
PHASES = column("phases")
#: The rows with phases the time view keeps (one a probe's interval: a few hundred steps' worth and more).
PHASE_ROWS_KEPT = 240

#: The most LR groups and workload metrics kept as series (each is a chart line); names cut to this many characters.
MAX_NAMED_SERIES = 32
MAX_SERIES_NAME_CHARS = 40
#: Gradient-norm trend length kept per module (the sparkline in the table).
TREND_LENGTH = 16
#: How many recent records the ETA averages step time over.
ETA_WINDOW = 20


@dataclass
class ModuleStats:
    """One module's gradient-norm history; ``flag`` is recomputed on every report."""

    name: str
    params: int
    #: the other modules that hold some of its parameters (tied: counted here once)
    tied: tuple[str, ...] = ()
    norm: float | None = None
    trend: deque[float] = field(default_factory=lambda: deque(maxlen=TREND_LENGTH))
    ratio: float | None = None
    #: ‖Δθ‖/‖θ‖ of the last measured step (core/engine/measure/update_probe.py), where it was measured
    update_ratio: float | None = None
    flag: str = ""  # "", "vanishing", "exploding", "non-finite", "frozen", "thrashed"


class MetricsFolding:
    """How ``RunState`` folds metrics reports, gradient norms and a resumed run's history into its series."""

    def _init_metrics(self) -> None:
        """The fields of this part: no curve has a point before the first report, no module a norm."""
        self.loss = Series()
        self.val_loss = Series()
        self.lr = Series()
        self.samples_per_s = Series()
        self.step_time = Series()
        #: the steps whose loss or grad norm spiked (the spike guard's events, the rows' ``spike``), in order: marks
        #: on the loss chart, whose line leaves out the steps the guard held back
        self.spikes: list[int] = []
        #: each parameter group's LR by the group's name, where the workload's optimizer has several
        self.group_lrs: dict[str, Series] = {}
        #: the workload's own metrics (loss_fn's mapping) by name: (training, validation)
        self.workload_metrics: dict[str, tuple[Series, Series]] = {}
        #: moves when a group or a metric appears (the charts then show it)
        self.named_series_version = 0
        self.metrics_version = 0
        #: the newest metrics row (the last of its batch), None before the first
        self.last_row: MetricsRow | None = None
        self.elapsed_s: float | None = None
        #: when ``elapsed_s`` arrived, by ``clock``: the header's clock runs on from it between reports
        self.elapsed_at = 0.0
        #: seconds that only go forward (tests stop or move it)
        self.clock: Callable[[], float] = time.monotonic
        self.recent_step_times: deque[float] = deque(maxlen=ETA_WINDOW)
        #: the run directory, when the run has steps before this app connected that its reports may not bring
        #: (a resumed run's earlier process): the app reads them from its journals (``take_history``)
        self.history_wanted: str | None = None
        #: the step the run stood at when this app connected: the journals' steps after it the trainer reports
        self._history_until = 0
        #: where the time of the last measured steps went, and its verdict (core/analysis/bottleneck.py)
        self.bottleneck = BottleneckWatch()
        #: the rows that carried phases, newest last: the time view's phases over time
        self.phase_rows: deque[MetricsRow] = deque(maxlen=PHASE_ROWS_KEPT)
        #: the newest kind of step whose FLOPs were counted: where they are, by module and by op
        self.flops_counted: FlopsCounted | None = None
        self.time_version = 0  # the phase rows, the verdict or the FLOPs moved
        #: what torch.compile did, newest (core/engine/compile_watch.py): the compile view's
        self.compile_report: CompileReport | None = None
        self.compile_version = 0
        self._init_gradient_norms()

    def _init_gradient_norms(self) -> None:
        """The gradient table's and the heatmap's fields: the modules the trainer's welcome names, their norms."""
        self.modules: list[ModuleStats] = []
        self.modules_version = 0  # the module list itself changed (new Welcome)
        #: the recent measured steps' figures per module, for the heatmap
        self.health = HealthHistory()
        self.grad_step: int | None = None
        self.grad_total: float | None = None
        self.grads_version = 0
        #: gradient norms arrived since the modules were last flagged (``apply_all`` flags them once a poll)
        self._flags_stale = False

    def take_history(self, history: RunHistory) -> None:
        """The run's steps before the first this app was sent, as its journals hold them (``history_wanted``):
        a resumed run's trainer reports only its own steps, so its chart started at the resume step."""
        until = self._history_until
        taken: list[float] = []
        for key, journal in history.by_step.items():
            series = self._journal_series(key)
            if series is None:
                continue
            first_reported = series.xs[0] if len(series) else math.inf
            xs, ys = journal.xs, journal.ys
            keep = [index for index, x in enumerate(xs) if x <= until and x < first_reported]
            if keep:
                _put_before(series, [xs[i] for i in keep], [ys[i] for i in keep])
                taken += (xs[keep[0]], xs[keep[-1]])
        self.mark_spikes([step for step in history.spikes if step <= until])
        self._take_measured([row for row in history.measured if row.step <= until])
        if not taken:
            return
        changes = [change for step, change in zip(history.changed_at, history.changes) if step <= until]
        earlier = f"; option changes then: {', '.join(changes)}" if changes else ""
        self.log(EntryLevel.INFO, f"steps {min(taken):.0f}–{max(taken):.0f} of this run read from its metrics.jsonl{earlier}",
                 int(max(taken)))
        self.metrics_version += 1
        self.named_series_version += 1

    def _take_measured(self, rows: list) -> None:
        """The journal's measured rows before the first sent (names matched to the modules): the heatmap's earlier
        columns, and each module's trend in the gradient table. A trainer sends only its newest gradient norms when
        an app attaches (they travel apart from the rows, latest wins): the trend was one bar per module."""
        names = [module.name for module in self.modules]
        if not (names and rows):
            return
        first_sent = self.health.steps[0] if self.health.steps else math.inf
        self.health.put_before(len(names), [
            (row.step, [row.grad_norms.get(name) for name in names],
             [(row.update_ratios or {}).get(name) for name in names],
             [(row.weight_norms or {}).get(name) for name in names]) for row in rows])
        earlier = [row for row in rows if row.step < first_sent]
        for module in self.modules:
            room = module.trend.maxlen - len(module.trend)
            norms = [float_or_none(row.grad_norms.get(module.name)) for row in earlier]
            kept = [norm for norm in norms if norm is not None][-room:] if room > 0 else []
            module.trend.extendleft(reversed(kept))  # before the norms sent since, oldest first
        self._flags_stale = True
        self.grads_version += 1

    def mark_spikes(self, steps: list[int]) -> None:
        """Steps that spiked, marked on the loss chart (each once)."""
        for step in steps:
            if isinstance(step, int) and not isinstance(step, bool):
                at = bisect.bisect_left(self.spikes, step)
                if at == len(self.spikes) or self.spikes[at] != step:
                    self.spikes.insert(at, step)
                    self.metrics_version += 1

    def _on_spike_guarded(self, event: SpikeGuarded) -> None:
        """The spike guard saw a spike: a mark on the loss chart and a warning, which is a toast only where the guard
        is off (it let the batch through) and names the key that turns it on, where it will be seen."""
        self.mark_spikes([event.step])
        offered = event.action == LET_THROUGH
        self.log(EntryLevel.WARNING, describe(event).text, event.step, notify=offered,
                 toast=f"spike at step {event.step}: {SPIKE_GUARD.key} turns on the spike guard" if offered else None)

    def _forget_steps_after(self, step: int) -> None:
        """A run resumed from a checkpoint re-trains the steps after it: they leave the curves and the spike marks."""
        for series in (self.loss, self.val_loss, self.lr, self.samples_per_s, self.step_time, *self.group_lrs.values(),
                       *(line for pair in self.workload_metrics.values() for line in pair)):
            series.truncate_after(step)
        self.spikes[:] = [spiked for spiked in self.spikes if spiked <= step]  # in place: the loss chart holds it
        self.metrics_version += 1

    def _journal_series(self, key: str) -> Series | None:
        """The series a figure of metrics.jsonl (run_history's key) is drawn from; None past MAX_NAMED_SERIES."""
        common = {LOSS: self.loss, VAL_LOSS: self.val_loss, LR: self.lr, SAMPLES_PER_S: self.samples_per_s}
        if key in common:
            return common[key]
        kind, _, name = key.partition(".")
        name = name[:MAX_SERIES_NAME_CHARS]
        if name not in self.workload_metrics and len(self.workload_metrics) >= MAX_NAMED_SERIES:
            return None
        if kind == "val_metrics":
            return self._metric_pair(training_key(name, self.workload_metrics))[1]
        return self._metric_pair(name)[0]

    def _on_metrics(self, event: protocol.Metrics) -> None:
        """A batch of reports as columns: each series grows by one column a message, no dict per report.

        The checks run per column too, in C where they can: a Python call per record per series cost most of the
        app's time at 50k records/s; a per-value check still cost 2 us a record.
        """
        columns = self._readable_columns(event.columns)
        if columns is None:
            return
        columns, steps = self._rows_with_a_step(columns)
        if not steps:
            return
        self.step = max(self.step, max(steps))
        self.hang_over(self.step)
        columns = self._take_spikes(steps, columns)
        self._extend_series(steps, columns)
        self._take_step_times(columns.get(STEP_TIME))
        self._log_skipped_steps(steps, columns.get(SKIPPED))
        self._take_phases(columns)
        try:
            self._take_last_row(protocol.Metrics(columns=columns).row(-1))
        except UnreadableValue as error:
            self.log(EntryLevel.WARNING, f"ignored the last row of a metrics batch: {error}", self.step)
        self.metrics_version += 1
        self.header_version += 1

    def _readable_columns(self, columns: Any) -> dict[str, list] | None:
        """The batch's columns, or None (and a warning) when the protocol's open field does not hold columns of one
        length with a step column among them: a batch the app cannot line up is dropped whole."""
        if not isinstance(columns, dict) or not all(isinstance(values, list) for values in columns.values()):
            self.log(EntryLevel.WARNING, "ignored a metrics batch that is not columns of values")
            return None
        if STEP not in columns:
            self.log(EntryLevel.WARNING, "ignored a metrics batch without a step column")
            return None
        if len(set(map(len, columns.values()))) > 1:
            self.log(EntryLevel.WARNING, f"ignored a metrics batch whose {len(columns)} columns differ in length")
            return None
        return columns

    def _rows_with_a_step(self, columns: dict[str, list]) -> tuple[dict[str, list], list[int]]:
        """The columns without the rows that have no usable step (null, text, a non-finite number: a point needs its
        step), counted in a warning, and the steps as ints. The usual batch, all ints, passes on one type check."""
        steps = columns[STEP]
        if set(map(type, steps)) == {int}:
            return columns, steps
        checked = [int_or_none(step) for step in steps]
        if None in checked:
            self.log(EntryLevel.WARNING, f"ignored {checked.count(None)} metrics row(s) without a step")
            kept = [index for index, step in enumerate(checked) if step is not None]
            if not kept:
                return columns, []
            columns = {name: [values[index] for index in kept] for name, values in columns.items()}
        return columns, [step for step in checked if step is not None]

    def _take_spikes(self, steps: list[int], columns: dict[str, list]) -> dict[str, list]:
        """Marks the steps the ``spike`` column names on the loss chart; returns the columns with the loss of each
        batch the spike guard held back left out (a bad batch's loss, not the run's: a mark, not a point)."""
        spikes = columns.get(SPIKE)
        if spikes is None or not any(spike is not None for spike in spikes):
            return columns
        self.mark_spikes([step for step, spike in zip(steps, spikes) if spike is not None])
        held_back = [isinstance(spike, str) and spike in HELD_BACK for spike in spikes]
        if True in held_back and LOSS in columns:
            return {**columns, LOSS: [None if held else loss for held, loss in zip(held_back, columns[LOSS])]}
        return columns

    def _extend_series(self, steps: list[int], columns: dict[str, list]) -> None:
        """Each chart's series by the column it is drawn from, then the named ones (LR groups, workload metrics)."""
        for key, series in ((LOSS, self.loss), (LR, self.lr), (SAMPLES_PER_S, self.samples_per_s),
                            (STEP_TIME, self.step_time), (VAL_LOSS, self.val_loss)):
            values = columns.get(key)
            if values is not None:
                _extend_with_finite(series, steps, values)
        self._take_named(steps, columns.get(LRS), self.group_lrs,
                         lambda name: self.group_lrs.setdefault(name, Series()))
        self._take_named(steps, columns.get(METRICS), self.workload_metrics, lambda name: self._metric_pair(name)[0])
        self._take_named(steps, columns.get(VAL_METRICS), self.workload_metrics,
                         lambda name: self._metric_pair(training_key(name, self.workload_metrics))[1])

    def _take_step_times(self, times: list | None) -> None:
        """The newest steps' times, for the ETA: those that are a duration (finite, not negative)."""
        if times is None:
            return
        times = times[-self.recent_step_times.maxlen :]
        if not (all_finite_numbers(times) and min(times) >= 0):
            times = [value for value in times if is_finite_number(value) and value >= 0]
        self.recent_step_times.extend(times)

    def _log_skipped_steps(self, steps: list[int], skipped: list | None) -> None:
        """A warning for each step whose optimizer step fp16's scaler skipped (its gradients overflowed)."""
        if skipped is None or True not in skipped:
            return
        for step, was_skipped in zip(steps, skipped):
            if was_skipped is True:
                self.log(EntryLevel.WARNING, "optimizer step skipped (fp16 overflow: the scaler lowered its scale)", step)

    def _take_phases(self, columns: dict[str, list]) -> None:
        """The rows that carry phases (the probe's: a few in a batch), into the bottleneck's window; its verdict said
        where its kind, or the settings, changed."""
        phases = columns.get(PHASES)
        if phases is None:
            return
        batch = protocol.Metrics(columns=columns)
        for index in [index for index, value in enumerate(phases) if value is not None]:
            try:
                row = batch.row(index)
            except UnreadableValue as error:
                self.log(EntryLevel.WARNING, f"ignored a row's phases: {error}", self.step)
                continue
            self.phase_rows.append(row)
            self.time_version += 1
            if (found := self.bottleneck.add(row)) is not None:
                self.log(EntryLevel.WARNING if found.kind != "compute" else EntryLevel.INFO, found.text, row.step)

    def _on_flops_counted(self, event: FlopsCounted) -> None:
        self.flops_counted = event
        self.time_version += 1

    def _on_compile_report(self, event: CompileReport) -> None:
        """What torch.compile did: the compile view's, and said in the log as it comes."""
        self.compile_report = event
        self.compile_version += 1
        said = describe(event)
        if said is not None:
            self.log(EntryLevel.WARNING if said.warning else EntryLevel.INFO, said.text, event.step)

    def _take_last_row(self, row: MetricsRow) -> None:
        """The newest row: the run's clock, and the options in force, which catch changes no acknowledgement told
        (--at). A batch can arrive after an acknowledgement yet hold earlier steps: those must not undo it."""
        self.last_row = row
        if math.isfinite(row.elapsed_s):
            self.elapsed_s, self.elapsed_at = row.elapsed_s, self.clock()
        changed = {
            name: value
            for name, value in row.options.as_dict().items()
            if self.options.get(name) != value and row.step >= self._applied_at.get(name, 0)
        }
        if changed:
            self.options.update(changed)
            self.options_version += 1
            if isinstance(changed.get("steps"), int):  # the run's total, changed while it trains
                self.total_steps = changed["steps"]

    def _on_grad_norms(self, event: protocol.GradNorms) -> None:
        if len(event.norms) != len(self.modules):
            self.log(EntryLevel.WARNING, f"gradient norms for {len(event.norms)} modules, but the trainer named {len(self.modules)}; ignored")
            return
        ratios = event.ratios if isinstance(event.ratios, list) and len(event.ratios) == len(self.modules) else None
        for index, (module, value) in enumerate(zip(self.modules, event.norms)):
            norm = float_or_none(value)
            module.norm = norm
            if norm is not None:
                module.trend.append(norm)
            module.update_ratio = float_or_none(ratios[index]) if ratios is not None else None
        self.health.add(event.step, len(self.modules), event.norms, event.ratios, event.weights)
        self.grad_step = event.step
        self.grad_total = float_or_none(event.total)
        self._flags_stale = True
        self.grads_version += 1

    def _take_named(self, steps: list[int], rows: list | None, table: dict[str, Any], series_of: Callable[[str], Series]) -> None:
        """A column of {name: value} per row (``lrs``, ``metrics``, ``val_metrics``; null on rows without one)
        into ``table``'s series, one per name (at most ``MAX_NAMED_SERIES``); a new name makes the charts show it."""
        if rows is None:
            return
        known = len(table)
        points: dict[str, tuple[list[int], list[float]]] = {}
        for step, row in zip(steps, rows):
            if not isinstance(row, dict):
                continue
            for name, value in row.items():
                if not isinstance(name, str) or not is_finite_number(value):
                    continue
                name = name[:MAX_SERIES_NAME_CHARS]
                if name not in points and name not in table and len(table) + len(points) >= MAX_NAMED_SERIES:
                    continue
                xs, ys = points.setdefault(name, ([], []))
                xs.append(step)
                ys.append(value)
        for name, (xs, ys) in points.items():
            series_of(name).extend(xs, ys)
        if len(table) != known:
            self.named_series_version += 1

    def _metric_pair(self, name: str) -> tuple[Series, Series]:
        return self.workload_metrics.setdefault(name, (Series(), Series()))

    def _flag_modules(self) -> None:
        median = self.median_norm()
        updates = [module.update_ratio for module in self.modules
                   if module.update_ratio is not None and math.isfinite(module.update_ratio)]
        median_update = statistics.median(updates) if updates else None
        for module in self.modules:
            module.ratio = module.norm / median if module.norm is not None and median else None
            share = module.update_ratio / median_update if module.update_ratio is not None and median_update else None
            module.flag = flag_for(module.norm, module.ratio, list(module.trend), module.update_ratio, share)


def _extend_with_finite(series: Series, steps: list[int], values: list) -> None:
    """``series`` with a column's finite values at their steps: all at once when all are (the usual batch, checked in
    C), else point by point, skipping the gaps (val_loss is there on a few steps only) and what is not a number."""
    if all_finite_numbers(values):
        series.extend(steps, values)
    elif set(map(type, values)) != {type(None)}:
        points = [(step, value) for step, value in zip(steps, values) if is_finite_number(value)]
        if points:
            series.extend([step for step, _ in points], [value for _, value in points])


def _put_before(series: Series, xs: list[float], ys: list[float]) -> None:
    """``series`` with the points ``xs``, ``ys`` (all before its first) in front: built again, as Series grows at its
    end only (a few thousand points a run's journal holds, thinned by it as they go in)."""
    kept_xs, kept_ys = series.xs, series.ys
    series.clear()
    series.extend(xs, ys)
    series.extend(kept_xs, kept_ys)
