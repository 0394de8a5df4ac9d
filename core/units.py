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


_DECIMAL_PREFIXES = (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3))


def format_count(count: float) -> str:
    """A count in decimal prefixes, as FLOPs are written: ``83.5 k``, ``1.23 G``, ``989 T``, ``512``."""
    for prefix, scale in _DECIMAL_PREFIXES:
        if abs(count) >= scale:
            return f"{three_digits(count / scale)} {prefix}"
    return f"{count:.0f}" if abs(count) >= 1 or count == 0 else f"{count:.3g}"


_READ_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1000, "kib": 1024, "m": 1024**2, "mb": 1000**2, "mib": 1024**2,
               "g": 1024**3, "gb": 1000**3, "gib": 1024**3, "t": 1024**4, "tb": 1000**4, "tib": 1024**4}


def parse_bytes(text: str) -> int:
    """``80GiB``, ``80 GB``, ``81920M``, ``1.5T``, ``4096``: a size as a user types it, in bytes (a bare ``G`` is a GiB,
    as ``nvidia-smi`` and ``free -h`` mean it). ValueError where it is not one."""
    stripped = text.strip().lower()
    number = stripped.rstrip("abcdefghijklmnopqrstuvwxyz").strip()
    unit = stripped[len(number):].strip() if number else ""
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"{text!r} is not a size; write it as 80GiB, 80GB or 81920MiB") from None
    if unit not in _READ_UNITS or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{text!r} is not a size; write it as 80GiB, 80GB or 81920MiB")
    return int(value * _READ_UNITS[unit])


def format_seconds(seconds: float | None, missing: str = "n/a") -> str:
    """At most 7 characters: ``0.46 ms``, ``29.1 ms``, ``291 ms``, ``1.23 s``, ``12.3 s``; ``missing`` when unknown."""
    if seconds is None:
        return missing
    milliseconds = seconds * 1000
    if seconds >= 10:
        return f"{seconds:.1f} s"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if milliseconds >= 100:
        return f"{milliseconds:.0f} ms"
    if milliseconds >= 10:
        return f"{milliseconds:.1f} ms"
    return f"{milliseconds:.2f} ms"
