"""Byte counts in words (core/units.py): the one formatter of every panel, table and paragraph."""

from __future__ import annotations

import math

import pytest

from torchlab.core.units import format_bytes, parse_bytes


@pytest.mark.parametrize("count, words", [
    (512, "512 B"), (1536, "1.5 KiB"), (-3 * 1024**2, "-3 MiB"), (1013 * 1024**2, "1013 MiB"),
    (41.2 * 1024**3, "41.2 GiB"), (2 * 1024**4, "2 TiB"),
])
def test_three_significant_digits_and_whole_numbers_from_100_in_the_counts_unit(count, words):
    assert format_bytes(count) == words


@pytest.mark.parametrize("count", [None, True, "12", math.nan, math.inf])
def test_what_is_not_a_finite_count_is_the_missing_mark(count):
    assert format_bytes(count) == "–" and format_bytes(count, missing="?") == "?"


@pytest.mark.parametrize("text, size", [("80GiB", 80 * 1024**3), ("80 GB", 80 * 10**9), ("81920M", 80 * 1024**3),
                                        ("1.5T", int(1.5 * 1024**4)), ("4096", 4096), ("512 kib", 512 * 1024)])
def test_a_size_is_read_as_typed_a_bare_g_being_a_gib(text, size):
    assert parse_bytes(text) == size


@pytest.mark.parametrize("text", ["lots", "12x", "-3G", "0", "nanG", "", "infG"])
def test_what_is_no_size_is_refused_with_the_forms_that_are(text):
    with pytest.raises(ValueError, match="is not a size; write it as 80GiB"):
        parse_bytes(text)
