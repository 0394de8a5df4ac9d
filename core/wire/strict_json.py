"""JSON that other tools can read: NaN and Infinity become null (the bare tokens are not JSON).

Standard library only; the protocol, the run directory's .jsonl files and the app share it.
"""

from __future__ import annotations

import json
import math
from typing import Any


def dumps(value: Any) -> str:
    """Compact strict JSON. The common case (no NaN/Inf anywhere) costs one ``json.dumps``."""
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except ValueError:  # a NaN or Inf somewhere: rare, so only then walk every value
        return json.dumps(_finite(value), separators=(",", ":"), allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value
