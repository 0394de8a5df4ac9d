"""Two profiler snapshots side by side, by op (or by op and input shape), with ``after / before`` ratios.

Standard library only: the trainer's profiler uses it, and so does the app, whose process never
imports torch.
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


def compare_profiles(before: list[dict[str, Any]], after: list[dict[str, Any]], column: str) -> list[dict[str, Any]]:
    """Rows of two snapshots side by side by op name, with ``after / before`` of ``column`` (None where missing).

    Largest first, by the larger of the two values.
    """
    compared = []
    for entry in compare_tables(before, after, [column]):
        a = (entry["before"] or {}).get(column)
        b = (entry["after"] or {}).get(column)
        compared.append({"name": entry["name"], "before": a, "after": b, "ratio": (b / a) if a and b is not None else None})
    compared.sort(key=lambda row: -max(row["before"] or 0, row["after"] or 0))
    return compared


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
