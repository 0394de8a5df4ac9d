"""Min/max thinning: fewer points for a chart, without losing the spikes a mean or a stride would hide.

A loss curve of 100k steps drawn into 80 columns shows at most a few hundred distinct x positions, so
the chart only needs that many points. Averaging or taking every n-th point would smooth away the one
step where the loss jumped, which is exactly the step a person is looking for; keeping the minimum and
the maximum of each bucket keeps it. Buckets are equal runs of consecutive points (steps arrive evenly
spaced), and each bucket's min and max keep their original order so the line still goes left to right.

The per-bucket work is done by the built-in ``min``/``max``/``index`` over slices, which run in C:
thinning 100k points to a few hundred takes about a millisecond.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence


def thin_minmax(xs: Sequence[float], ys: Sequence[float], max_points: int) -> tuple[list[float], list[float]]:
    """At most ``max_points`` points of (xs, ys): the first, the last, and each bucket's min and max.

    ``xs`` and ``ys`` are parallel sequences (lists or ``array('d')``) in x order, with finite values.
    When there are already few enough points they are returned unchanged (as lists).
    """
    count = min(len(xs), len(ys))
    if max_points < 2:
        raise ValueError(f"max_points must be at least 2, got {max_points}")
    if count <= max_points:
        return list(xs[:count]), list(ys[:count])
    # Two points are kept for the ends: a chart's x range must run from the first step to the latest.
    buckets = max(1, (max_points - 2) // 2)
    thinned_xs: list[float] = []
    thinned_ys: list[float] = []
    start = 0
    for bucket in range(1, buckets + 1):
        end = bucket * count // buckets
        if end <= start:
            continue
        segment = ys[start:end]
        low, high = min(segment), max(segment)
        low_at, high_at = segment.index(low), segment.index(high)
        first, second = (low_at, high_at) if low_at <= high_at else (high_at, low_at)
        thinned_xs.append(xs[start + first])
        thinned_ys.append(segment[first])
        if second != first:
            thinned_xs.append(xs[start + second])
            thinned_ys.append(segment[second])
        start = end
    return _with_ends(xs, ys, count, thinned_xs, thinned_ys)


def _with_ends(
    xs: Sequence[float], ys: Sequence[float], count: int, thinned_xs: list[float], thinned_ys: list[float]
) -> tuple[list[float], list[float]]:
    """Make sure the first and the last point are in (a bucket's extremes need not be at its ends)."""
    if thinned_xs[0] != xs[0]:
        thinned_xs.insert(0, xs[0])
        thinned_ys.insert(0, ys[0])
    if thinned_xs[-1] != xs[count - 1]:
        thinned_xs.append(xs[count - 1])
        thinned_ys.append(ys[count - 1])
    return thinned_xs, thinned_ys


class Series:
    """A growing (x, y) history that a chart can ask for, thinned, many times a second.

    Storage is two ``array('d')`` (16 bytes a point). Past ``capacity`` points the history is
    compacted to half by ``thin_minmax`` so memory stays bounded on very long runs while spikes stay.

    ``thinned`` caches min/max per block of ``2**k`` points: finished blocks never change, so a redraw
    after a new step costs the new points plus one pass over the blocks, not a pass over the history.
    When the history outgrows the block count, pairs of blocks merge into blocks twice as long.
    """

    def __init__(self, capacity: int = 200_000) -> None:
        if capacity < 4:
            raise ValueError(f"capacity must be at least 4, got {capacity}")
        self.capacity = capacity
        self.xs = array("d")
        self.ys = array("d")
        self._cache_buckets = 0
        self._block = 1
        self._blocks: list[tuple[int, int]] = []  # per finished block: (earlier, later) index of its min/max

    def __len__(self) -> int:
        return len(self.xs)

    @property
    def last(self) -> float | None:
        return self.ys[-1] if self.ys else None

    def append(self, x: float, y: float) -> None:
        self.xs.append(x)
        self.ys.append(y)
        if len(self.xs) > self.capacity:
            xs, ys = thin_minmax(self.xs, self.ys, self.capacity // 2)
            self.xs, self.ys = array("d", xs), array("d", ys)
            self._reset_cache()

    def extend(self, xs: list[float], ys: list[float]) -> None:
        """Append many points at once: one array extension per message instead of a call per point."""
        self.xs.extend(xs)
        self.ys.extend(ys)
        if len(self.xs) > self.capacity:
            thinned_xs, thinned_ys = thin_minmax(self.xs, self.ys, self.capacity // 2)
            self.xs, self.ys = array("d", thinned_xs), array("d", thinned_ys)
            self._reset_cache()

    def truncate_after(self, x: float) -> None:
        """Drop points beyond ``x`` (a run resumed from an earlier checkpoint re-trains those steps)."""
        keep = len(self.xs)
        while keep and self.xs[keep - 1] > x:
            keep -= 1
        if keep < len(self.xs):
            del self.xs[keep:]
            del self.ys[keep:]
            self._reset_cache()

    def clear(self) -> None:
        del self.xs[:]
        del self.ys[:]
        self._reset_cache()

    def thinned(self, max_points: int) -> tuple[list[float], list[float]]:
        """At most ``max_points`` points with every bucket's min and max, like ``thin_minmax``."""
        count = len(self.xs)
        if count <= max_points:
            return list(self.xs), list(self.ys)
        buckets = max(1, (max_points - 2) // 2)
        if buckets != self._cache_buckets:
            self._reset_cache()
            self._cache_buckets = buckets
        block = self._block
        while -(-count // block) > buckets:
            block *= 2
        while self._block < block:
            self._merge_blocks()
        ys = self.ys
        finished = count // block
        for index in range(len(self._blocks), finished):
            self._blocks.append(_minmax_indices(ys, index * block, (index + 1) * block))
        pairs = list(self._blocks)
        if finished * block < count:
            pairs.append(_minmax_indices(ys, finished * block, count))
        xs = self.xs
        out_x: list[float] = []
        out_y: list[float] = []
        for first, second in pairs:
            out_x.append(xs[first])
            out_y.append(ys[first])
            if second != first:
                out_x.append(xs[second])
                out_y.append(ys[second])
        return _with_ends(xs, ys, count, out_x, out_y)

    def _merge_blocks(self) -> None:
        ys = self.ys
        merged: list[tuple[int, int]] = []
        blocks = self._blocks
        for index in range(0, len(blocks) - 1, 2):
            candidates = (*blocks[index], *blocks[index + 1])
            low = min(candidates, key=ys.__getitem__)
            high = max(candidates, key=ys.__getitem__)
            merged.append((low, high) if low <= high else (high, low))
        # An odd last block is only half of a bigger block: drop it and let it be recomputed.
        self._blocks = merged
        self._block *= 2

    def _reset_cache(self) -> None:
        self._block = 1
        self._blocks = []


def _minmax_indices(ys: array, start: int, end: int) -> tuple[int, int]:
    segment = ys[start:end]
    low_at = segment.index(min(segment))
    high_at = segment.index(max(segment))
    return (start + low_at, start + high_at) if low_at <= high_at else (start + high_at, start + low_at)
