"""``python -m benchmarks.matrix --all | --fast [--seed S] [--only FACTOR=VALUE ...] [--list]``: the matrix's cells,
each run for real, its factors and verdict printed, then the totals; exit 1 on any failure, 2 on a usage error."""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks.matrix import pairs, rules
from benchmarks.matrix.factors import FACTORS, FACTOR_NAMES

#: The triples a past bug needed (issue 47's first paragraph), run first and kept by --fast (compile off, so that
#: the greedy completion cannot make them slow cells --fast leaves out).
FORCED = (
    {"model": "convnet", "parallel": "fsdp2", "amp": "bf16", "compile": "off"},
    {"live_change": "clip", "run_event": "resume_longer", "figures": "export", "compile": "off"},  # restart x impact
    {"run_event": "resume_longer", "figures": "live_tensorboard", "live_change": "lr_scale", "compile": "off"},
    # the refusal of FSDP2 with a parameter two blocks share, alone (with fp16 too, fp16's refusal would answer)
    {"model": "shared_blocks", "parallel": "fsdp2", "amp": "off", "compile": "off"},
)
#: --fast's target: what the cells' estimated times may add up to, on the 2-core box.
FAST_BUDGET_S = 180.0


def estimated_s(cell: dict[str, str]) -> float:
    """A rough cost of a cell on the 2-core box, for --fast's choice: ranks, resumes and exports cost most."""
    if rules.expected_refusal(cell, cuda=False):
        return 3.0
    cost = {"one": 6.0, "ddp2": 18.0, "fsdp2": 20.0}[cell["parallel"]]
    cost += {"resume_alone": 5.0, "resume_longer": 6.0, "resume_shorter": 3.0, "kill9_resume": 8.0, "stop_resume": 9.0,
             "rank_signal_resume": 9.0,
             "trial": 3.0, "compare": 1.0, "app_detach_attach": 4.0, "app_view": 3.0,
             "app_error_restart": 8.0, "app_what_fits": 10.0}.get(cell["run_event"], 0)
    cost += {"export": 3.0, "live_tensorboard": 2.0}.get(cell["figures"], 0)
    cost += {"hf_trainer": 8.0, "lightning": 4.0}.get(cell["model"], 0)
    cost += 12.0 if cell["live_change"] in ("world_size", "parallel") else 0
    return cost


def fast_cells(seed: int, cuda: bool) -> list[dict[str, str]]:
    """--fast's cells: the forced triples, then the cells covering the most pairs per second within FAST_BUDGET_S (the
    suite runs these too, tests/product/test_matrix_fast.py)."""
    allowed = lambda cell: rules.feasible(cell, cuda)  # noqa: E731
    cells = pairs.generate(FACTORS, seed, allowed, FORCED)
    return pairs.fast_slice(cells, FACTORS, estimated_s, FAST_BUDGET_S, forced=len(FORCED))


def _only(pairs_given: list[str]) -> dict[str, set[str]]:
    only: dict[str, set[str]] = {}
    values = {factor.name: factor.values for factor in FACTORS}
    for given in pairs_given:
        name, _, value = given.partition("=")
        if name not in values or value not in values[name]:
            print(f"python -m benchmarks.matrix: --only {given}: give FACTOR=VALUE, one of: "
                  + "; ".join(f"{n}={'|'.join(v)}" for n, v in values.items()), file=sys.stderr)
            raise SystemExit(2)  # a usage error, as argparse's own
        only.setdefault(name, set()).add(value)
    return only


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.matrix", description=__doc__)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--all", action="store_true", help="every cell: every pair of factor values covered")
    which.add_argument("--fast", action="store_true", help=f"the slice that covers the most pairs in about "
                                                          f"{FAST_BUDGET_S:.0f} s (no compile)")
    parser.add_argument("--seed", type=int, default=0, help="the pair generator's seed (default 0)")
    parser.add_argument("--only", action="append", default=[], metavar="FACTOR=VALUE",
                        help="only the cells with this value (repeatable; two values of one factor: either); "
                             "every factor given once names one cell, run whether the seed generates it or not")
    parser.add_argument("--list", action="store_true", help="print the cells, run none")
    args = parser.parse_args(argv)
    only = _only(args.only)

    import torch  # the constraint hook asks whether fp16 can run here

    cuda = torch.cuda.is_available()
    allowed = lambda cell: rules.feasible(cell, cuda)  # noqa: E731
    cells = fast_cells(args.seed, cuda) if args.fast else pairs.generate(FACTORS, args.seed, allowed, FORCED)
    cells = [cell for cell in cells if pairs.matches(cell, only)]
    if not cells and len(only) == len(FACTORS) and all(len(values) == 1 for values in only.values()):
        cells = [{name: next(iter(only[name])) for name in FACTOR_NAMES}]  # one cell named whole, as a failure printed it
    total_pairs = pairs.all_pairs(FACTORS, allowed)
    print(f"{len(cells)} cells, seed {args.seed}, estimated {sum(map(estimated_s, cells)):.0f} s", flush=True)
    if args.list:
        for cell in cells:
            print(" ".join(f"{name}={cell[name]}" for name in FACTOR_NAMES))
        return 0

    from benchmarks.matrix.cell import run_cell

    started, failed, covered = time.monotonic(), 0, set()
    for index, cell in enumerate(cells, 1):
        verdict = run_cell(cell, cuda)
        if not verdict.outcome.startswith("skipped"):
            covered |= pairs.pairs_of(cell, FACTORS)
        failed += verdict.outcome == "FAILED"
        print(f"[{index}/{len(cells)}] {' '.join(f'{n}={cell[n]}' for n in FACTOR_NAMES)}: {verdict.outcome} "
              f"({verdict.wall_s:.1f} s{'; ' + verdict.landed if verdict.landed else ''})", flush=True)
        for invariant, problem in verdict.failures:
            print(f"    {invariant}: {problem}")
        if verdict.failures:
            for command in verdict.commands:
                print(f"    $ {command}")
    print(f"cells {len(cells)}, pairs covered {len(covered & total_pairs)}/{len(total_pairs)}, failures {failed}, "
          f"wall {time.monotonic() - started:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
