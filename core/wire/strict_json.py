"""JSON that other tools can read: NaN and Infinity become null (the bare tokens are not JSON).

A dataclass (a payload of ``core/wire/payloads.py``, wherever it is nested) is written as the object of its
fields. Standard library only; the protocol, the run directory's .jsonl files and the app share it.
"""

from __future__ import annotations

import json
import math
from dataclasses import fields, is_dataclass
from typing import Any


def _fields(value: Any) -> dict[str, Any]:
    """A dataclass instance as the object of its fields (json calls this for what it cannot write itself)."""
    if is_dataclass(value) and not isinstance(value, type):
        return {spec.name: getattr(value, spec.name) for spec in fields(value)}
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


#: One encoder for every call: ``json.dumps`` with arguments builds a new one each time (a few
#: microseconds of a metrics row's ~15, on the training thread).
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False, default=_fields)


def dumps(value: Any) -> str:
    """Compact strict JSON. The common case (no NaN/Inf anywhere) costs one encoding."""
    try:
        return _ENCODER.encode(value)
    except ValueError:  # a NaN or Inf somewhere: rare, so only then walk every value
        return _ENCODER.encode(_finite(value))


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if is_dataclass(value) and not isinstance(value, type):
        value = _fields(value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value
