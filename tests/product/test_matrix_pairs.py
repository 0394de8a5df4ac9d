"""The combination matrix's pair generator (benchmarks/matrix/pairs.py): cheap, no training."""

from __future__ import annotations

import itertools

from benchmarks.matrix import pairs, rules
from benchmarks.matrix.__main__ import FORCED, estimated_s
from benchmarks.matrix.factors import FACTORS


def _allowed(cell):
    return rules.feasible(cell, cuda=False)


def test_every_allowed_pair_of_factor_values_is_in_some_cell():
    cells = pairs.generate(FACTORS, 0, _allowed, FORCED)
    covered = set().union(*(pairs.pairs_of(cell, FACTORS) for cell in cells))
    wanted = pairs.all_pairs(FACTORS, _allowed)
    assert wanted <= covered
    every_pair = sum(len(a.values) * len(b.values) for a, b in itertools.combinations(FACTORS, 2))
    assert len(wanted) < every_pair  # the constraints took some out: a refused run is resumed in no cell


def test_the_same_seed_gives_the_same_cells_and_another_seed_others():
    assert pairs.generate(FACTORS, 3, _allowed, FORCED) == pairs.generate(FACTORS, 3, _allowed, FORCED)
    assert pairs.generate(FACTORS, 3, _allowed, FORCED) != pairs.generate(FACTORS, 4, _allowed, FORCED)


def test_the_forced_triples_come_first_in_whole_and_fast_alike():
    cells = pairs.generate(FACTORS, 0, _allowed, FORCED)
    fast = pairs.fast_slice(cells, FACTORS, estimated_s, 180.0, forced=len(FORCED))
    for chosen in (cells, fast):
        for forced, cell in zip(FORCED, chosen):
            assert forced.items() <= cell.items()


def test_no_cell_breaks_a_constraint_and_refused_cells_do_nothing_more():
    cells = pairs.generate(FACTORS, 0, _allowed, FORCED)
    assert all(_allowed(cell) for cell in cells)
    refused = [cell for cell in cells if rules.expected_refusal(cell, cuda=False)]
    assert refused  # fp16 without CUDA, FSDP2 with a parameter two blocks share: each asserted as a refusal
    assert all(cell[factor] == "none" for cell in refused for factor in rules.EVENT_FACTORS)
    assert not rules.expected_refusal({"amp": "fp16"}, cuda=True)


def test_fast_leaves_out_slow_values_and_keeps_to_its_budget():
    cells = pairs.generate(FACTORS, 0, _allowed, FORCED)
    fast = pairs.fast_slice(cells, FACTORS, estimated_s, 180.0, forced=len(FORCED))
    assert not any(cell["compile"] == "on" or cell["live_change"] == "compile" for cell in fast)
    assert sum(map(estimated_s, fast)) <= 180.0


def test_only_narrows_to_the_cells_holding_a_value():
    cells = pairs.generate(FACTORS, 0, _allowed, FORCED)
    narrowed = [cell for cell in cells if pairs.matches(cell, {"model": {"convnet"}, "parallel": {"fsdp2"}})]
    assert narrowed and all(cell["model"] == "convnet" and cell["parallel"] == "fsdp2" for cell in narrowed)
