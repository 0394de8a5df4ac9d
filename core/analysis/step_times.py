"""Is one run of steps faster than another? The statistics of step times that the impact table (core/analysis/impact.py)
and a trial's arms (core/analysis/trial_words.py, core/engine/trials.py) share: a median's interval built from blocks of
steps (step times are not independent draws), a comparison that calls a difference only where two intervals do not
overlap, the one wording of the noise, and the load shift that voids a verdict.

Standard library only.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from torchlab.core.wire.payloads import ImpactSegment, TrialArm

#: Fewer timed steps than this give no interval, and no speed verdict: a later segment is compared with an earlier one.
MIN_TIMED_STEPS = 10
#: The interval is built from the medians of consecutive blocks of steps: at least MIN_BLOCKS (below
#: five, even their whole range covers the median less than 90 % of the time), one per STEPS_PER_BLOCK
#: steps up to MAX_BLOCKS. More, shorter blocks would be more correlated with their neighbours (a
#: slowdown lasting seconds spans several), which is what made an interval over single steps too narrow.
MIN_BLOCKS = 5
MAX_BLOCKS = 20
STEPS_PER_BLOCK = 5
#: Each end of the interval misses the median at most this often (binomial tail): a 90 % interval.
TAIL_PROBABILITY = 0.05
#: Where other processes' share of the machine's CPU moved this much (in points of 100) between two segments,
#: their step times say as much about the machine as about the option: no speed verdict is given then. On a
#: 2-core box one busy neighbour is 50 points. A trial's two arms, one after the other, are held to the same rule.
LOAD_SHIFT_POINTS = 25.0

def median_interval(step_times: Sequence[float]) -> tuple[float, float] | None:
    """A 90 % interval of the median step time; None under ``MIN_TIMED_STEPS`` steps.

    Step times are not independent draws: a VM's speed drifts over seconds, a neighbour process starts
    and stops. An interval that treats each step as a draw is far too narrow, and a verdict built on it
    calls that drift an effect. So the steps, in order, are cut into consecutive blocks, and the blocks'
    medians are taken as the independent draws: a slowdown lasting many steps moves whole blocks and
    widens the interval, while step-to-step jitter stays inside a block. The interval is the
    distribution-free one for a median: from the j-th lowest to the j-th highest block median, with j as
    large as a binomial(blocks, 1/2) tail allows; it covers the median 90-98 % of the time, as the
    number of blocks goes (20 blocks: the 6th to the 15th, 96 %; 5 to 7: their whole range). With the
    median itself, two sorts of at most ``MEDIAN_WINDOW`` times: cheap at the app's once a second.
    """
    count = len(step_times)
    if count < MIN_TIMED_STEPS:
        return None
    blocks = min(MAX_BLOCKS, max(MIN_BLOCKS, count // STEPS_PER_BLOCK))
    times = list(step_times)
    bounds = [count * index // blocks for index in range(blocks + 1)]
    block_medians = sorted(statistics.median(times[start:end]) for start, end in zip(bounds, bounds[1:]))
    lowest = _order_statistic_index(blocks)
    return block_medians[lowest], block_medians[blocks - 1 - lowest]


def _order_statistic_index(draws: int) -> int:
    """Where in the sorted draws (from 0) an interval of their median starts: the largest index whose draw
    lies above the median with probability at most ``TAIL_PROBABILITY``. Draw j lies above it when at most
    j draws fall below it, and how many fall below is binomial(draws, 1/2)."""

    def at_most_below(j: int) -> float:
        return sum(math.comb(draws, below) for below in range(j + 1)) / 2**draws

    index = 0
    while at_most_below(index + 1) <= TAIL_PROBABILITY:
        index += 1
    return index


def compare_step_times(
    previous: ImpactSegment | TrialArm | None, median: float | None, interval: tuple[float, float] | None,
    *, in_turn: bool = False,
) -> tuple[float | None, str | None]:
    """``(speedup, words)``: this segment's step time (its median and interval) against an earlier one's.

    Faster or slower only when the two intervals do not overlap; then ``speedup`` is the ratio of the
    medians. Otherwise ``speedup`` is None and the words say "no clear difference (±x %)", x being the
    largest change both intervals allow: this segment's high end over the earlier one's low end, or
    its low end under the earlier one's high end, whichever is further from 1 (``noise_words``: from ±100 %
    on, "step times varied up to 3.3x"). A change that small can hide in the noise. ``in_turn``: the two ran one
    after the other (the impact table's segments), and the noise says so (``IN_TURN``). A segment (this or the
    earlier one) without an interval: "too few steps to judge"."""
    if previous is None:
        return None, None
    before_median, before_low, before_high = previous.median_step_time_s, previous.step_time_low_s, previous.step_time_high_s
    if median is None or interval is None or before_median is None or before_low is None or before_high is None:
        return None, "too few steps to judge"
    low, high = interval
    if high < before_low or low > before_high:
        speedup = before_median / median
        return speedup, f"{speedup:.2f}x faster" if speedup >= 1 else f"{1 / speedup:.2f}x slower"
    hidden = max(high / before_low - 1, 1 - low / before_high)
    return None, f"no clear difference ({noise_words(hidden)}{', ' + IN_TURN if in_turn else ''})"


#: What the noise of two segments adds: they ran one after the other, not interleaved as a trial's arms, so a load
#: that changed between them can decide the verdict; a trial of the change judges it better. In parts of at most 23
#: characters between commas: the app's table wraps a verdict there (``impact_screen.wrap_verdict``), at 80 columns.
IN_TURN = "segments ran in turn, so load changes sway it, try a trial"


def load_shift(before: float | None, after: float | None) -> str | None:
    """Why a clear speed difference is not a verdict: other processes' share of the machine's CPU moved by
    ``LOAD_SHIFT_POINTS`` or more between the two (segments, or a trial's arms). Seen: "checkpointing=on: 3.42x
    faster" while a test suite beside the run stopped. None where it held steady, or where one is not known."""
    if before is None or after is None or abs(after - before) < LOAD_SHIFT_POINTS:
        return None
    return f"speed not judged: other processes' CPU use went {before:.0f} % → {after:.0f} %"


#: From this spread on, ``noise_words`` says it as a ratio: "±234 %" is true, but reads as nothing.
SPREAD_AS_RATIO = 1.0


def noise_words(hidden: float) -> str:
    """How large a change the noise could hide, for "no clear difference (...)": ``±6 %`` (``plus_minus``), and
    from ``SPREAD_AS_RATIO`` (±100 %) on, as the ratio of step times the two intervals allow: ``step times
    varied up to 3.3x``. Only "slower" reaches it (a step time cannot fall by 100 %), so the ratio is
    ``1 + hidden``. The one wording of the noise: impact.json's verdict, the app's table and log, a trial's line."""
    if hidden < SPREAD_AS_RATIO:
        return plus_minus(hidden)
    ratio = 1 + hidden
    return f"step times varied up to {ratio:.1f}x" if ratio < 10 else f"step times varied up to {ratio:.0f}x"


def plus_minus(fraction: float) -> str:
    """``±4 %``; a spread under 1 % with one decimal (``±0.4 %``), so that it never reads as none."""
    percent = 100 * fraction
    return f"±{percent:.0f} %" if percent >= 1 else f"±{percent:.1f} %"
