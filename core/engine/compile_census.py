"""The ops of a compiled model that run eagerly, between its graphs: counted on one step after each compile.

A graph break leaves code between two graphs; Dynamo runs the break's own op there (``.item()`` for a data-dependent
branch, a ``print``), and where a frame is resumed the rest compiles again. What is left eager is therefore not the
breaks' count but the ops run between graphs, and the only one that can say which ops those are is the step itself.
So one training step's first forward after the graphs changed runs under torch's autograd profiler (its CPU-only,
legacy form: the ops' names and nesting are all it needs, and kineto's form prints two lines of its own on the terminal
each time), and its events are read by the marks torch puts in every trace: each compiled frame runs inside a
``Torch-Compiled Region`` range, and each compiled graph's forward inside AOTAutograd's ``CompiledFunction``. An aten
op called from no other aten op (a top-level op), inside a compiled region and in no ``CompiledFunction``, ran eagerly
between graphs.

Counted: the forward's ops (backward runs each one's backward again, outside the graphs too); not the loss the
workload computes around the model, nor a frame Dynamo gave up on (past ``recompile_limit``: the watch's recompiles
say so). A torch that marks neither range (a profile with no compiled region), or whose profiler cannot read its own
records back, counts nothing: ``None``, not zero. The step's phases are left out of where the time goes (as a FLOP
count's are); its step time stays among the impact table's, one step of a segment in a median. The profiler's start,
stop and this reading are the watch's cost (``watch_s``).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

#: torch's range around a compiled frame's run ("Torch-Compiled Region: 0/1"), and AOTAutograd's around a graph's
#: forward
COMPILED_REGION, COMPILED_GRAPH = "Torch-Compiled Region", "CompiledFunction"
#: the eager ops named with the count, most run first
NAMED_OPS = 3


@dataclass(frozen=True)
class EagerOps:
    """A forward's ops run eagerly between its graphs (``ops``), the graphs it ran (``graphs``), and the most run of
    those ops with their counts ("aten::_local_scalar_dense x2")."""

    ops: int
    graphs: int
    most: list[str]


def eager_ops(events: Iterable[Any]) -> EagerOps | None:
    """What a profiled forward ran between its graphs (see the module docstring): ``events`` are the profiler's
    (``name``, ``cpu_parent``); None where no compiled region was seen."""
    eager: Counter[str] = Counter()
    graphs, regions = 0, 0
    for event in events:
        ancestors = _ancestors(event)
        if event.name.startswith(COMPILED_REGION):
            regions += 1
        elif event.name == COMPILED_GRAPH:
            graphs += not any(name == COMPILED_GRAPH for name in ancestors)
        elif (event.name.startswith("aten::") and not any(name.startswith("aten::") for name in ancestors)
              and any(name.startswith(COMPILED_REGION) for name in ancestors)
              and not any(name == COMPILED_GRAPH for name in ancestors)):
            eager[event.name] += 1
    if not regions:
        return None
    return EagerOps(ops=sum(eager.values()), graphs=graphs,
                    most=[f"{name} x{count}" for name, count in eager.most_common(NAMED_OPS)])


def _ancestors(event: Any) -> list[str]:
    names, parent = [], event.cpu_parent
    while parent is not None:
        names.append(parent.name)
        parent = parent.cpu_parent
    return names


@contextlib.contextmanager
def census(watch: Any) -> Iterator[None]:
    """Around a step's first forward: the profiler records it, and ``watch`` (the run's CompileWatch)
    takes what it ran eagerly (``took_census``), with the time this took as its own."""
    from torch.autograd.profiler_legacy import profile

    started = time.perf_counter()
    recording = profile()
    recording.__enter__()
    step_started = time.perf_counter()
    try:
        yield
    finally:
        ran_s = time.perf_counter() - step_started
        try:
            recording.__exit__(None, None, None)
            counted = eager_ops(recording.function_events)
        except Exception:  # torch's reading of its own records failed (a range ended on another thread): not counted
            counted = None
    watch.took_census(counted, time.perf_counter() - started - ran_s)
