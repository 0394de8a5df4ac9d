"""Min/max thinning keeps spikes, bounds the point count, and stays fast on long runs."""

from __future__ import annotations

import random
import time
from array import array

import pytest

from torchlab.tui.thinning import Series, thin_minmax


def test_short_histories_come_back_unchanged() -> None:
    xs, ys = [1.0, 2.0, 3.0], [5.0, 4.0, 6.0]
    assert thin_minmax(xs, ys, 10) == (xs, ys)


def test_a_single_spike_survives_thinning() -> None:
    n = 100_000
    xs = array("d", range(n))
    ys = array("d", (1.0 for _ in range(n)))
    ys[54_321] = 1e6
    ys[77_777] = -5.0
    thinned_xs, thinned_ys = thin_minmax(xs, ys, 400)
    assert len(thinned_xs) <= 400
    assert max(thinned_ys) == 1e6 and thinned_xs[thinned_ys.index(1e6)] == 54_321
    assert min(thinned_ys) == -5.0


def test_points_stay_in_x_order_and_each_bucket_keeps_its_extremes() -> None:
    rng = random.Random(0)
    xs = list(range(1000))
    ys = [rng.random() for _ in xs]
    thinned_xs, thinned_ys = thin_minmax(xs, ys, 100)
    assert thinned_xs == sorted(thinned_xs)
    assert len(thinned_xs) <= 100
    buckets = 49  # (100 - 2) // 2: two points are kept for the ends
    for bucket in range(buckets):
        segment = ys[bucket * 1000 // buckets : (bucket + 1) * 1000 // buckets]
        assert min(segment) in thinned_ys and max(segment) in thinned_ys


def test_max_points_below_two_is_refused() -> None:
    with pytest.raises(ValueError):
        thin_minmax([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], 1)


def test_thinning_100k_points_is_fast() -> None:
    n = 100_000
    xs = array("d", range(n))
    ys = array("d", (random.random() for _ in range(n)))
    started = time.perf_counter()
    thin_minmax(xs, ys, 400)
    assert time.perf_counter() - started < 0.1  # ~10 ms here; generous for a loaded CI box


def test_series_thinned_matches_the_extremes_and_is_incremental() -> None:
    series = Series()
    rng = random.Random(1)
    for step in range(100_000):
        series.append(step, rng.random())
    series.ys[12_345] = 50.0
    thinned_xs, thinned_ys = series.thinned(400)
    assert len(thinned_xs) <= 400
    assert max(thinned_ys) == 50.0 and 12_345 in thinned_xs
    # After the first call, a redraw for one more step only looks at the new points.
    series.append(100_000, -1.0)
    started = time.perf_counter()
    thinned_xs, thinned_ys = series.thinned(400)
    assert time.perf_counter() - started < 0.02
    assert min(thinned_ys) == -1.0 and thinned_xs[-1] == 100_000
    assert thinned_xs == sorted(thinned_xs)


def test_series_is_bounded_and_keeps_spikes_when_compacted() -> None:
    series = Series(capacity=1000)
    for step in range(5000):
        series.append(step, 100.0 if step == 2500 else 1.0)
    assert len(series) <= 1000
    assert max(series.ys) == 100.0


def test_truncate_after_drops_later_steps() -> None:
    series = Series()
    for step in range(1, 121):
        series.append(step, float(step))
    series.thinned(20)
    series.truncate_after(100)
    assert series.xs[-1] == 100 and len(series) == 100
    xs, _ = series.thinned(20)
    assert xs[-1] == 100


def test_the_first_and_latest_points_are_always_kept() -> None:
    # A chart's right edge is "now": it must not stop at the last bucket's extreme.
    xs = list(range(1001))
    ys = [float((x * 37) % 101) for x in xs]
    ys[0], ys[-1] = 50.0, 50.0
    for thinned_xs, _ in (thin_minmax(xs, ys, 40), _series_of(xs, ys).thinned(40)):
        assert thinned_xs[0] == 0 and thinned_xs[-1] == 1000
        assert len(thinned_xs) <= 40


def _series_of(xs, ys) -> Series:
    series = Series()
    for x, y in zip(xs, ys):
        series.append(x, y)
    return series
