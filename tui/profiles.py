"""Profiler snapshots as the app holds them: the trainer's rows, the full table from ``table.csv``, units.

No Textual and no torch here: the screens draw what these functions return, and the tests check the
rules (what "sorted by self CPU" means when a value is missing, how a ratio reads) without a terminal.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchlab.core.analysis.profile_compare import compare_tables
from torchlab.core.safe_open import UnsafeFileError, open_regular
from torchlab.core.units import format_bytes


@dataclass(frozen=True)
class ProfileColumn:
    """A column of the profiler table: its key in the rows, its header, and how its values read."""

    key: str
    label: str
    kind: str  # "text", "count", "us" (microseconds), "bytes"


NAME = ProfileColumn("name", "name", "text")
SHAPES = ProfileColumn("input_shapes", "input shapes", "text")
#: The figures of a row, in the order the table shows them.
FIGURES = (
    ProfileColumn("calls", "calls", "count"),
    ProfileColumn("self_cpu_us", "self CPU", "us"),
    ProfileColumn("cpu_total_us", "total CPU", "us"),
    ProfileColumn("self_device_us", "self device", "us"),
    ProfileColumn("device_total_us", "total device", "us"),
    ProfileColumn("self_cpu_memory_bytes", "CPU mem", "bytes"),
    ProfileColumn("self_device_memory_bytes", "device mem", "bytes"),
)
FIGURE_KEYS = tuple(column.key for column in FIGURES)
COLUMNS_BY_KEY = {column.key: column for column in (NAME, SHAPES, *FIGURES)}
TEXT_KEYS = frozenset({NAME.key, SHAPES.key})
#: Top-N choices, cycled by +/-; 0 = all rows.
TOP_N_CHOICES = (10, 20, 50, 100, 0)
DEFAULT_TOP_N = 20


@dataclass(frozen=True)
class ProfileSnapshot:
    """One ``ProfileReady``: the steps it covers, where its files are, its top rows, or why it failed."""

    number: int  # 1, 2, ... in order of arrival in this app
    first_step: int
    last_step: int
    dir: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    rows_by_shape: list[dict[str, Any]] = field(default_factory=list)
    sort: str = "self_cpu_us"
    build_s: float = 0.0
    error: str | None = None
    #: with ranks, how much of the steps' time collectives ran, in words (communication.communication_sentence); None without
    communication: str | None = None

    @property
    def steps(self) -> str:
        return f"{self.first_step}–{self.last_step}"

    @property
    def label(self) -> str:
        return f"#{self.number} (steps {self.steps})"

    def top_op(self) -> str:
        """The costliest op by the trainer's sort, passing over the profiler's own step marker."""
        names = [str(row.get("name", "")) for row in self.rows]
        return next((name for name in names if not name.startswith("ProfilerStep")), "")


@dataclass(frozen=True)
class ProfileRows:
    """The rows a screen shows, and a note saying where they came from (all ops, or the trainer's top 50)."""

    rows: list[dict[str, Any]]
    complete: bool
    note: str


def snapshot_rows(snapshot: ProfileSnapshot, by_shape: bool) -> ProfileRows:
    """Every op from ``table.csv`` (or ``table_by_shape.csv``) when the app can read it; else the rows sent.

    The trainer sends the top 50 by its own sort column only, so sorting those by another column
    (memory, calls) could miss the real top: the CSV holds every op.
    """
    sent = snapshot.rows_by_shape if by_shape else snapshot.rows
    sort_label = COLUMNS_BY_KEY.get(snapshot.sort, ProfileColumn(snapshot.sort, snapshot.sort, "")).label
    partial = ProfileRows(list(sent), False, f"the trainer's top {len(sent)} by {sort_label}")
    name = "table_by_shape.csv" if by_shape else "table.csv"
    try:
        rows = read_table_csv(Path(snapshot.dir) / name)
    except FileNotFoundError:
        return partial
    except (OSError, csv.Error, UnicodeDecodeError, UnsafeFileError) as error:
        return ProfileRows(partial.rows, False, f"{partial.note} ({name} unreadable: {error})")
    return ProfileRows(rows, True, f"all {len(rows)} {'op/shape pairs' if by_shape else 'ops'} ({name})")


def read_table_csv(path: Path) -> list[dict[str, Any]]:
    """The rows of a snapshot's ``table.csv``, with its figures as numbers (None where not a number)."""
    with open(path, newline="", encoding="utf-8", opener=open_regular) as handle:  # no link, no FIFO
        rows = []
        for raw in csv.DictReader(handle):
            row: dict[str, Any] = {"name": raw.get("name") or "", "input_shapes": raw.get("input_shapes") or ""}
            for key in FIGURE_KEYS:
                row[key] = _number(raw.get(key))
            rows.append(row)
    return rows


def sort_rows(rows: Sequence[dict[str, Any]], key: str, reverse: bool = False) -> list[dict[str, Any]]:
    """Rows by one column in its natural order (figures largest first, names A to Z), or the other way.

    Rows without a number in ``key`` (an op absent from one snapshot) go last either way.
    """
    if key in TEXT_KEYS:
        return sorted(rows, key=lambda row: str(row.get(key, "")).lower(), reverse=reverse)
    present = [row for row in rows if _is_number(row.get(key))]
    missing = [row for row in rows if not _is_number(row.get(key))]
    return sorted(present, key=lambda row: row[key], reverse=not reverse) + missing


def top(rows: list[dict[str, Any]], top_n: int) -> list[dict[str, Any]]:
    return rows if top_n <= 0 else rows[:top_n]


def next_top_n(current: int, step: int) -> int:
    """The next top-N choice up (``step`` 1) or down (-1), stopping at the ends."""
    index = TOP_N_CHOICES.index(current) if current in TOP_N_CHOICES else TOP_N_CHOICES.index(DEFAULT_TOP_N)
    return TOP_N_CHOICES[max(0, min(len(TOP_N_CHOICES) - 1, index + step))]


def has_device_times(*row_lists: Sequence[dict[str, Any]]) -> bool:
    """Whether any row has device (CUDA) time: on a CPU run those columns are all zero."""
    return any(
        _is_number(row.get(key)) and row.get(key) != 0
        for rows in row_lists for row in rows for key in ("self_device_us", "device_total_us")
    )


# ---------------------------------------------------------------------- comparing two snapshots

def compare_entries(
    before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]], metric: str, *, by_shape: bool
) -> list[dict[str, Any]]:
    """Per op: ``before``/``after`` of ``metric``, their ratio and difference, and the calls of each.

    Flat rows, so that ``sort_rows`` sorts them by any of their keys. ``size`` (the larger of the two
    values) is the default order: the ops that cost most in either snapshot first.
    """
    flat = []
    for entry in compare_tables(before, after, [metric, "calls"], by_shape=by_shape):
        a, b = entry["before"] or {}, entry["after"] or {}
        value_a, value_b = a.get(metric), b.get(metric)
        present = [value for value in (value_a, value_b) if _is_number(value)]
        flat.append({
            "name": entry["name"],
            "input_shapes": entry["input_shapes"],
            "before": value_a,
            "after": value_b,
            "ratio": entry["ratios"][metric],
            "change": value_b - value_a if _is_number(value_a) and _is_number(value_b) else None,
            "calls_before": a.get("calls"),
            "calls_after": b.get("calls"),
            "size": max((abs(value) for value in present), default=None),
            "only_in": "" if entry["before"] and entry["after"] else ("before" if entry["before"] else "after"),
        })
    return flat


def total(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    """The sum of a column over all rows (meaningful for self times, self memory and calls)."""
    values = [row[key] for row in rows if _is_number(row.get(key))]
    return sum(values) if values else None


# ---------------------------------------------------------------------- units

def format_figure(kind: str, value: Any) -> str:
    """A figure in human units for its column kind; "–" when missing."""
    if kind == "us":
        return format_us(value)
    if kind == "bytes":
        return format_bytes(value)
    if kind == "count":
        return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else (f"{value:,.0f}" if _is_number(value) else "–")
    return str(value) if value is not None else "–"


def format_us(microseconds: Any) -> str:
    """``850 µs``, ``12.3 ms``, ``4.56 s``; "–" when missing."""
    if not _is_number(microseconds) or not math.isfinite(microseconds):
        return "–"
    sign = "-" if microseconds < 0 else ""
    value = abs(microseconds)
    if value < 1000:
        return f"{sign}{value:.1f} µs" if value < 10 and value != int(value) else f"{sign}{value:.0f} µs"
    if value < 1_000_000:
        return f"{sign}{value / 1000:.3g} ms"
    return f"{sign}{value / 1_000_000:.3g} s"


def format_times(value: Any) -> str:
    """A ratio as ``0.52x`` / ``1.9x`` / ``12x``; "–" when undefined."""
    if not _is_number(value) or not math.isfinite(value):
        return "–"
    if value >= 100:
        return f"{value:.0f}x"
    return f"{value:.2f}x" if value < 10 else f"{value:.1f}x"


def _number(text: str | None) -> int | float | None:
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
