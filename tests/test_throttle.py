"""The journal's limit on refused lines: a burst per window, and a count of what it held back."""

from __future__ import annotations

from torchlab.core.wire.throttle import Throttle


def test_a_burst_per_window_then_the_count_of_what_was_held_back():
    now = [0.0]
    throttle = Throttle(burst=3, window_s=60.0, clock=lambda: now[0])
    assert [throttle.admit() for _ in range(5)] == [0, 0, 0, None, None]
    now[0] = 59.0
    assert throttle.admit() is None
    now[0] = 60.0  # a new window: the first record through carries the three held back
    assert [throttle.admit() for _ in range(4)] == [3, 0, 0, None]


def test_flush_gives_what_is_left_to_count_at_the_end():
    throttle = Throttle(burst=1, window_s=60.0, clock=lambda: 0.0)
    assert [throttle.admit() for _ in range(4)] == [0, None, None, None]
    assert throttle.flush() == 3 and throttle.flush() == 0
