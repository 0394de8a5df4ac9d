"""Numbers read from the fields the protocol leaves open (the metrics columns, a log line's step, the options):
a value of the wrong type or a non-finite one reads as None or is left out, never as an exception that would take
the app down. Shared by the parts of ``RunState`` (state.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def int_or_none(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    return None


def float_or_none(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    return None


def all_finite_numbers(values: Sequence[Any]) -> bool:
    """True if every value is an int or float (not a bool) and finite; checked in C, not per value.

    A sum is finite only if every term is (a huge finite sum that overflows just takes the slow path).
    """
    return set(map(type, values)) <= {int, float} and math.isfinite(sum(values))


def is_finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
