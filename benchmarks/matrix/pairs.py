"""Seeded, reproducible all-pairs: a list of cells in which every feasible pair of two factors' values appears at
least once, plus forced cells (triples a past bug needed), in a few lines of our own.

Greedy covering (as AETG and allpairspy do it): take an uncovered pair (the seed's choice), then give each other
factor, in a seeded order, the value that covers the most pairs not yet covered with the values already chosen,
among those the constraint hook allows; repeat until no pair is left. Cells come out in the order they were made,
so the first ones cover the most.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Mapping, Sequence

from benchmarks.matrix.factors import Factor

Cell = dict[str, str]
Pair = tuple[tuple[str, str], tuple[str, str]]  # ((factor, value), (factor, value)), factors in FACTORS' order
Allowed = Callable[[Mapping[str, str]], bool]


def pairs_of(cell: Mapping[str, str], factors: Sequence[Factor]) -> set[Pair]:
    """The pairs a (possibly partial) cell covers."""
    chosen = [(factor.name, cell[factor.name]) for factor in factors if factor.name in cell]
    return set(itertools.combinations(chosen, 2))


def all_pairs(factors: Sequence[Factor], allowed: Allowed) -> set[Pair]:
    """Every pair of two factors' values that some allowed cell can hold."""
    pairs: set[Pair] = set()
    for first, second in itertools.combinations(factors, 2):
        for a, b in itertools.product(first.values, second.values):
            if allowed({first.name: a, second.name: b}):
                pairs.add(((first.name, a), (second.name, b)))
    return pairs


def complete(partial: Mapping[str, str], factors: Sequence[Factor], uncovered: set[Pair], allowed: Allowed,
             rng: random.Random) -> Cell:
    """``partial`` with every other factor given the allowed value that covers the most uncovered pairs."""
    cell = dict(partial)
    rest = [factor for factor in factors if factor.name not in cell]
    rng.shuffle(rest)
    for factor in rest:
        def gain(value: str) -> int:
            return len(pairs_of({**cell, factor.name: value}, factors) & uncovered)
        candidates = [value for value in factor.values if allowed({**cell, factor.name: value})]
        if not candidates:
            raise ValueError(f"no value of {factor.name} is allowed with {cell}: the constraints leave this cell empty")
        best = max(gain(value) for value in candidates)
        cell[factor.name] = rng.choice([value for value in candidates if gain(value) == best])
    return {factor.name: cell[factor.name] for factor in factors}


def generate(factors: Sequence[Factor], seed: int, allowed: Allowed,
             forced: Iterable[Mapping[str, str]] = ()) -> list[Cell]:
    """The forced cells (completed), then cells until every allowed pair is covered. The same arguments give the
    same cells, in the same order."""
    rng = random.Random(seed)
    uncovered = all_pairs(factors, allowed)
    cells: list[Cell] = []
    for partial in forced:
        if not allowed(partial):
            raise ValueError(f"the forced cell {dict(partial)} is not allowed by the constraints")
        cells.append(complete(partial, factors, uncovered, allowed, rng))
        uncovered -= pairs_of(cells[-1], factors)
    while uncovered:
        (first, a), (second, b) = rng.choice(sorted(uncovered))
        cells.append(complete({first: a, second: b}, factors, uncovered, allowed, rng))
        uncovered -= pairs_of(cells[-1], factors)
    return cells


def matches(cell: Mapping[str, str], only: Mapping[str, set[str]]) -> bool:
    """Whether a cell has, for each factor ``--only`` names, one of the values given for it."""
    return all(cell[factor] in values for factor, values in only.items())


def fast_slice(cells: Sequence[Cell], factors: Sequence[Factor], cost_s: Callable[[Cell], float],
               budget_s: float, forced: int = 0) -> list[Cell]:
    """The cells to run in a time target: the first ``forced`` (the triples a bug needed) that hold no slow value,
    then, while the estimated time allows, the cell with the most pairs not yet covered per estimated second.
    Cells with a slow value (compile on a CPU: a minute or more) are left out."""
    def quick(cell: Cell) -> bool:
        return not any(cell[factor.name] in factor.slow for factor in factors)

    chosen = [cell for cell in cells[:forced] if quick(cell)]
    covered = set().union(*(pairs_of(cell, factors) for cell in chosen)) if chosen else set()
    spent = sum(cost_s(cell) for cell in chosen)
    pool = [cell for cell in cells[forced:] if quick(cell)]
    while pool:
        best = max(pool, key=lambda cell: len(pairs_of(cell, factors) - covered) / cost_s(cell))
        if not pairs_of(best, factors) - covered:
            break
        pool.remove(best)
        if spent + cost_s(best) > budget_s:
            continue  # a cheaper cell may still fit
        chosen.append(best)
        covered |= pairs_of(best, factors)
        spent += cost_s(best)
    return chosen
