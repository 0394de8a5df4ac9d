"""Which module's gradient deserves a look: vanishing, exploding (against the other modules, or against its own
recent past), or non-finite; or its update (‖Δθ‖/‖θ‖ of the last measured step): frozen, or thrashed; and modules grouped by block (``blocks.0``), so that a model with a thousand of
them is read a group at a time and a group is flagged by the same rules.
"""

from __future__ import annotations

import math
import statistics

#: A module whose norm is below this absolute value, or below VANISHING_RATIO x the layer median, is vanishing.
VANISHING_NORM = 1e-7
VANISHING_RATIO = 1e-3
#: A module above EXPLODING_RATIO x the layer median, or RISING_FACTOR x its own recent median, is exploding.
EXPLODING_RATIO = 100.0
RISING_FACTOR = 10.0
#: A step that moves a module's weights by less than this share of their norm (‖Δθ‖/‖θ‖) leaves it as good as
#: frozen; by more, thrashes it. Two decades either side of the healthy ~1e-3 (core/engine/measure/update_probe.py). Frozen
#: only while the other modules learn (below FROZEN_SHARE of the median module's ratio): in a warm-up or at the end
#: of a decay every module's ratio is that small, and none is a layer that stopped.
FROZEN_UPDATE, THRASHED_UPDATE = 1e-5, 1e-1
FROZEN_SHARE = 1e-2


def flag_for(norm: float | None, ratio: float | None, trend: list[float], update_ratio: float | None = None,
             update_share: float | None = None) -> str:
    """Why a module's gradient (or its update) deserves a look: "non-finite", "exploding", "thrashed", "vanishing",
    "frozen", or "". ``update_share``: its update ratio over the median module's."""
    if norm is None:
        return ""
    if not math.isfinite(norm):
        return "non-finite"
    if ratio is not None and ratio > EXPLODING_RATIO:
        return "exploding"
    # Rising fast: against the median of its own recent past, so one earlier spike does not hide the next.
    earlier = [value for value in trend[:-1] if math.isfinite(value)][-8:]
    if len(earlier) >= 3:
        typical = statistics.median(earlier)
        if typical > 0 and norm > RISING_FACTOR * typical:
            return "exploding"
    update = update_flag(update_ratio, update_share)
    if update == "thrashed":
        return update
    if norm < VANISHING_NORM or (ratio is not None and ratio < VANISHING_RATIO):
        return "vanishing"
    return update


def update_flag(update_ratio: float | None, update_share: float | None) -> str:
    """Why a module's update deserves a look: "thrashed", "frozen" (only while the other modules learn:
    ``update_share``, its ratio over the median module's, below ``FROZEN_SHARE``), or "". The gradient table's rule
    and the heatmap's."""
    if update_ratio is None:
        return ""
    if update_ratio > THRASHED_UPDATE:
        return "thrashed"
    if update_ratio < FROZEN_UPDATE and update_share is not None and update_share < FROZEN_SHARE:
        return "frozen"
    return ""


def group_name(module: str) -> str:
    """The group a module belongs to: its name up to the first numeric part (``blocks.0``), else its first part."""
    parts = module.split(".")
    for index, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: index + 1])
    return parts[0]


def combine_norms(norms: list[float | None]) -> float | None:
    """The norm of a group of modules: parameters are disjoint, so squares add."""
    present = [norm for norm in norms if norm is not None]
    if not present:
        return None
    return math.sqrt(sum(norm * norm for norm in present))
