"""The combination matrix's fast slice (``python -m benchmarks.matrix --fast``, issue 47) as part of the suite: each
cell is real runs of the CLI (and the app, where a cell's event is the app's) with the invariants a user relies on.
A failing cell prints the invariant that broke and the commands to rerun it; ``python -m benchmarks.matrix --all --only
FACTOR=VALUE ...`` (every factor named) reruns that one cell alone. The whole matrix is ``--all`` (benchmarks/README.md).
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.matrix.__main__ import fast_cells
from benchmarks.matrix.cell import run_cell
from benchmarks.matrix.factors import FACTOR_NAMES

CUDA = torch.cuda.is_available()
CELLS = fast_cells(seed=0, cuda=CUDA)


def _name(cell: dict[str, str]) -> str:
    return "-".join(cell[name] for name in FACTOR_NAMES)


@pytest.mark.slow
@pytest.mark.parametrize("cell", CELLS, ids=_name)
def test_a_cell_of_the_fast_slice_keeps_every_invariant(cell):
    verdict = run_cell(cell, CUDA)
    if verdict.outcome.startswith("skipped"):
        pytest.skip(verdict.outcome)
    rerun = "python -m benchmarks.matrix --all " + " ".join(f"--only {name}={cell[name]}" for name in FACTOR_NAMES)
    assert not verdict.failures, "\n".join([*(f"{invariant}: {problem}" for invariant, problem in verdict.failures),
                                            f"rerun: {rerun}", *(f"$ {command}" for command in verdict.commands)])
