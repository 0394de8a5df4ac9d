"""Which rank holds the others back: each rank's figures against the other ranks', and the straggler flagged.

At each all-reduce every rank waits for the slowest, so one slow rank costs the whole run its excess.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

from torchlab.core.wire.payloads import RankFigures

#: A rank straggles when its step time or data wait is above this many times the other ranks' median
#: and the excess is at least STRAGGLER_MIN_SHARE of the median step time (``flag_stragglers`` says why).
STRAGGLER_RATIO = 1.3
STRAGGLER_MIN_SHARE = 0.05


@dataclass(frozen=True)
class ComparedRank:
    """One rank's figures (from the trainer's ``Ranks`` message) and where it runs, compared with the other ranks'.

    ``step_vs_others`` and ``wait_vs_others`` are this rank's step time and data wait over the other ranks'
    median (None where a figure is missing); ``flag`` names the figure that makes it a straggler ("step time"
    or "data wait"), or is empty.
    """

    figures: RankFigures
    host: str = ""
    step_vs_others: float | None = None
    wait_vs_others: float | None = None
    flag: str = ""


def flag_stragglers(ranks: list[ComparedRank]) -> list[ComparedRank]:
    """Each rank compared with the median of the *other* ranks, and flagged when it straggles.

    A rank is a straggler when its step time, or its data wait, is above STRAGGLER_RATIO (1.3) times the
    other ranks' median, and that excess is at least STRAGGLER_MIN_SHARE (5 %) of the median step time.

    - The others' median, not the median of all: with two ranks the median of all is the pair's mean,
      which halves any gap; and one straggler among many does not move the others' median.
    - 1.3x: ranks of one run on one host differ by 5-15 % from report to report (measured: tiny_gpt, two
      CPU ranks, 220-300 ms steps); 30 % is past that noise, and a rank that far behind holds every rank
      back by as much at each all-reduce.
    - The floor: a data wait of 0.6 ms against 0.4 ms is 1.5x but costs nothing worth a flag.
    - Both figures: the gradient all-reduce makes every rank wait for the slowest, so a rank that computes
      slowly raises every rank's step time alike; what stays visible per rank is the wait for its batch
      (a slow loader or disk) and work a rank does outside the shared part of the step.
    """
    step_times = [rank.figures.step_time_s for rank in ranks]
    waits = [rank.figures.data_wait_s for rank in ranks]
    known_steps = [value for value in step_times if value is not None]
    typical_step = statistics.median(known_steps) if known_steps else None
    flagged = []
    for index, rank in enumerate(ranks):
        step_ratio, step_excess = _against_others(step_times, index)
        wait_ratio, wait_excess = _against_others(waits, index)
        floor = STRAGGLER_MIN_SHARE * typical_step if typical_step else 0.0
        flag = ""
        if step_ratio is not None and step_ratio > STRAGGLER_RATIO and step_excess >= floor:
            flag = "step time"
        elif wait_ratio is not None and wait_ratio > STRAGGLER_RATIO and wait_excess >= floor and typical_step:
            flag = "data wait"
        flagged.append(replace(rank, step_vs_others=step_ratio, wait_vs_others=wait_ratio, flag=flag))
    return flagged


def _against_others(values: list[float | None], index: int) -> tuple[float | None, float]:
    """``values[index]`` over the median of the other known values, and its excess over that median."""
    value = values[index]
    others = [other for position, other in enumerate(values) if position != index and other is not None]
    if value is None or not others:
        return None, 0.0
    typical = statistics.median(others)
    if typical <= 0:
        return (None if value <= 0 else math.inf), value - typical
    return value / typical, value - typical
