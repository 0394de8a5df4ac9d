"""What the matrix knows before it runs a cell: the combinations refused by design (the expected outcome is a refusal
before anything is spent, with one paragraph naming the reason, which cell.py asserts), and the combinations that
are no test at all (a refused run cannot also be resumed or exported: such a pair would be "covered" by a cell that
checks nothing about it).

Each rule reads a cell that may be partial (``.get``): the pair generator asks about pairs and half-built cells.
"""

from __future__ import annotations

from collections.abc import Mapping

from benchmarks.matrix.factors import APP_EVENTS

#: The factors whose first value means "nothing happens besides training": a refused cell keeps them there.
EVENT_FACTORS = ("live_change", "run_event", "figures")


def expected_refusal(cell: Mapping[str, str], cuda: bool) -> str | None:
    """Why this combination must be refused at its start (a word the refusal's paragraph names), or None."""
    if cell.get("amp") == "fp16" and not cuda:
        return "fp16"  # fp16 autocast and its GradScaler need CUDA
    if cell.get("model") == "shared_blocks" and cell.get("parallel") == "fsdp2":
        return "fsdp"  # FSDP2 cannot shard a parameter two checkpoint blocks share (core/engine/parallel/sharding.py)
    return None


def feasible(cell: Mapping[str, str], cuda: bool) -> bool:
    """False where the (partial) cell is no test: refused by design and yet asked to do more than start; or a
    split scripted at the first boundary on the small device: the first forward sets that device's limit, so any
    split there runs out of memory, and with ranks the rescue starts them again from step 1, where the script sets
    the split back: a stop by design (README, "OOM rescue": a rung that does not hold stops the run); and the OOM
    rescue turned off there, before the first step runs out of memory: a stop by design too; and a world size
    changed there, which changes what one forward takes before the device's limit is met (no rescue to check)."""
    if (cell.get("device") == "half_batch" and cell.get("live_change") in ("split", "oom_rescue", "world_size")
            and cell.get("run_event", "none") in APP_EVENTS):
        return False
    if cell.get("live_change") == "pin_memory" and cell.get("run_event") == "app_error_restart" and not cuda:
        return False  # set on the error screen, a CPU's restart refuses it at its start: tests/process/test_ranks.py
    if expected_refusal(cell, cuda) is None:
        return True
    return all(cell.get(factor, "none") == "none" for factor in EVENT_FACTORS)
