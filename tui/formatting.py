"""How the app writes its figures in narrow columns: durations, numbers, ratios, and sparklines.

Byte counts have their own module (core/units.py, which the trainer's messages use too). Each formatter takes None for a figure not known yet
and writes "–" for it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

from rich.text import Text

from torchlab.core.errors import printable

SPARK_CHARS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float] | deque[float], width: int | None = None) -> str:
    """The last ``width`` values (all by default) as ▁..█ bars scaled between their own min and max."""
    recent = list(values) if width is None else list(values)[-width:]
    finite = [value for value in recent if math.isfinite(value)]
    if not finite:
        return ""
    low, high = min(finite), max(finite)
    span = high - low
    if span <= 0:
        return SPARK_CHARS[3] * len(finite)
    top = len(SPARK_CHARS) - 1
    return "".join(SPARK_CHARS[round((value - low) / span * top)] for value in finite)


def format_duration(seconds: float | None) -> str:
    """``1:02:03`` or ``2:03``; "–" when unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "–"
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_number(value: float | None, digits: int = 4) -> str:
    """A figure short enough for a narrow column: 0.0123, 1.23e-05, 12345."""
    if value is None:
        return "–"
    if not math.isfinite(value):
        return str(value)
    magnitude = abs(value)
    if magnitude != 0 and (magnitude < 1e-3 or magnitude >= 1e5):
        return f"{value:.{max(1, digits - 2)}e}"
    return f"{value:.{digits}g}"


def format_ratio(value: float | None) -> str:
    """A ratio to the median in at most 5 characters: 0.42, 17, <.01, >999."""
    if value is None or not math.isfinite(value):
        return "–"
    if value < 0.01:
        return "<.01"
    if value >= 1000:
        return ">999"
    return f"{value:.2g}" if value < 100 else f"{value:.0f}"


def short_workload(workload: str) -> str:
    """A workload as a line has room for it: ``tiny.py:workload`` for ``/work/models/tiny.py:workload`` (the
    run directory and ``trainer.log`` keep the whole path); a sample or a module path as it is. Its control characters
    escaped (core/errors.py ``printable``): a file's name is anyone's choice."""
    file, colon, factory = workload.rpartition(":")
    if colon and "/" in file:
        return printable(f"{file.rsplit('/', 1)[-1]}:{factory}")
    return printable(workload)


def fit_parts(parts: Sequence[Text], width: int, separator: Text | str = "", importance: Sequence[int] | None = None) -> Text:
    """``parts`` joined by ``separator`` in at most ``width`` cells, leaving out whole parts that do not fit.

    A line of figures is never cut in the middle of one (``samples/s 1,2…``): a part that does not fit
    is left out, and a less important one that does may still come. Parts are taken most important first:
    in their order, or that of the indices in ``importance``; the line keeps their order. The first taken
    always stays, cut with "…" only when it alone is wider than the line.
    """
    separator = Text(separator) if isinstance(separator, str) else separator
    taken = parts_that_fit(parts, width, separator.cell_len, importance)
    line = Text()
    for index, part in enumerate(parts):
        if index in taken:
            if line:
                line.append_text(separator)  # appended, not joined: Text.join would dim the parts with its style
            line.append_text(part)
    if line.cell_len > width:
        line.truncate(width, overflow="ellipsis")
    return line


def parts_that_fit(parts: Sequence[Text], width: int, separator_width: int, importance: Sequence[int] | None = None) -> set[int]:
    """The indices of the ``parts`` that ``fit_parts`` keeps (empty parts are never kept)."""
    taken: set[int] = set()
    used = 0
    for index in importance if importance is not None else range(len(parts)):
        part = parts[index]
        if not part:
            continue
        needed = part.cell_len + (separator_width if taken else 0)
        if taken and used + needed > width:
            continue
        taken.add(index)
        used += needed
    return taken
