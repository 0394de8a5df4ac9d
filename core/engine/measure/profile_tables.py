"""Profiler tables built from a snapshot's ``trace.json``, in a process of their own.

``torch.profiler``'s ``key_averages()`` first turns every recorded event into a Python object; for
five steps of tiny_gpt (20k ops) that took 3.2 s, and done on a thread of the trainer it held the GIL
long enough to slow the training steps beside it 6x. The Chrome trace holds the same facts (each op's
thread, start, duration and input shapes; each allocation; each kernel with the op that launched it),
so the tables are built from it here, in a child process the trainer waits on without holding the GIL:

    python -m torchlab.core.engine.measure.profile_tables DIR     # reads DIR/trace.json, writes the tables beside it

Per op: calls; self and total CPU time (total minus the ops nested inside it, per thread); self and
total device time (kernels, memcpys and memsets launched from it, and from the ops inside it);
self CPU and device memory (bytes allocated minus freed while it was the innermost op). Rows are
grouped by name (``ProfilerStep#3`` counts as ``ProfilerStep*``, as in ``key_averages``), and by name
and input shapes. Standard library only: no torch in this process.

With ranks (DDP, FSDP2), also how much of the profiled steps' time communication ran
(``communication_time``): the union of the collectives' intervals within the ``ProfilerStep#N`` ranges,
in all and per kind of collective. On a GPU these are NCCL's kernels, which may overlap compute: it is the
time communication ran, not the time a step waited for it. On the CPU they are gloo's ``gloo:<op>``
ranges, which run on gloo's own threads while the training thread waits for them or goes on beside them.

Writes ``table.txt`` and ``table_by_shape.txt`` (the top rows), ``table.csv`` and
``table_by_shape.csv`` (every row), and prints one JSON object: ``{"rows": [...top rows by name...], "rows_by_shape": [...], "sort": COLUMN,
"communication": {...} or null}``.
"""

from __future__ import annotations

import csv
import io
import json
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchlab.core.records.storage import replace_file
from torchlab.core.safe_open import read_regular_bytes

COLUMNS = (
    "name", "input_shapes", "calls", "self_cpu_us", "cpu_total_us", "self_device_us", "device_total_us",
    "self_cpu_memory_bytes", "self_device_memory_bytes",
)
TOP_ROWS = 50
#: The exit status of a run that could not write a table (a full disk); stdout then says why, as JSON.
EXIT_STORAGE = 3
TEXT_ROWS = 100
#: Trace categories that are ranges on a CPU thread (ops, and ``record_function`` annotations).
_CPU_RANGES = ("cpu_op", "user_annotation")
#: Trace categories that run on the device, each linked to the op that launched it by "External id".
_DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")
_CUDA_DEVICE_TYPE = 1
_STEP_NAME = re.compile(r"^ProfilerStep#\d+$")
#: NCCL's collective kernels name their kind: ``ncclDevKernel_AllGather_RING_LL``, ``ncclKernel_AllReduce_RING_LL_Sum_float``.
_NCCL_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)(?:_|$)")
_NCCL_KINDS = frozenset({"AllGather", "ReduceScatter", "AllReduce", "Broadcast", "Reduce", "SendRecv"})
#: ProcessGroupGloo runs each collective inside a ``record_function`` range named ``gloo:all_gather`` and so on.
_GLOO_PREFIX = "gloo:"


@dataclass
class _Op:
    name: str
    shapes: str
    start: float
    end: float
    external_id: Any
    parent: _Op | None = None
    child_cpu_us: float = 0.0
    self_device_us: float = 0.0
    device_total_us: float = 0.0
    cpu_memory: int = 0
    device_memory: int = 0
    children: list[_Op] = field(default_factory=list)
    merged_into: _Op | None = None

    @property
    def cpu_total_us(self) -> float:
        return self.end - self.start

    def counted(self) -> _Op:
        """The op whose row this one's figures go to (itself, or the same-named op it was folded into)."""
        op = self
        while op.merged_into is not None:
            op = op.merged_into
        return op


def build_tables(trace: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """Rows by op name and by op name and input shapes (every op), and the column they are sorted by."""
    events = trace.get("traceEvents") or []
    ops = _nest_ops(events)
    unowned = _add_memory(events, ops)
    if unowned:  # allocations outside every op: one "[memory]" row, as key_averages shows them
        ops[("[memory]", None)] = unowned
    has_device = _add_device_time(events, ops)
    sort = "self_device_us" if has_device else "self_cpu_us"
    return _aggregate(ops, by_shape=False, sort=sort), _aggregate(ops, by_shape=True, sort=sort), sort


def _nest_ops(events: list[dict[str, Any]]) -> dict[tuple[Any, Any], list[_Op]]:
    """Every CPU range, per thread in start order, each knowing the innermost range around it."""
    threads: dict[tuple[Any, Any], list[_Op]] = defaultdict(list)
    for event in events:
        if event.get("ph") != "X" or event.get("cat") not in _CPU_RANGES:
            continue
        args = event.get("args") or {}
        start = float(event["ts"])
        name = str(event.get("name", "?"))
        threads[(event.get("pid"), event.get("tid"))].append(_Op(
            name="ProfilerStep*" if _STEP_NAME.match(name) else name,
            shapes=str(args.get("Input Dims", [])),
            start=start,
            end=start + float(event.get("dur", 0.0)),
            external_id=args.get("External id"),
        ))
    for ops in threads.values():
        ops.sort(key=lambda op: (op.start, -op.end))  # a parent before the child that starts with it
        open_ops: list[_Op] = []
        for op in ops:
            while open_ops and open_ops[-1].end <= op.start:
                open_ops.pop()
            if open_ops:
                parent = open_ops[-1]
                op.parent = parent
                parent.children.append(op)
                parent.child_cpu_us += op.cpu_total_us
            open_ops.append(op)
        _fold_same_name_children(ops)
    return threads


def _fold_same_name_children(ops: list[_Op]) -> None:
    """An op whose only child has its own name (``aten::mul`` calling ``aten::mul``) counts once.

    ``key_averages`` does the same, so the calls column means calls made, not dispatcher layers.
    """
    for op in reversed(ops):  # the innermost first, so a chain of three folds into its top
        parent = op.parent
        if parent is not None and parent.name == op.name and len(parent.children) == 1:
            op.merged_into = parent
            parent.children = op.children
            parent.child_cpu_us = op.child_cpu_us
            for child in op.children:
                child.parent = parent


def _add_memory(events: list[dict[str, Any]], threads: dict[tuple[Any, Any], list[_Op]]) -> list[_Op]:
    """Each allocation (or free: negative bytes) to the innermost op running on its thread at that time.

    Returns the allocations made outside every op, each as a zero-length "[memory]" op.
    """
    unowned: list[_Op] = []
    allocations: dict[tuple[Any, Any], list[tuple[float, int, bool]]] = defaultdict(list)
    for event in events:
        if event.get("name") != "[memory]":
            continue
        args = event.get("args") or {}
        allocations[(event.get("pid"), event.get("tid"))].append(
            (float(event["ts"]), int(args.get("Bytes", 0)), args.get("Device Type") == _CUDA_DEVICE_TYPE)
        )
    for thread, records in allocations.items():
        ops = threads.get(thread, [])
        records.sort()
        open_ops: list[_Op] = []
        next_op = 0
        for time, size, on_device in records:
            while next_op < len(ops) and ops[next_op].start <= time:
                while open_ops and open_ops[-1].end <= ops[next_op].start:
                    open_ops.pop()
                open_ops.append(ops[next_op])
                next_op += 1
            while open_ops and open_ops[-1].end < time:
                open_ops.pop()
            if open_ops:
                owner = open_ops[-1].counted()
            else:
                owner = _Op(name="[memory]", shapes="[]", start=time, end=time, external_id=None)
                unowned.append(owner)
            if on_device:
                owner.device_memory += size
            else:
                owner.cpu_memory += size
    return unowned


def _add_device_time(events: list[dict[str, Any]], threads: dict[tuple[Any, Any], list[_Op]]) -> bool:
    """Device work to the op that launched it, and up through the ops around that one; False if none."""
    by_id = {op.external_id: op for ops in threads.values() for op in ops if op.external_id is not None}
    found = False
    for event in events:
        if event.get("ph") != "X" or event.get("cat") not in _DEVICE_WORK:
            continue
        found = True
        op = by_id.get((event.get("args") or {}).get("External id"))
        if op is None:
            continue
        op = op.counted()
        duration = float(event.get("dur", 0.0))
        op.self_device_us += duration
        while op is not None:
            op.device_total_us += duration
            op = op.parent
    return found


def _aggregate(threads: dict[tuple[Any, Any], list[_Op]], *, by_shape: bool, sort: str) -> list[dict[str, Any]]:
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for ops in threads.values():
        for op in ops:
            if op.merged_into is not None:
                continue
            key = (op.name, op.shapes if by_shape else "")
            row = rows.get(key)
            if row is None:
                row = rows[key] = dict.fromkeys(COLUMNS, 0)
                row["name"], row["input_shapes"] = key
            row["calls"] += 1
            row["self_cpu_us"] += op.cpu_total_us - op.child_cpu_us
            row["cpu_total_us"] += op.cpu_total_us
            row["self_device_us"] += op.self_device_us
            row["device_total_us"] += op.device_total_us
            row["self_cpu_memory_bytes"] += op.cpu_memory
            row["self_device_memory_bytes"] += op.device_memory
    for row in rows.values():
        for column in ("self_cpu_us", "cpu_total_us", "self_device_us", "device_total_us"):
            row[column] = round(row[column], 3)
    return sorted(rows.values(), key=lambda row: -row[sort])


def communication_time(trace: dict[str, Any]) -> dict[str, Any] | None:
    """How long collectives ran within the profiled steps, or None where the trace has none (a single process).

    ``{"steps_us": S, "us": C, "share": C / S, "by_kind": [{"kind": K, "us": T}, ...] largest first, "source": ...}``
    (the fields of core/wire/communication.py's ``CommunicationShare``). Each
    time is a union of intervals, clipped to the ``ProfilerStep#N`` ranges: two gloo threads working at once, or
    a collective inside another, count once. The source is NCCL's kernels where the trace has any kernel (a GPU
    run), else gloo's ranges. A GPU's kernels may overlap compute, and gloo works on threads of its own: this is
    the time communication ran, not the time a step waited for it.
    """
    events = trace.get("traceEvents") or []
    steps = _union([_interval(event) for event in events
                    if _is_range(event, _CPU_RANGES) and _STEP_NAME.match(str(event.get("name", "")))])
    on_device = any(_is_range(event, ("kernel",)) for event in events)
    intervals_by_kind: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for event in events:
        kind = _collective_kind(event, on_device)
        if kind is not None:
            intervals_by_kind[kind].append(_interval(event))
    steps_us = _length(steps)
    if not steps_us or not intervals_by_kind:
        return None
    within_steps = {kind: _intersect(_union(intervals), steps) for kind, intervals in intervals_by_kind.items()}
    communication_us = _length(_union([interval for intervals in within_steps.values() for interval in intervals]))
    by_kind = sorted(((kind, round(_length(intervals), 3)) for kind, intervals in within_steps.items() if intervals),
                     key=lambda pair: -pair[1])  # a kind that ran only outside the steps is not one of theirs
    return {
        "steps_us": round(steps_us, 3), "us": round(communication_us, 3), "share": round(communication_us / steps_us, 4),
        "by_kind": [{"kind": kind, "us": us} for kind, us in by_kind], "source": "nccl kernels" if on_device else "gloo",
    }


def _collective_kind(event: dict[str, Any], on_device: bool) -> str | None:
    """The kind of collective ``event`` is (``all_gather``, ``AllGather``), or None if it is none."""
    name = str(event.get("name", ""))
    if on_device:
        if not (_is_range(event, ("kernel",)) and name.startswith("nccl")):
            return None
        match = _NCCL_KERNEL.match(name)
        return match.group(1) if match and match.group(1) in _NCCL_KINDS else name  # an unknown one by its full name
    if _is_range(event, ("user_annotation",)) and name.startswith(_GLOO_PREFIX):
        return name.removeprefix(_GLOO_PREFIX)
    return None


def _is_range(event: dict[str, Any], categories: tuple[str, ...]) -> bool:
    return event.get("ph") == "X" and event.get("cat") in categories


def _interval(event: dict[str, Any]) -> tuple[float, float]:
    start = float(event["ts"])
    return start, start + float(event.get("dur", 0.0))


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The intervals merged where they overlap or touch, in order."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _intersect(first: list[tuple[float, float]], second: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The parts of two merged, ordered interval lists that lie in both."""
    common: list[tuple[float, float]] = []
    i = j = 0
    while i < len(first) and j < len(second):
        start, end = max(first[i][0], second[j][0]), min(first[i][1], second[j][1])
        if start < end:
            common.append((start, end))
        if first[i][1] < second[j][1]:
            i += 1
        else:
            j += 1
    return common


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def format_table(rows: list[dict[str, Any]], limit: int = TEXT_ROWS) -> str:
    """A fixed-width text table of the first ``limit`` rows, times in ms, memory in MiB."""
    headers = ("Name", "Input shapes", "Calls", "Self CPU ms", "CPU total ms", "Self device ms",
               "Device total ms", "Self CPU MiB", "Self device MiB")
    lines = []
    for row in rows[:limit]:
        lines.append((
            row["name"], row["input_shapes"], str(row["calls"]),
            *(f"{row[column] / 1000:.3f}" for column in ("self_cpu_us", "cpu_total_us", "self_device_us", "device_total_us")),
            *(f"{row[column] / 2**20:.2f}" for column in ("self_cpu_memory_bytes", "self_device_memory_bytes")),
        ))
    keep = [index for index in range(len(headers)) if index != 1 or any(line[1] for line in lines)]
    widths = [min(60, max([len(headers[i])] + [len(line[i]) for line in lines])) for i in keep]

    def render(cells: tuple[str, ...]) -> str:
        out = []
        for width, i in zip(widths, keep):
            text = cells[i] if len(cells[i]) <= width else cells[i][: width - 1] + "…"
            out.append(text.ljust(width) if i in (0, 1) else text.rjust(width))
        return "  ".join(out).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([render(headers), rule, *(render(line) for line in lines)]) + "\n"


def write_tables(directory: Path) -> dict[str, Any]:
    """Read ``directory/trace.json``, write the tables beside it, return the top rows.

    Each table replaces its file whole (temporary file, rename); an OSError (a full disk) propagates.
    """
    trace = json.loads(read_regular_bytes(directory / "trace.json"))  # no link, no FIFO (core/safe_open.py)
    rows, rows_by_shape, sort = build_tables(trace)
    replace_file(directory / "table.txt", format_table(rows).encode("utf-8"))
    replace_file(directory / "table_by_shape.txt", format_table(rows_by_shape).encode("utf-8"))
    for name, table in (("table.csv", rows), ("table_by_shape.csv", rows_by_shape)):
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(table)
        replace_file(directory / name, text.getvalue().encode("utf-8"))
    return {"rows": rows[:TOP_ROWS], "rows_by_shape": rows_by_shape[:TOP_ROWS], "sort": sort,
            "communication": communication_time(trace)}


def main(argv: list[str] | None = None) -> int:
    """Print the top rows as JSON; or, when a table could not be written, the failure as JSON
    (``{"errno": ..., "strerror": ..., "file": ...}``) and exit with ``EXIT_STORAGE``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m torchlab.core.engine.measure.profile_tables DIR  (DIR holds trace.json)", file=sys.stderr)
        return 2
    try:
        result = write_tables(Path(args[0]))
    except OSError as error:  # the trainer words the message: it knows which profile this is
        print(json.dumps({"errno": error.errno, "strerror": error.strerror or str(error), "file": error.filename}))
        return EXIT_STORAGE
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
