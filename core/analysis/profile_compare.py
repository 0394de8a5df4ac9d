"""Two profiler snapshots side by side, by op (or by op and input shape), with ``after / before`` ratios.

Standard library only: the app, whose process never imports torch, compares the snapshots the
trainer wrote.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def row_key(row: dict[str, Any], by_shape: bool = False) -> tuple[str, str]:
    """What identifies an op across snapshots: its name, and its input shapes when grouped by shape."""
    return (str(row.get("name", "")), str(row.get("input_shapes", "")) if by_shape else "")


def ratio(before: Any, after: Any) -> float | None:
    """``after / before``, or None when either is missing or ``before`` is zero."""
    if not _is_number(before) or not _is_number(after) or before == 0:
        return None
    return after / before


def compare_tables(
    before: Iterable[dict[str, Any]],
    after: Iterable[dict[str, Any]],
    columns: Sequence[str],
    *,
    by_shape: bool = False,
) -> list[dict[str, Any]]:
    """One entry per op found in either snapshot, in first-seen order (``before`` first).

    Each entry: ``name``, ``input_shapes``, ``before`` and ``after`` (the op's row in that snapshot, or
    None where it is absent) and ``ratios`` (column -> ``after / before``, None where undefined).
    """
    first = {row_key(row, by_shape): row for row in before}
    second = {row_key(row, by_shape): row for row in after}
    keys = list(first) + [key for key in second if key not in first]
    compared = []
    for key in keys:
        a, b = first.get(key), second.get(key)
        compared.append({
            "name": key[0],
            "input_shapes": key[1],
            "before": a,
            "after": b,
            "ratios": {column: ratio((a or {}).get(column), (b or {}).get(column)) for column in columns},
        })
    return compared


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
