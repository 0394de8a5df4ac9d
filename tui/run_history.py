"""A finished or running run as its files tell it, for comparing runs: its curves (against step and against
training time), its settings (``config.toml``) and the option changes it went through (``events.jsonl``).

Standard library and the torch-free packages only: ``torchlab-tui compare`` and the app read runs the same way. A
run's files are read only when regular and not through a link (core/safe_open.py): a FIFO would hang
the reader, a link could show a file that is not the run's.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchlab.core.analysis.bottleneck import BottleneckWatch, Verdict
from torchlab.core.errors import ConfigError, printable
from torchlab.core.records.config import settings_as_used, settings_from_toml
from torchlab.core.records.option_history import option_history
from torchlab.core.records.rundir import metrics_rows, rows_of
from torchlab.core.records.storage import unreadable_run
from torchlab.core.safe_open import read_regular_text
from torchlab.core.records.compile_history import RunCompileTime
from torchlab.core.records.rank_history import RankHistory
from torchlab.core.wire.events import HELD_BACK
from torchlab.core.wire.metric_names import validation_label
from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.options import format_option_value
from torchlab.tui.health_history import HISTORY_STEPS
from torchlab.tui.thinning import Series

#: The figures every run has, by their key in metrics.jsonl, and how a chart names them.
FIGURES = {"loss": "loss", "val_loss": "val loss", "lr": "learning rate", "samples_per_s": "samples/s",
           "mfu": "MFU %"}


@dataclass
class RunHistory:
    """One run's curves, settings and option changes."""

    path: Path
    #: setting -> value as config.toml holds it; live options as ``options.<name>``
    settings: dict[str, Any] = field(default_factory=dict)
    #: "step 40: amp = bf16", in order
    changes: list[str] = field(default_factory=list)
    #: the step of each of ``changes``
    changed_at: list[int] = field(default_factory=list)
    #: figure key (``loss``, ``metrics.accuracy``, ``val_metrics.accuracy``...) -> its series against step
    by_step: dict[str, Series] = field(default_factory=dict)
    #: the same against the run's training time in seconds (``elapsed_s``)
    by_time: dict[str, Series] = field(default_factory=dict)
    #: the report steps whose loss or grad norm spiked (``spike`` in their row), in order
    spikes: list[int] = field(default_factory=list)
    #: the newest rows that measured per-module figures (``grad_norms``), oldest first, as many as ``load`` was asked
    #: to keep: the heatmap's earlier columns, for the app (``journal_history``)
    measured: list[MetricsRow] = field(default_factory=list)
    #: where the time of its last steps went, under the settings it ended with (core/analysis/bottleneck.py)
    bottleneck: Verdict | None = None
    #: what torch.compile did, in a few words, from its last ``compile_report`` (None: never compiled)
    compiled: str | None = None
    #: what held its ranks back, in a few words, from its ``straggler`` and ``hang`` events (None: nothing did)
    ranks: str | None = None

    @property
    def name(self) -> str:
        """The run's folder's name, as the compare screen's title and legend show it (control characters escaped)."""
        return printable(self.path.name)

    @classmethod
    def load(cls, path: Path, measured: int = 0) -> RunHistory:
        """Read ``path`` (a run directory), keeping its newest ``measured`` rows of per-module figures; ConfigError
        says why it cannot be compared."""
        try:
            return cls._read(path, measured)
        except OSError as error:  # another user's private run (0700), say: a paragraph, not a traceback
            raise unreadable_run(path, error) from None

    @classmethod
    def _read(cls, path: Path, measured: int) -> RunHistory:
        metrics = path / "metrics.jsonl"
        history = cls(path)
        points: dict[str, tuple[list[float], list[float], list[float]]] = {}
        kept: deque[MetricsRow] = deque(maxlen=measured)
        watch = BottleneckWatch()
        try:
            for row in metrics_rows(metrics):
                watch.add(row)
                if row.spike is not None:
                    history.spikes.append(row.step)
                if measured and row.grad_norms:
                    kept.append(row)
                elapsed = row.elapsed_s if _number(row.elapsed_s) else math.nan
                for key, value in _figures(row):
                    steps, times, values = points.setdefault(key, ([], [], []))
                    steps.append(row.step)
                    times.append(elapsed)
                    values.append(value)
        except FileNotFoundError:
            raise ConfigError(f"{path}: no metrics.jsonl here; give run directories (runs/<time>-<workload>)") from None
        if not points:
            raise ConfigError(f"{path}: metrics.jsonl has no step yet (the run has not reported one, or never started): "
                              "nothing to compare")
        for key, (steps, times, values) in points.items():
            history.by_step[key] = _series(steps, values)
            timed = [(t, v) for t, v in zip(times, values) if not math.isnan(t)]
            history.by_time[key] = _series([t for t, _ in timed], [v for _, v in timed])
        history.measured = list(kept)
        history.bottleneck = watch.current
        history.settings = _settings(path / "config.toml")
        journal = _journal(path / "events.jsonl")  # read once: the option changes, compile and the ranks read it
        history.changed_at, history.changes = _option_changes(journal)
        history.compiled = _compiled(journal)
        history.ranks = RankHistory.of(journal).sentence()
        return history

    def figures(self) -> list[str]:
        """The figures this run has, the common ones first, then the workload's own."""
        return sorted(self.by_step, key=lambda key: (key not in FIGURES, list(FIGURES).index(key) if key in FIGURES else 0, key))


def journal_history(run_dir: Path) -> RunHistory | None:
    """What ``run_dir``'s journals hold, for the app to draw a resumed run's earlier steps (its heatmap's too); None
    when they hold no step yet. ConfigError when they cannot be read (not regular files, another user's)."""
    try:
        return RunHistory.load(run_dir, measured=HISTORY_STEPS)
    except ConfigError:
        if _has_reported(run_dir):
            raise
        return None


def figure_name(key: str) -> str:
    """``loss`` -> "loss", ``metrics.accuracy`` -> "accuracy", ``val_metrics.accuracy`` -> "val accuracy",
    ``val_metrics.val_acc`` -> "val_acc"."""
    if key in FIGURES:
        return FIGURES[key]
    kind, _, name = key.partition(".")
    if kind == "phases":
        return f"{name} ms/step"
    return validation_label(name) if kind == "val_metrics" else name


def differences(runs: list[RunHistory]) -> list[tuple[str, list[str]]]:
    """The settings whose values are not the same in every run: (setting, each run's value), in the order of the
    first run's config.toml. Where the runs came from (``workload``) is a difference like any other."""
    keys: dict[str, None] = {}
    for run in runs:
        keys.update(dict.fromkeys(run.settings))
    rows = []
    for key in keys:
        values = [run.settings.get(key, "—") for run in runs]
        if len(set(values)) > 1:
            rows.append((key, values))
    return rows


def _settings(config: Path) -> dict[str, str]:
    """The run's settings as config.toml holds them, shown; none if it is not there, torn or hand-edited (the
    curves are still worth comparing), or no regular file."""
    try:
        settings = settings_as_used(read_regular_text(config), str(config))
    except (FileNotFoundError, ConfigError):  # ConfigError: not TOML, or not a regular file (UnsafeFileError)
        return {}
    options = settings.pop("options", {})
    if settings.get("schedule_extensions"):
        settings["schedule_extensions"] = _extensions(settings["schedule_extensions"], settings.get("steps"))
    return {**{key: _shown(value) for key, value in settings.items()},
            **{f"options.{name}": format_option_value(name, value) for name, value in options.items()}}


def _journal(events: Path) -> list[dict[str, Any]]:
    """The records of ``events.jsonl``, in order; none where the journal is not there."""
    try:
        return list(rows_of(events))
    except FileNotFoundError:
        return []


def _option_changes(journal: list[dict[str, Any]]) -> tuple[list[int], list[str]]:
    """Each option change in the journal (``option_history``: a resume's changed options too), in order: its step, and
    "step 40: amp = bf16" (none before its first event)."""
    history = option_history(journal)
    return [change.step for change in history], [change.describe() for change in history]


def _compiled(journal: list[dict[str, Any]]) -> str | None:
    """What torch.compile did in the run, from the journal's ``compile_report`` events: "3 graphs, 12.5 s compiling,
    2 graph breaks, 1 recompile, 1 op eager between graphs" (the newest report's counts, the run's compile time over
    its processes: core/records/compile_history.py); None where it never compiled."""
    compiled = RunCompileTime.of(journal)
    last = compiled.newest
    if last is None:
        return None
    counts = [(len(last.breaks), "graph break"), (len(last.recompiles), "recompile")]
    words = [f"{last.graphs} graphs", f"{compiled.seconds:.1f} s compiling"]
    words += [f"{count} {name}{'s' if count != 1 else ''}" for count, name in counts]
    if last.eager_ops is not None:
        words.append(f"{last.eager_ops} op{'s' if last.eager_ops != 1 else ''} eager between graphs")
    return ", ".join(words)


def _figures(row: MetricsRow) -> Iterator[tuple[str, float]]:
    """Each finite figure of ``row`` a chart draws, under its key (``FIGURES``, ``metrics.<name>``, ``val_metrics.<name>``):
    not the loss of a step whose update the spike guard held back (a bad batch's, not the run's)."""
    for key, value in (("loss", row.loss if row.spike not in HELD_BACK else None), ("val_loss", row.val_loss), ("lr", row.lr), ("samples_per_s", row.samples_per_s)):
        if _number(value):
            yield key, float(value)
    if row.phases is not None:  # each phase's mean time a step, in ms (the probes' own left out), and the MFU
        for phase, seconds in row.phases.seconds().items():
            if phase != "probes" and _number(seconds):
                yield f"phases.{phase}", seconds * 1000
        if row.phases.mfu is not None and _number(row.phases.mfu):
            yield "mfu", row.phases.mfu * 100
    for kind, figures in (("metrics", row.metrics), ("val_metrics", row.val_metrics)):
        for name, value in (figures or {}).items():
            if _number(value):
                yield f"{kind}.{name}", float(value)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _series(xs: list[float], ys: list[float]) -> Series:
    series = Series()
    ordered = sorted(zip(xs, ys), key=lambda point: point[0])  # a resumed run's rows may come back in order only once
    series.extend([x for x, _ in ordered], [y for _, y in ordered])
    return series


def _extensions(extensions: Any, steps: Any) -> str:
    """A run's changes of length as a reader takes them, each the step it was at and the totals before and after:
    "at 79: 400 → 5000 steps, at 795: 5000 → 900 steps" (config.toml keeps [step, total before] pairs; the total
    after is the next pair's total before, or the run's ``steps`` for the last)."""
    pairs = [tuple(pair) for pair in extensions]
    afters = [before for _, before in pairs[1:]] + [steps if steps is not None else "?"]
    return ", ".join(f"at {step}: {before} → {after} steps" for (step, before), after in zip(pairs, afters))


def _shown(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_shown(item) for item in value) + "]"
    return str(value)


def earlier_run(run_dir: Path) -> Path | None:
    """The newest run before ``run_dir`` of the same workload in the same runs folder (run directories are named
    by when they started), or None."""
    workload = _workload(run_dir)
    if workload is None or not run_dir.parent.is_dir():
        return None
    earlier = [path for path in run_dir.parent.iterdir()
               if path.name < run_dir.name and _has_reported(path) and _workload(path) == workload]
    return max(earlier, key=lambda path: path.name, default=None)


def _has_reported(run_dir: Path) -> bool:
    """Whether ``run_dir`` is a run of ours with something to compare: a metrics.jsonl with rows. Another user's
    private run in the same runs folder cannot be entered, and is none of ours."""
    try:
        return (run_dir / "metrics.jsonl").stat().st_size > 0
    except OSError:
        return False


def _workload(run_dir: Path) -> str | None:
    try:
        return settings_from_toml(read_regular_text(run_dir / "config.toml"), "config.toml").get("workload", "tiny_gpt")
    except (OSError, ConfigError):  # not there, not ours to read, not TOML, not a regular file
        return None
