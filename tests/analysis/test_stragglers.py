"""The persistent straggler verdict (core/analysis/stragglers.py ``StragglerWatch``): a rank whose own work (its data
wait, copy, forward, optimizer) stays above the other ranks' for the window is named with the part that makes it, once;
noise is not; a rank that catches up is cleared."""

from __future__ import annotations

import random

import pytest

from torchlab.core.analysis.stragglers import WINDOW, StragglerWatch
from torchlab.core.wire.payloads import RankFigures


def figures(rank: int, data_wait_s: float, forward_s: float = 0.010, optimizer_s: float = 0.005) -> RankFigures:
    return RankFigures(rank, 0.05, data_wait_s, None, None, None, 4.0e8, copy_s=0.0, forward_s=forward_s,
                       backward_s=0.02, optimizer_s=optimizer_s)


def test_a_rank_slow_for_the_window_is_named_once_with_its_part_and_cleared_when_it_catches_up():
    watch = StragglerWatch()
    said = []
    for gather in range(WINDOW + 4):  # rank 1 waits 8 ms more for its batch than rank 0 (+50 % of its own work)
        said += watch.add(10 * (gather + 1), [figures(0, 0.001), figures(1, 0.009)])
    [verdict] = said
    assert (verdict.rank, verdict.part, verdict.since_step, verdict.cleared) == (1, "data wait", 10, False)
    assert verdict.excess_s == pytest.approx(0.008) and verdict.step_share == pytest.approx(0.16)  # of a 50 ms step
    cleared = []
    for gather in range(WINDOW):
        cleared += watch.add(200 + 10 * gather, [figures(0, 0.001), figures(1, 0.001)])
    assert [(entry.rank, entry.cleared) for entry in cleared] == [(1, True)]


def test_noise_between_ranks_is_no_straggler_nor_is_one_slow_report():
    """Ranks of one host differ by 5-15 % from report to report (tui's rank table measured it): no verdict; nor for
    one report of a rank three times slower, as a stall of the disk makes."""
    noisy = random.Random(3)
    watch = StragglerWatch()
    said = []
    for gather in range(5 * WINDOW):
        slow = 3.0 if gather == 20 else 1.0
        said += watch.add(gather, [figures(rank, 0.004 * noisy.uniform(0.85, 1.15) * (slow if rank == 1 else 1),
                                           forward_s=0.010 * noisy.uniform(0.9, 1.1)) for rank in range(4)])
    assert said == []


def test_an_excess_too_small_to_cost_a_step_anything_is_not_named():
    """Twice the others' own work, but 0.2 ms against a 50 ms step: under the 5 % floor (4 ms more is named)."""
    for wait, named in ((0.0004, False), (0.008, True)):
        watch = StragglerWatch()
        said = []
        for gather in range(2 * WINDOW):
            said += watch.add(gather, [figures(0, wait / 2, forward_s=0.0, optimizer_s=0.0),
                                       figures(1, wait, forward_s=0.0, optimizer_s=0.0)])
        assert bool(said) == named
