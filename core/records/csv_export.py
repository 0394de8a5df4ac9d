"""A run's ``metrics.jsonl`` as one flat CSV, for spreadsheets and pandas (``torchlab-tui export RUN --csv FILE``).

Nested values become dotted columns: ``lrs.head``, ``metrics.accuracy``, ``grad_norms.blocks.0.attn``,
``memory.activations_bytes``, ``memory.by_module.blocks.0.attn`` (the module's activation bytes: the list is
ranked by size, so a column per place in it would name another module from row to row),
``act_stats.<module>.mean``/``.std``/``.max_abs``, ``update_ratios.<module>``, ``weight_norms.<module>``,
``adam.<module>.m``/``.sqrt_v``, ``ranks.1.step_time_s``, ``phases.data_s`` (each phase of a step's time). The
columns are every key any row has, in the order they first appear; a row without one leaves it empty.

A cell a spreadsheet would evaluate is escaped by OWASP's rule ("CSV Injection"): text that begins with
``=``, ``+``, ``-``, ``@``, a tab or a carriage return gets a ``'`` before it, and the csv module quotes what
holds a comma, a quote or a line break. Names of columns are text too: a workload chooses its metrics' and
modules' names, and a run directory may have been prepared by someone else. Numbers are not escaped: a loss
of -0.5 is data, and a ``'`` would make the column text.

The file is written through core/records/export_files.py: created new, or (``replace``) renamed over the old
name; never through a link.

The lines are read as the JSON objects they are (``rows_of``), not as ``MetricsRow`` (core/wire/metrics_row.py) as
the other readers of ``metrics.jsonl`` read them: a CSV is the file's figures flat, every key any line holds, and a
line that is no row of today's shape (a key a later version or someone else added, a figure missing) is still
exported whole, its cells made inert like any other.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from torchlab.core.errors import StorageError
from torchlab.core.records.export_files import output_file
from torchlab.core.records.rundir import SkippedLine, rows_of
from torchlab.core.records.storage import reason

_ACT_STATS = ("mean", "std", "max_abs")
_ADAM = ("m", "sqrt_v")  # an optimizer's moments per module: ‖m‖, ‖√v‖
#: How a cell that a spreadsheet takes for a formula begins (OWASP).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def flat_row(row: dict[str, Any]) -> dict[str, Any]:
    """One metrics row as dotted column -> a number, text or boolean."""
    flat: dict[str, Any] = {}

    def put(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                put(f"{prefix}.{key}", item)
        elif isinstance(value, list) and value and all(isinstance(item, dict) and "module" in item for item in value):
            for item in value:  # per-module figures: a column per module, whatever its place in the list
                figures = {key: figure for key, figure in item.items() if key != "module"}
                put(f"{prefix}.{item['module']}", figures["bytes"] if list(figures) == ["bytes"] else figures)
        elif isinstance(value, list):
            names = (_ACT_STATS if prefix.startswith("act_stats.") and len(value) == len(_ACT_STATS) else
                     _ADAM if prefix.startswith("adam.") and len(value) == len(_ADAM) else range(len(value)))
            for name, item in zip(names, value):
                put(f"{prefix}.{name}", item)
        else:
            flat[prefix] = value

    for key, value in row.items():
        put(key, value)
    return flat


def inert_cell(value: Any) -> Any:
    """``value`` as a cell no spreadsheet evaluates: text that begins like a formula gets a ``'`` before it;
    numbers, booleans and None are as they are."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def csv_columns(rows: Iterable[dict[str, Any]]) -> list[str]:
    """The columns of flat ``rows``: every key any row has, in the order they first appear, less a figure that
    is null wherever it is not nested (``grad_norms`` on the steps the probe skipped, ``grad_norms.<module>``
    on the others): its column would be empty in every row."""
    columns: dict[str, None] = {}
    with_a_value: set[str] = set()
    for row in rows:
        columns.update(dict.fromkeys(row))
        with_a_value.update(column for column, value in row.items() if value is not None)
    parts = [column.split(".") for column in columns]
    nested = {".".join(names[:end]) for names in parts for end in range(1, len(names))}
    return [column for column in columns if column in with_a_value or column not in nested]


def write_csv(metrics: Path, target: Path, *, replace: bool, skipped: list[SkippedLine] | None = None) -> int:
    """``metrics`` (a run's metrics.jsonl) as the CSV ``target``, a new file or (``replace``) one renamed over
    what is there; returns the rows written, and adds to ``skipped`` the lines left out (``rows_of``). Read
    twice: once for the columns, once for the rows, so a long run is never held in memory whole."""
    columns = csv_columns(flat_row(row) for row in rows_of(metrics, skipped))
    count = 0
    try:
        with output_file(target, replace=replace, text=True) as handle:
            writer = csv.writer(handle)
            writer.writerow([inert_cell(column) for column in columns])
            for row in rows_of(metrics):
                flat = flat_row(row)
                writer.writerow([inert_cell(flat.get(column, "")) for column in columns])
                count += 1
    except OSError as error:
        raise StorageError(f"--csv {target}: cannot be written: {reason(error)}.") from None
    return count
