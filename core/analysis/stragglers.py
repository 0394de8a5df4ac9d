"""Which rank holds the others back: each rank's figures against the other ranks' (``flag_stragglers``, the rank table's
live flag), and the persistent verdict (``StragglerWatch``: the journal's, the app's and headless output's).

At each all-reduce every rank waits for the slowest, so one slow rank costs the whole run its excess, and every rank's
step time is the same: what differs is each rank's own work outside the gradients' sync (``own_work_s``: its wait for
its batch, the batch's copy, its forward and its optimizer step; the backward holds the sync, where the others wait).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field, replace

from torchlab.core.wire.payloads import RankFigures

#: A rank straggles, on one report, when its step time or data wait is above this many times the other ranks' median
#: and the excess is at least STRAGGLER_MIN_SHARE of the median step time (``flag_stragglers`` says why).
STRAGGLER_RATIO = 1.3
STRAGGLER_MIN_SHARE = 0.05
#: The persistent verdict: over the last WINDOW gathers of the ranks' figures (at the probe's cadence), a rank whose
#: own work's median excess over the other ranks' is at least PERSISTENT_EXCESS, three times that excess's own spread
#: (its median absolute deviation: the noise), and STRAGGLER_MIN_SHARE of a step.
WINDOW = 8
PERSISTENT_EXCESS = 0.15
#: A rank judged a straggler is cleared once its median excess falls under half the verdict's threshold.
CLEARED_EXCESS = PERSISTENT_EXCESS / 2
#: The parts of a rank's own work, as the verdict names the one that makes its excess.
OWN_WORK = (("data wait", "data_wait_s"), ("batch copy", "copy_s"), ("forward", "forward_s"), ("optimizer", "optimizer_s"))


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


def own_work_s(figures: RankFigures) -> float | None:
    """A rank's own work in a step (``OWN_WORK``'s parts, known ones added), None where none is known."""
    parts = [getattr(figures, name) for _, name in OWN_WORK]
    known = [part for part in parts if part is not None]
    return sum(known) if known else None


@dataclass(frozen=True)
class StragglerVerdict:
    """A rank that straggles for good (or no longer does: ``cleared``): the seconds a step its own work takes more than
    the other ranks' (the median over the window), that as a share of a step (what the run loses: every rank waits
    for it), since which step, and the part of its work that makes most of it."""

    rank: int
    excess_s: float
    step_share: float
    since_step: int
    part: str
    cleared: bool = False


@dataclass
class _History:
    """A rank's last WINDOW gathers: its excess over the others (a fraction, and seconds), each part's excess
    (seconds), the step time, the step."""

    excess: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    excess_s: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    parts: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    step_time_s: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    steps: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    judged: bool = False


class StragglerWatch:
    """Follows every gather of the ranks' figures (rank 0's trainer) and says when a rank becomes a straggler, or stops
    being one (see the module docstring and the constants for the rule)."""

    def __init__(self) -> None:
        self._ranks: dict[int, _History] = {}

    def add(self, step: int, figures: list[RankFigures]) -> list[StragglerVerdict]:
        work = [own_work_s(rank) for rank in figures]
        steps = [rank.step_time_s for rank in figures if rank.step_time_s is not None]
        verdicts = []
        for index, rank in enumerate(figures):
            others = [value for position, value in enumerate(work) if position != index and value is not None]
            if work[index] is None or not others or statistics.median(others) <= 0 or not steps:
                continue
            typical = statistics.median(others)
            history = self._ranks.setdefault(rank.rank, _History())
            history.excess.append(work[index] / typical - 1)
            history.excess_s.append(work[index] - typical)
            history.parts.append({part: _part_excess(figures, index, name) for part, name in OWN_WORK})
            history.step_time_s.append(statistics.median(steps))
            history.steps.append(step)
            verdict = self._judge(rank.rank, history)
            if verdict is not None:
                verdicts.append(verdict)
        return verdicts

    def _judge(self, rank: int, history: _History) -> StragglerVerdict | None:
        if len(history.excess) < WINDOW:
            return None
        median = statistics.median(history.excess)
        spread = statistics.median(abs(value - median) for value in history.excess)
        excess_s, step_s = statistics.median(history.excess_s), statistics.median(history.step_time_s)
        if not history.judged and median >= PERSISTENT_EXCESS and median >= 3 * spread and excess_s >= STRAGGLER_MIN_SHARE * step_s:
            history.judged = True
        elif history.judged and median < CLEARED_EXCESS:
            history.judged = False
        else:
            return None
        return StragglerVerdict(rank, excess_s, excess_s / step_s if step_s > 0 else 0.0, history.steps[0],
                                self._part(history), cleared=not history.judged)

    @staticmethod
    def _part(history: _History) -> str:
        """The part of its work whose median excess over the others' is largest in the window."""
        medians = {part: statistics.median(gather[part] for gather in history.parts) for part, _ in OWN_WORK}
        return max(medians, key=lambda part: medians[part])


def _part_excess(figures: list[RankFigures], index: int, name: str) -> float:
    """A part's seconds on rank ``index`` over the other ranks' median of it (0 where unknown)."""
    return _against_others([getattr(rank, name) for rank in figures], index)[1]
