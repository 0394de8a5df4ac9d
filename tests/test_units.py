"""Byte counts in words (core/units.py): the one formatter of every panel, table and paragraph."""

from __future__ import annotations

import math

import pytest

from torchlab.core.units import format_bytes


@pytest.mark.parametrize("count, words", [
    (512, "512 B"), (1536, "1.5 KiB"), (-3 * 1024**2, "-3 MiB"), (1013 * 1024**2, "1013 MiB"),
    (41.2 * 1024**3, "41.2 GiB"), (2 * 1024**4, "2 TiB"),
])
def test_three_significant_digits_and_whole_numbers_from_100_in_the_counts_unit(count, words):
    assert format_bytes(count) == words


@pytest.mark.parametrize("count", [None, True, "12", math.nan, math.inf])
def test_what_is_not_a_finite_count_is_the_missing_mark(count):
    assert format_bytes(count) == "–" and format_bytes(count, missing="?") == "?"
