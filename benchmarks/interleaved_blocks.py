"""Blocks of a loop that owns its steps (Lightning's ``fit``, transformers' ``train``) timed against blocks of other
runners run between them, from a callback inside that loop: drift on the machine hits every runner alike.

The host loop's callback calls ``at_step(steps)`` after each of its optimizer steps; every ``block`` steps (past
``warmup``) it times the host's block, then runs one block of each other runner (``train_steps(block)``) in a
shuffled order, each timed between two device synchronisations. ``table`` gives each runner's ms a step and its
throughput against one runner's, median and IQR over the rounds.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable


class InterleavedBlocks:
    def __init__(self, host: str, others: dict, block: int, warmup: int, synchronize: Callable[[], None]) -> None:
        self.host, self.others, self.block, self.warmup, self.synchronize = host, others, block, warmup, synchronize
        self.times: dict[str, list[float]] = {name: [] for name in [host, *others]}
        self.started = 0.0

    def at_step(self, steps: int) -> None:
        if steps < self.warmup or (steps - self.warmup) % self.block:
            return
        self.synchronize()
        if steps > self.warmup:
            self.times[self.host].append(time.perf_counter() - self.started)
        order = list(self.others)
        random.shuffle(order)
        for name in order:
            self.synchronize()
            started = time.perf_counter()
            self.others[name].train_steps(self.block)
            self.synchronize()
            self.times[name].append(time.perf_counter() - started)
        self.synchronize()
        self.started = time.perf_counter()

    @property
    def rounds(self) -> int:
        return min(len(series) for series in self.times.values())

    def table(self, names: list[str], against: str, label: str) -> dict[str, dict]:
        """Each runner's figures against ``against``'s in the same rounds, printed as a table and returned."""
        rounds = self.rounds
        base = self.times[against][:rounds]
        print(f"\n{'runner':<14} {'ms/step':>9} {f'throughput vs {label}':>27} {'IQR':>15}")
        figures = {}
        for name in names:
            series = self.times[name][:rounds]
            ratios = sorted(b / t for b, t in zip(base, series))
            figures[name] = {
                "ms_per_step": 1000 * statistics.median(series) / self.block,
                f"vs_{against}": statistics.median(ratios),
                "iqr": [ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]],
            }
            low, high = figures[name]["iqr"]
            print(f"{name:<14} {figures[name]['ms_per_step']:>9.2f} {figures[name][f'vs_{against}']:>27.3f} "
                  f"{f'{low:.3f}–{high:.3f}':>15}")
        return figures
