"""Min/max thinning: fewer points for a chart, without losing the spikes a mean or a stride would hide.

A loss curve of 100k steps drawn into 80 columns shows at most a few hundred distinct x positions, so
the chart only needs that many points. Averaging or taking every n-th point would smooth away the one
step where the loss jumped, which is exactly the step a person is looking for; keeping the minimum and
the maximum of each bucket keeps it.

Two places thin:

- ``Series`` keeps a bounded history as levels of decreasing resolution: the newest points raw, older
  ones reduced 4:1 (each group of 8 points to its minimum and maximum), older still reduced again. A
  level that outgrows its capacity hands its oldest half down, so the work per new point is constant
  (about a tenth of a microsecond) and no single message pays for compacting the whole history; the
  first design thinned all 200k points at once and stalled the app for half a second every few seconds.
- ``Series.thinned`` picks what a chart draws: each block of x (a power of two wide, so a history of
  any length has at most the chart's point budget of them) keeps its minimum and maximum, in order.
  Blocks go by x, not by point count, because a history's older levels are sparser than its newest.
  A block whose points have not changed keeps its answer, so a redraw after a new step looks at the
  new points only, not at the whole history.

The per-bucket and per-group work runs in C (slices of ``array('d')``, ``min``/``max``/``index``,
``map``), not in a Python loop per point.
"""

from __future__ import annotations

import math
import operator
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence

#: Points per group when a level hands points down; each group becomes its minimum and maximum.
GROUP = 8


def reduce_groups(xs: array, ys: array) -> tuple[array, array]:
    """Each group of ``GROUP`` points (a length that is a multiple of it) as its minimum and maximum.

    The two go in the group's rising or falling order (its first against its last value), at its first
    and last x. A spike inside a group moves by at most ``GROUP - 1`` points of that level, which
    ``Series`` keeps below one pixel of any chart (see there).
    """
    count = len(ys) - len(ys) % GROUP
    columns = [ys[offset:count:GROUP] for offset in range(GROUP)]
    lows = list(map(min, *columns))
    highs = list(map(max, *columns))
    rising = list(map(operator.le, columns[0], columns[-1]))
    out_ys = array("d", bytes(8 * 2 * len(lows)))
    out_ys[0::2] = array("d", [low if up else high for up, low, high in zip(rising, lows, highs)])
    out_ys[1::2] = array("d", [high if up else low for up, low, high in zip(rising, lows, highs)])
    out_xs = array("d", out_ys)
    out_xs[0::2] = xs[0:count:GROUP]
    out_xs[1::2] = xs[GROUP - 1 : count : GROUP]
    return out_xs, out_ys


class Series:
    """A growing (x, y) history that a chart asks for, thinned, many times a second; bounded memory.

    ``levels[0]`` holds the newest points as they came; every point of ``levels[k + 1]`` is older than
    every point of ``levels[k]``, at a quarter of its density. When a level passes ``level_capacity``
    points its oldest half goes, reduced, to the next level. A level ``k`` exists only once the history
    spans about ``level_capacity / 2 * 4**k`` steps, so a group there covers less than 1/256 of the
    history: less than a pixel of a chart up to 256 cells wide. Memory: ``level_capacity`` points per
    level, one level per factor of 4 in run length (about 5 levels for a million steps).

    Points are appended in increasing x; ``truncate_after`` goes back.
    """

    def __init__(self, level_capacity: int = 8192) -> None:
        if level_capacity < 4 * GROUP:
            raise ValueError(f"level_capacity must be at least {4 * GROUP}, got {level_capacity}")
        self.level_capacity = level_capacity
        self.levels: list[tuple[array, array]] = [(array("d"), array("d"))]
        self._reset_blocks()

    def __len__(self) -> int:
        return sum(len(xs) for xs, _ in self.levels)

    @property
    def last(self) -> float | None:
        for _, ys in self.levels:
            if ys:
                return ys[-1]
        return None

    @property
    def xs(self) -> array:
        """Every kept x, oldest first (a copy)."""
        return self._joined(0)

    @property
    def ys(self) -> array:
        """Every kept y, oldest first (a copy)."""
        return self._joined(1)

    def append(self, x: float, y: float) -> None:
        self.extend([x], [y])

    def extend(self, xs: Sequence[float], ys: Sequence[float]) -> None:
        """Append many points at once: one array extension per message, not a call per point."""
        if not xs:
            return
        if xs[0] < self._scan_from:  # out of order: whatever was summarised from there on is stale
            self._changed(xs[0])
        newest_xs, newest_ys = self.levels[0]
        newest_xs.extend(xs)
        newest_ys.extend(ys)
        level = 0
        while level < len(self.levels) and len(self.levels[level][0]) > self.level_capacity:
            self._hand_down(level)
            level += 1

    def truncate_after(self, x: float) -> None:
        """Drop points beyond ``x`` (a run resumed from an earlier checkpoint re-trains those steps)."""
        self._changed(x)
        for xs, ys in self.levels:
            keep = bisect_right(xs, x)
            del xs[keep:]
            del ys[keep:]

    def clear(self) -> None:
        self.levels = [(array("d"), array("d"))]
        self._reset_blocks()

    def thinned(self, max_points: int) -> tuple[list[float], list[float]]:
        """At most ``max_points`` points: the first, the latest, and every x block's min and max, in x order.

        Blocks are a power of two wide, the narrowest that fit ``max_points``. Each block's answer is
        kept until one of its points changes, so a call looks at the points added since the last one,
        not at the whole history.
        """
        if max_points < 2:
            raise ValueError(f"max_points must be at least 2, got {max_points}")
        if len(self) <= max_points:
            return self.xs.tolist(), self.ys.tolist()
        levels = [level for level in reversed(self.levels) if level[0]]  # oldest first
        first_x, first_y = levels[0][0][0], levels[0][1][0]
        last_x, last_y = levels[-1][0][-1], levels[-1][1][-1]
        buckets = max(1, (max_points - 2) // 2)
        width = 1.0
        while (last_x - first_x) / width + 1 > buckets:
            width *= 2
        if width < self._block_width:
            self._reset_blocks()
        while self._block_width < width:
            self._merge_blocks()
        self._summarise(levels, width)
        out_x: list[float] = [first_x]
        out_y: list[float] = [first_y]
        for _, points in self._blocks:
            for x, y in points:
                if x > out_x[-1]:
                    out_x.append(x)
                    out_y.append(y)
        if out_x[-1] != last_x:
            out_x.append(last_x)
            out_y.append(last_y)
        return out_x, out_y

    def _summarise(self, levels: list[tuple[array, array]], width: float) -> None:
        """Bring the blocks up to date: drop those with a changed point, add the points not yet seen."""
        blocks = self._blocks
        if self._changed_from is not None:
            first_changed = int(self._changed_from // width)
            while blocks and blocks[-1][0] >= first_changed:
                blocks.pop()
            self._scan_from = min(self._scan_from, first_changed * width)
            self._changed_from = None
        for xs, ys in levels:
            count = len(xs)
            start = bisect_left(xs, self._scan_from)
            while start < count:
                index = int(xs[start] // width)
                end = bisect_left(xs, (index + 1) * width, start, count)
                segment = ys[start:end]
                low_at, high_at = segment.index(min(segment)), segment.index(max(segment))
                points = tuple((xs[start + at], segment[at]) for at in sorted({low_at, high_at}))
                if blocks and blocks[-1][0] == index:  # a block that straddles two levels, or grew
                    points = _extremes((*blocks[-1][1], *points))
                    blocks[-1] = (index, points)
                else:
                    blocks.append((index, points))
                start = end
        self._scan_from = math.nextafter(levels[-1][0][-1], math.inf)

    def _merge_blocks(self) -> None:
        """Blocks twice as wide: each new block keeps the lowest and highest of the two it covers."""
        merged: list[tuple[int, tuple[tuple[float, float], ...]]] = []
        for index, points in self._blocks:
            if merged and merged[-1][0] == index // 2:
                merged[-1] = (index // 2, _extremes((*merged[-1][1], *points)))
            else:
                merged.append((index // 2, points))
        self._blocks = merged
        self._block_width *= 2

    def _hand_down(self, level: int) -> None:
        xs, ys = self.levels[level]
        count = (len(xs) // 2) // GROUP * GROUP
        # The blocks thinned() summarised stay valid: a group keeps its minimum and maximum, and moves
        # them by less than a pixel (see the class docstring), so handing down never forces a rescan.
        reduced_xs, reduced_ys = reduce_groups(xs[:count], ys[:count])
        del xs[:count]
        del ys[:count]
        if level + 1 == len(self.levels):
            self.levels.append((array("d"), array("d")))
        older_xs, older_ys = self.levels[level + 1]
        older_xs.extend(reduced_xs)
        older_ys.extend(reduced_ys)

    def _changed(self, x: float) -> None:
        if self._changed_from is None or x < self._changed_from:
            self._changed_from = x

    def _reset_blocks(self) -> None:
        # thinned()'s summary: per x block (index, its min and max points in x order), oldest first;
        # points with x from ``_scan_from`` on are not in it yet.
        self._blocks: list[tuple[int, tuple[tuple[float, float], ...]]] = []
        self._block_width = 1.0
        self._scan_from = -math.inf
        self._changed_from: float | None = None

    def _joined(self, column: int) -> array:
        joined = array("d")
        for level in reversed(self.levels):
            joined.extend(level[column])
        return joined


def _extremes(points: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
    """The lowest and the highest of some (x, y) points, in x order (one point if they are the same)."""
    low = min(points, key=_y)
    high = max(points, key=_y)
    return (low,) if low == high else tuple(sorted((low, high)))


def _y(point: tuple[float, float]) -> float:
    return point[1]
