"""A trial's speed verdict, from its interleaved arms (standard library only).

The trainer runs a trial's two arms in alternating blocks, A B B A A B ... (core/engine/trials.py): the i-th
block of each arm is the same steps of it, on the same batches, run one right after the other, so that what the
machine does over seconds (a neighbour's job, a VM's drift, throttling) falls on both blocks of a pair alike.
Each pair gives one ratio, the changed arm's block step time over the unchanged arm's, and the pairs are the
draws: a load that comes and goes moves a pair's two blocks together, and the ratio cancels it.

The interval is the one a paired test gives, on the ratios' logarithms, widened by ``ARM_NOISE`` (below): Wilcoxon's signed-rank test, whose 90 %
interval runs between two of the pairs' Walsh averages (the means of every two pairs' log ratios, each pair with
itself included), counted in from each end as far as the test's exact distribution allows; the ratio is the
Hodges-Lehmann estimate, the median of those averages. Logarithms, because a ratio and its inverse are then
equally far from 1 (a 2x and a 0.5x pair cancel). A rank test, because the pairs' noise has heavy tails: on a
busy 2-core machine most pairs agree within a few per cent, while one that a neighbour's burst or a stalled
thread hit on one side only is off by 2x or more. Such a pair moves a t-interval's mean and widens it through
the spread (one in five pairs made a 1.7x slowdown "no clear difference"); here it counts as one rank. With
symmetric noise it loses little against a t-interval (95 % of its efficiency under normal noise), and an A/A
trial's noise is symmetric by construction (its arms are exchangeable). It takes at least ``MIN_PAIRS`` pairs:
with four, even the whole range of the averages covers the true ratio less than 90 % of the time. No bootstrap:
over ten pairs its intervals are known to be too narrow, and it would draw random numbers, where this is a
formula (the same pairs give the same verdict, and training's random streams are untouched).

A verdict names a direction only where the whole interval lies beyond ``SPEED_MARGIN`` (3 %: outside
0.97-1.03x). A 90 % interval misses the true ratio one time in ten; with the margin, identical arms (whose
true ratio is 1) are called slower or faster only where noise puts the whole interval 3 % away, which
``benchmarks/trial_power.py`` measures (benchmarks/README.md).

**Timed until precise.** K steps an arm give K / 2 pairs; on a machine whose speed wobbles from one step to the
next (a VM's neighbours, a burst of another job) ten pairs leave an interval of ±10-20 %, too wide to tell a
change of a few per cent from none. So a trial goes on timing past its K steps, a pair of blocks at a time, until
its interval's ends are within ``PRECISE_WIDTH`` of each other (``precise_enough``) or its arms have run
``timing_cap(K)`` steps each (core/engine/trials.py). The rule looks at the interval's width alone, never at where
it lies, so stopping on it does not favour a direction: identical arms still name none as rarely as the margin
allows (measured in benchmarks/README.md), where stopping at the first interval beyond the margin would make a
direction more likely with every look.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from functools import lru_cache

from torchlab.core.wire.payloads import TrialSpeed

#: A change of step time smaller than this share is no direction, whatever the interval: 0.97-1.03x is "no clear
#: difference". Below a few per cent, a change matters less than what moves step times from one hour to the next.
SPEED_MARGIN = 0.03
#: Fewer pairs of blocks than this give no interval: the signed-rank test's 90 % interval needs five.
MIN_PAIRS = 5
#: Each end of the interval misses the true ratio at most this often: a 90 % interval.
TAIL_PROBABILITY = 0.05
#: Above this many pairs the signed-rank statistic's distribution is taken as normal (it is within a rank of the
#: exact one there), not counted exactly: counting costs pairs cubed.
EXACT_PAIRS = 60
#: Two copies of the same arm differ by about this much within a trial, beyond what their pairs' noise says (the
#: copies' memory, where each arm's state was loaded): A/A trials of 50 pairs under bursts spread 3.6 % from one
#: trial to the next where their own pairs account for 3.3 % (√(3.6² - 3.3²) ≈ 1.5), and no count of pairs averages
#: it away. Left out, their 90 % interval held 1.00 in 137 of 160 (86 %, 6 directions); added in quadrature
#: (``_with_arm_noise``), 144 of 160 (90 %, 3 directions): chosen on one run of 80, held on the other
#: (benchmarks/README.md, ``trial_power.py``).
ARM_NOISE = 0.015
#: A trial times on past its K steps while its interval's high end is more than this many times its low end (about
#: ±5 % around the ratio): narrow enough that a change of up to ~4.5 % (clipping's on a small CNN here) reads "no
#: clear difference" inside 0.9-1.1x. At 1.12, with the arms' own noise added, that held in one run of two; at 1.10 in
#: two of two, with no A/A direction in 80 (benchmarks/README.md, ``trial_power.py``).
PRECISE_WIDTH = 1.10
SLOWER, FASTER, NO_CLEAR_DIFFERENCE = "slower", "faster", "no clear difference"


def paired_speed(changed: Sequence[float | None], as_it_is: Sequence[float | None], steps: int,
                 samples_ratio: float = 1.0) -> TrialSpeed | None:
    """The changed arm's step time over the unchanged arm's, from their blocks' step times in pairs (the i-th of
    each; a pair with a missing or non-positive time is left out): the Hodges-Lehmann ratio, its 90 % signed-rank
    interval and verdict (see the module docstring), timed over ``steps`` steps an arm. None under ``MIN_PAIRS``
    pairs. ``samples_ratio``: the changed arm's samples a step over the other's (a trial of ``accum=2``: 2), whose
    times are then compared per sample."""
    logs = [math.log(a / samples_ratio / b) for a, b in zip(changed, as_it_is)
            if a is not None and b is not None and a > 0 and b > 0]
    if len(logs) < MIN_PAIRS:
        return None
    walsh = sorted((logs[i] + logs[j]) / 2 for i in range(len(logs)) for j in range(i, len(logs)))
    inward = _signed_rank_depth(len(logs))
    low, high = _with_arm_noise(walsh[inward], walsh[len(walsh) - 1 - inward])
    return TrialSpeed(ratio=math.exp(statistics.median(walsh)), low=low, high=high, verdict=speed_verdict(low, high),
                      pairs=len(logs), steps=steps, per_sample=samples_ratio != 1)


def _with_arm_noise(low: float, high: float) -> tuple[float, float]:
    """The pairs' interval (the logarithms of its ends) widened by ``ARM_NOISE``, in quadrature about its middle:
    the half-width h becomes z·√((h/z)² + ARM_NOISE²), z the normal quantile of the interval's level."""
    z = statistics.NormalDist().inv_cdf(1 - TAIL_PROBABILITY)
    middle, half = (high + low) / 2, (high - low) / 2
    half = z * math.hypot(half / z, ARM_NOISE)
    return math.exp(middle - half), math.exp(middle + half)


def precise_enough(speed: TrialSpeed | None) -> bool:
    """Whether a trial can stop timing: its interval's high end at most ``PRECISE_WIDTH`` times its low end."""
    return speed is not None and speed.high <= PRECISE_WIDTH * speed.low


def speed_verdict(low: float, high: float) -> str:
    """"slower" where the whole interval lies above 1 + ``SPEED_MARGIN``, "faster" where it lies below
    1 - ``SPEED_MARGIN``, else "no clear difference"."""
    if low > 1 + SPEED_MARGIN:
        return SLOWER
    if high < 1 - SPEED_MARGIN:
        return FASTER
    return NO_CLEAR_DIFFERENCE


def speed_words(speed: TrialSpeed) -> str:
    """``1.71x slower (1.64–1.79)``, ``1.38x faster (1.30–1.47)`` (the speed-up and its interval: the inverse of
    the ratio), ``no clear difference (0.98–1.05x)`` (the ratio's interval): the event log's and the bar's words."""
    unit = " per sample" if speed.per_sample else ""
    if speed.verdict == SLOWER:
        return f"{speed.ratio:.2f}x slower{unit} ({speed.low:.2f}–{speed.high:.2f})"
    if speed.verdict == FASTER:
        return f"{1 / speed.ratio:.2f}x faster{unit} ({1 / speed.high:.2f}–{1 / speed.low:.2f})"
    return f"{NO_CLEAR_DIFFERENCE} ({speed.low:.2f}–{speed.high:.2f}x)"


@lru_cache(maxsize=None)
def _signed_rank_depth(pairs: int) -> int:
    """Where the interval starts in the sorted Walsh averages (from 0; it ends as far in from the top): the largest w
    with P(W <= w) <= ``TAIL_PROBABILITY``, W the signed-rank statistic of ``pairs`` pairs with no effect (the sum of
    the ranks of the positive ones, each rank in or out with even chances: its distribution counts the subsets of
    1..n by their sum). The interval then covers the true ratio with at least 1 - 2 P(W <= w): 93.8 % of the time
    with 5 pairs (the whole range), 91.6 % with 10 (the 11th to the 45th of 55). Needs ``MIN_PAIRS``."""
    if pairs > EXACT_PAIRS:
        mean, spread = pairs * (pairs + 1) / 4, math.sqrt(pairs * (pairs + 1) * (2 * pairs + 1) / 24)
        return math.floor(mean + statistics.NormalDist().inv_cdf(TAIL_PROBABILITY) * spread - 0.5)
    subsets_by_sum = [1] + [0] * (pairs * (pairs + 1) // 2)
    for rank in range(1, pairs + 1):
        for total in range(len(subsets_by_sum) - 1, rank - 1, -1):
            subsets_by_sum[total] += subsets_by_sum[total - rank]
    at_most, depth = subsets_by_sum[0], 0
    while (at_most + subsets_by_sum[depth + 1]) / 2**pairs <= TAIL_PROBABILITY:
        depth += 1
        at_most += subsets_by_sum[depth]
    return depth
