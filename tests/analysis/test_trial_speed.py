"""A trial's speed verdict (core/analysis/trial_speed.py): the ratio of its interleaved arms' step times, a 90 %
signed-rank interval from the pairs of blocks, and a direction only beyond the 3 % margin."""

from __future__ import annotations

import math
import random

import pytest

from trial_records import trial_arm
from torchlab.core.analysis.trial_speed import (
    ARM_NOISE,
    FASTER, MIN_PAIRS, NO_CLEAR_DIFFERENCE, SLOWER, SPEED_MARGIN, _signed_rank_depth, paired_speed, speed_verdict,
    speed_words,
)
from torchlab.core.analysis.trial_words import describe_trial
from torchlab.core.wire.payloads import TrialSpeed
from torchlab.core.wire.protocol import TrialResult


def test_the_interval_starts_where_the_signed_rank_tables_say():
    """The 5 % one-sided critical values of Wilcoxon's signed-rank statistic (the printed tables), and the normal
    approximation taking over at 61 pairs within one rank of where the exact count would put it."""
    assert [_signed_rank_depth(pairs) for pairs in (5, 6, 8, 10, 15, 20, 30)] == [0, 2, 5, 10, 30, 60, 151]
    assert _signed_rank_depth(61) in (715, 716, 717)


def test_pairs_of_a_clear_slowdown_are_judged_slower_with_the_ratio_inside_its_interval():
    speed = paired_speed([17.1, 17.3, 16.9, 17.2, 17.0, 17.4], [10.0, 10.1, 9.9, 10.0, 10.0, 10.1], 12)
    assert speed.verdict == SLOWER and speed.pairs == 6
    assert 1 + SPEED_MARGIN < speed.low <= speed.ratio <= speed.high and speed.ratio == pytest.approx(1.71, abs=0.01)


def test_one_pair_a_burst_hit_on_one_side_does_not_undo_a_clear_verdict():
    """Ten pairs, one of them with the unchanged arm's block slowed 2x by a neighbour: one rank among ten."""
    changed = [17.0 + 0.1 * (i % 3) for i in range(10)]
    as_it_is = [10.0] * 9 + [20.0]
    speed = paired_speed(changed, as_it_is, 20)
    assert speed.verdict == SLOWER and speed.low > 1.6


def test_an_a_a_trial_whose_interval_straddles_the_margin_names_no_direction():
    draws = random.Random(4)
    as_it_is = [10 * (1 + draws.uniform(-0.1, 0.1)) for _ in range(10)]
    changed = [10 * (1 + draws.uniform(-0.1, 0.1)) for _ in range(10)]
    speed = paired_speed(changed, as_it_is, 20)
    assert speed.low < 1 + SPEED_MARGIN < speed.high  # it reaches past the margin, and holds 1 too
    assert speed.verdict == NO_CLEAR_DIFFERENCE


def test_no_interval_is_narrower_than_two_copies_of_an_arm_differ():
    """Pairs that agree to 0.1 % on 1.015x: the interval still spans the arms' own noise (ARM_NOISE, ±2.5 % at
    90 %), so it holds 1 and names no direction."""
    speed = paired_speed([10.15, 10.16, 10.14, 10.15, 10.17, 10.13], [10.0] * 6, 12)
    assert speed.low == pytest.approx(1.015 / math.exp(1.645 * ARM_NOISE), rel=2e-3)
    assert speed.low < 1 < 1 + SPEED_MARGIN < speed.high and speed.verdict == NO_CLEAR_DIFFERENCE


def test_too_few_pairs_give_no_verdict_and_missing_blocks_are_left_out():
    assert paired_speed([1.0] * (MIN_PAIRS - 1), [1.0] * (MIN_PAIRS - 1), 8) is None
    assert paired_speed([2.0, None, 2.0, 2.0, 2.0, 2.0], [1.0, 1.0, None, 1.0, 1.0, 1.0], 12) is None  # 4 whole pairs
    assert paired_speed([2.0, None, 2.0, 2.0, 2.0, 2.0, 2.1], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], 14).pairs == 6


@pytest.mark.parametrize("speed, words", [
    (TrialSpeed(ratio=1.71, low=1.64, high=1.79, verdict=SLOWER, pairs=10, steps=20), "1.71x slower (1.64–1.79)"),
    (TrialSpeed(ratio=0.5, low=0.4, high=0.625, verdict=FASTER, pairs=10, steps=20), "2.00x faster (1.60–2.50)"),
    (TrialSpeed(ratio=1.01, low=0.98, high=1.05, verdict=NO_CLEAR_DIFFERENCE, pairs=10, steps=20), "no clear difference (0.98–1.05x)"),
])
def test_the_words_say_the_ratio_and_its_interval(speed, words):
    assert speed_words(speed) == words


def test_the_event_sentence_of_a_trial_says_its_speed_verdict_with_its_interval():
    def arm(label, ms, activations):
        return trial_arm(label, ms, spread=(0.5, 2), activations=activations, losses=(2.5, 2.25))

    result = TrialResult(step=40, option="checkpointing", value="on", steps=20,
                         arms=[arm("checkpointing=on", 17.1, 100), arm("as it is", 10.0, 1000)],
                         speed=TrialSpeed(ratio=1.71, low=1.64, high=1.79, verdict=SLOWER, pairs=10, steps=20))
    assert describe_trial(result) == ["trial checkpointing=on from step 40, 20 steps each on the same batches: 1.71x slower "
                                      "(1.64–1.79), activations -90 %, memory -82 %, loss 2.3750 vs 2.3750 (mean), "
                                      "2.2500 vs 2.2500 (last)"]


def test_a_ratio_and_its_inverse_are_judged_alike():
    """Logarithms: the arms swapped give the inverse ratio, the inverse interval and the opposite direction."""
    changed, as_it_is = [12.0, 12.5, 11.8, 12.2, 12.9, 12.1], [10.0, 10.2, 9.9, 10.1, 10.4, 10.0]
    forward, backward = paired_speed(changed, as_it_is, 12), paired_speed(as_it_is, changed, 12)
    assert forward.verdict == SLOWER and backward.verdict == FASTER
    assert math.isclose(forward.ratio * backward.ratio, 1) and math.isclose(forward.low * backward.high, 1)


@pytest.mark.parametrize("low, high, verdict", [
    (1.01, 1.06, NO_CLEAR_DIFFERENCE),  # beyond 1, not beyond the margin: a difference too small to name
    (1.031, 1.2, SLOWER), (1.029, 1.2, NO_CLEAR_DIFFERENCE),
    (0.9, 0.969, FASTER), (0.9, 0.971, NO_CLEAR_DIFFERENCE),
    (0.95, 1.05, NO_CLEAR_DIFFERENCE),
])
def test_a_direction_is_named_only_where_the_whole_interval_lies_beyond_the_margin(low, high, verdict):
    assert SPEED_MARGIN == 0.03
    assert speed_verdict(low, high) == verdict


def test_a_trial_of_accumulation_is_judged_by_a_samples_time():
    """A step of the arm with accum=2 trains twice the samples of one as it is: 1.7 times its time is 1.18x faster
    per sample, which is what the trial says (the impact table's rule, core/analysis/impact.py)."""
    as_it_is = [0.030 * (1 + 0.01 * (index % 3)) for index in range(10)]
    changed = [1.7 * time for time in as_it_is]
    speed = paired_speed(changed, as_it_is, steps=20, samples_ratio=2.0)
    assert speed.per_sample and speed.verdict == "faster" and speed.ratio == pytest.approx(0.85)
    assert speed_words(speed).startswith("1.18x faster per sample (")
    assert not paired_speed(changed, as_it_is, steps=20).per_sample  # any other option: a step's time
