"""How torchlab writes byte counts: ``512 B``, ``1.5 KiB``, ``-3 MiB``, ``1013 MiB``, ``41.2 GiB``.

One formatter for every panel and table, and for the trainer's own messages (the OOM rescue's last paragraph), so
a figure reads the same wherever it appears. Three
significant digits, and whole numbers from 100 up (``:.3g`` alone would write 1013 MiB as ``1e+03``).
Signed: a profiler's self memory is negative when an op frees more than it allocates.
"""

from __future__ import annotations

import math
from typing import Any

_UNITS = (("TiB", 1024.0**4), ("GiB", 1024.0**3), ("MiB", 1024.0**2), ("KiB", 1024.0))


def byte_unit(count: float | None) -> tuple[str, float]:
    """The unit to write ``count`` bytes in, and its size in bytes."""
    count = abs(count or 0)
    for unit, scale in _UNITS:
        if count >= scale:
            return unit, scale
    return "B", 1.0


def three_digits(value: float) -> str:
    """``1.23``, ``12.3``, ``123``, and ``1000`` to ``1023`` whole."""
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def format_bytes(count: Any, missing: str = "–") -> str:
    """``count`` bytes in its unit; ``missing`` when it is not a finite number."""
    if isinstance(count, bool) or not isinstance(count, (int, float)) or not math.isfinite(count):
        return missing
    unit, scale = byte_unit(count)
    return f"{three_digits(count / scale)} {unit}" if unit != "B" else f"{count:.0f} B"
