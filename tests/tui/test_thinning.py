"""Min/max thinning keeps spikes, bounds the point count and the memory, and redraws incrementally.

(How fast it is lives in benchmarks/redraw_cost.py and benchmarks/ui_throughput.py, not here.)
"""

from __future__ import annotations

import random
from array import array

import pytest

from torchlab.tui.thinning import GROUP, Series, reduce_groups


def _series_of(xs, ys, level_capacity: int = 8192) -> Series:
    series = Series(level_capacity)
    series.extend(list(xs), list(ys))
    return series


def test_short_histories_come_back_unchanged() -> None:
    series = _series_of([1.0, 2.0, 3.0], [5.0, 4.0, 6.0])
    assert series.thinned(10) == ([1.0, 2.0, 3.0], [5.0, 4.0, 6.0])


def test_max_points_below_two_is_refused() -> None:
    with pytest.raises(ValueError):
        _series_of([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]).thinned(1)


def test_each_group_handed_down_keeps_its_minimum_and_maximum_in_order() -> None:
    rng = random.Random(3)
    xs = array("d", range(8 * GROUP))
    ys = array("d", (rng.random() for _ in xs))
    reduced_xs, reduced_ys = reduce_groups(xs, ys)
    assert len(reduced_ys) == 2 * 8
    for group in range(8):
        values = ys[group * GROUP : (group + 1) * GROUP]
        pair = reduced_ys[2 * group : 2 * group + 2]
        assert sorted(pair) == [min(values), max(values)]
        assert reduced_xs[2 * group] == group * GROUP and reduced_xs[2 * group + 1] == (group + 1) * GROUP - 1
    assert list(reduced_xs) == sorted(reduced_xs)


def test_a_long_history_stays_bounded_and_keeps_its_spikes() -> None:
    series = Series(level_capacity=1024)
    steps = 1_000_000
    for start in range(1, steps + 1, 1000):
        xs = range(start, start + 1000)
        series.extend(xs, [1e6 if x == 123_457 else -5.0 if x == 777_777 else 1.0 for x in xs])
    assert len(series) <= 1024 * len(series.levels) and len(series.levels) <= 8
    assert max(series.ys) == 1e6 and min(series.ys) == -5.0
    thinned_xs, thinned_ys = series.thinned(400)
    assert len(thinned_xs) <= 400
    assert thinned_xs == sorted(thinned_xs)
    assert (thinned_xs[0], thinned_xs[-1]) == (1, steps)
    # The spike is kept, within one group of the level that holds it: far less than a pixel.
    assert max(thinned_ys) == 1e6 and abs(thinned_xs[thinned_ys.index(1e6)] - 123_457) < steps / 512
    assert min(thinned_ys) == -5.0 and abs(thinned_xs[thinned_ys.index(-5.0)] - 777_777) < steps / 512


def test_every_x_block_keeps_its_extremes() -> None:
    rng = random.Random(0)
    xs = list(range(1000))
    ys = [rng.random() for _ in xs]
    thinned_xs, thinned_ys = _series_of(xs, ys).thinned(100)
    assert len(thinned_xs) <= 100 and thinned_xs == sorted(thinned_xs)
    width = 32  # the narrowest power of two with at most (100 - 2) // 2 blocks over 1000 steps
    for start in range(0, 1000, width):
        block = ys[start : start + width]
        assert min(block) in thinned_ys and max(block) in thinned_ys


def test_a_redraw_after_new_points_equals_thinning_from_scratch() -> None:
    rng = random.Random(1)
    xs = list(range(1, 50_001))
    ys = [rng.random() for _ in xs]
    incremental = Series()
    for start in range(0, len(xs), 700):
        incremental.extend(xs[start : start + 700], ys[start : start + 700])
        incremental.thinned(300)
    fresh = Series(level_capacity=10**6)  # nothing handed down: the exact answer
    fresh.extend(xs, ys)
    incremental_xs, incremental_ys = incremental.thinned(300)
    fresh_xs, fresh_ys = fresh.thinned(300)
    assert len(incremental_xs) == len(fresh_xs)
    assert max(incremental_ys) == max(fresh_ys) and min(incremental_ys) == min(fresh_ys)
    assert incremental_xs[-1] == fresh_xs[-1] == 50_000
    # Points handed down moved by less than one group of their level.
    assert all(abs(a - b) < 4 * GROUP for a, b in zip(incremental_xs, fresh_xs))


def test_truncate_after_drops_later_steps_and_the_summary_follows() -> None:
    series = Series(level_capacity=64)
    series.extend(range(1, 501), [float(x) for x in range(1, 501)])
    series.thinned(20)
    series.truncate_after(300)
    assert series.xs[-1] == 300 and series.last == 300.0
    xs, ys = series.thinned(20)
    assert xs[-1] == 300 and max(ys) == 300.0
    series.extend([301.0], [-7.0])
    xs, ys = series.thinned(20)
    assert xs[-1] == 301 and min(ys) == -7.0


def test_the_first_and_latest_points_are_always_kept() -> None:
    # A chart's right edge is "now": it must not stop at the last block's extreme.
    xs = list(range(1001))
    ys = [float((x * 37) % 101) for x in xs]
    ys[0], ys[-1] = 50.0, 50.0
    thinned_xs, _ = _series_of(xs, ys).thinned(40)
    assert thinned_xs[0] == 0 and thinned_xs[-1] == 1000
    assert len(thinned_xs) <= 40


def test_clear_forgets_everything() -> None:
    series = _series_of(range(5000), [1.0] * 5000, level_capacity=256)
    series.thinned(50)
    series.clear()
    assert len(series) == 0 and series.last is None and series.thinned(50) == ([], [])
