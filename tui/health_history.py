"""The recent measured steps' per-module figures, for the heatmap (tui/screens/heatmap_screen.py): each gradient
norm, update-to-weight ratio and weight norm the trainer sent (``GradNorms``, the newest of each batch: a fast run's
columns are the steps that reached the app, each labelled with its own step).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from torchlab.tui.unchecked_numbers import float_or_none

#: The figures a heatmap can show, in the order its key cycles through them.
FIGURES = ("grad norm", "update ratio", "weight norm")
#: Measured steps kept: more than the widest terminal shows.
HISTORY_STEPS = 240


class HealthHistory:
    """``steps`` received, oldest first, and for each of ``FIGURES`` a column of per-module values (None: not
    measured, or not a finite number) per step."""

    def __init__(self) -> None:
        self.steps: deque[int] = deque(maxlen=HISTORY_STEPS)
        self.columns: dict[str, deque[list[float | None]]] = {figure: deque(maxlen=HISTORY_STEPS) for figure in FIGURES}
        self.version = 0

    def clear(self) -> None:
        self.steps.clear()
        for column in self.columns.values():
            column.clear()
        self.version += 1

    def add(self, step: int, modules: int, norms: list[Any], ratios: list[Any] | None, weights: list[Any] | None) -> None:
        """One measured step's figures (each list aligned with the modules, or None where not sent). A step already
        held (a resumed run trains its steps again) replaces it and what came after it."""
        while self.steps and self.steps[-1] >= step:
            self.steps.pop()
            for column in self.columns.values():
                column.pop()
        self.steps.append(step)
        for figure, column in zip(FIGURES, _columns(modules, norms, ratios, weights)):
            self.columns[figure].append(column)
        self.version += 1

    def put_before(self, modules: int, earlier: list[tuple[int, list[Any], list[Any] | None, list[Any] | None]]) -> None:
        """Steps from before the first held, oldest first, each as ``add`` takes one: a run's journal, read where
        the app attached to it or it resumed (its trainer sends only what it measures from then on)."""
        first = self.steps[0] if self.steps else math.inf
        earlier = [entry for entry in earlier if entry[0] < first]
        if not earlier:
            return
        taken = [_columns(modules, *values) for _, *values in earlier]
        self.steps = deque([step for step, *_ in earlier] + list(self.steps), maxlen=HISTORY_STEPS)  # the newest kept
        for index, figure in enumerate(FIGURES):
            held = self.columns[figure]
            self.columns[figure] = deque([columns[index] for columns in taken] + list(held), maxlen=HISTORY_STEPS)
        self.version += 1

    def has(self, figure: str) -> bool:
        """Whether any step held has a value of ``figure``."""
        return any(value is not None for column in self.columns[figure] for value in column)


def _columns(modules: int, *figures: list[Any] | None) -> list[list[float | None]]:
    """Each figure's values for one step, finite numbers or None, aligned with the ``modules`` (all None where a
    figure was not sent, or not for as many modules)."""
    return [[_finite(value) for value in values] if isinstance(values, list) and len(values) == modules else [None] * modules
            for values in figures]


def _finite(value: Any) -> float | None:
    number = float_or_none(value)
    return number if number is not None and math.isfinite(number) else None
