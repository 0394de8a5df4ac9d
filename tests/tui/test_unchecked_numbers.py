"""Numbers the app reads from fields the protocol leaves open (tui/unchecked_numbers.py): a wrong type or a
non-finite value reads as None or False, never as an exception that would take the app down."""

from __future__ import annotations

import math

from torchlab.tui.unchecked_numbers import all_finite_numbers, float_or_none, int_or_none, is_finite_number


def test_a_bool_or_text_is_no_number():
    assert [int_or_none(v) for v in (True, "3", None, math.inf, 2.7, 3)] == [None, None, None, None, 2, 3]
    assert [float_or_none(v) for v in (False, "1.0", None, 1)] == [None, None, None, 1.0]
    assert [is_finite_number(v) for v in (True, math.nan, 1.0, 2)] == [False, False, True, True]


def test_a_column_is_all_finite_numbers_only_when_every_value_is_one():
    assert all_finite_numbers([1, 2.5]) and all_finite_numbers([])
    assert not all_finite_numbers([1, True]) and not all_finite_numbers([1, math.nan]) and not all_finite_numbers([1, "2"])
    assert not all_finite_numbers([1e308, 1e308])  # finite values whose sum overflows: the caller's slow path checks each
