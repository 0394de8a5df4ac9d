"""What torch.compile did, seen while compile is on: graph breaks, recompiles, graphs and compile time.

Dynamo's own reports are what this reads, from torch's structured trace (``torch._logging``: what ``TORCH_TRACE`` and
``tlparse`` read), through a handler on its logger while compile is on, and nothing else of torch's internals:

- a ``dynamo_graph_break_reason`` artifact for each place a compile broke a graph: "Graph break in user code at
  FILE:LINE", Dynamo's title of the reason, its explanation and hints;
- a ``compilation_metrics`` record for each frame compiled: the frame, its ``recompile_reason`` where a guard of its
  earlier graphs failed ("0/0: tensor 'x' size mismatch at index 0. expected 3, actual 5"), its graph's op count.

After the graphs change, the ops a forward runs eagerly between its graphs are counted on the next step that can be
profiled (compile_census.py).

torch makes these records whether or not anyone reads them (its trace logger always has a handler, which writes them
only where ``TORCH_TRACE`` names a folder): the watch's cost is its own handler's time, measured (``watch_s``).

Each break is kept once by place and reason, with the number of compiles that met it; each recompile once by frame
and guard, the recompiles of a frame for one tensor dimension's size as one, with the sizes it took. The watch is made with the first compile (this module imports nothing of torch's compiler before: a run
that never compiles pays nothing) and follows every compile after, until compile is switched off.
"""

from __future__ import annotations

import linecache
import logging
import re
import time
from dataclasses import dataclass
from typing import Any

from torchlab.core.engine.compile_census import EagerOps
from torchlab.core.options import DYNAMIC
from torchlab.core.wire.compile_report import CompileReport, GraphBreak, Recompile

_BREAK_AT = re.compile(r"Graph break in user code at (?P<file>.+):(?P<line>\d+)")
#: The line a break's reason is on: "Graph Break Reason: ..." from torch 2.7, "Reason: Unsupported: ..." in 2.6.
_REASON_LINE = ("Graph Break Reason:", "Reason:")
#: Dynamo's title when a call broke the graph: the reason is the title that follows it.
_GENERIC_TITLE = "Encountered graph break"
#: A guard on a tensor's size: the dimension that changed.
_SIZE_MISMATCH = re.compile(r"tensor '(?P<tensor>[^']+)' size mismatch at index (?P<dim>\d+)"
                            r"(?:\. expected (?P<expected>\d+), actual (?P<actual>\d+))?")
#: A guard's text begins with the graph it guarded: "0/0: ".
_GRAPH_ID = re.compile(r"^\d+/\d+: ")
#: Dynamo's name for the code after a graph break: ``torch_dynamo_resume_in_forward_at_17``.
_RESUMED = re.compile(r"torch_dynamo_resume_in_(?P<function>\w+?)_at_(?P<line>\d+)")
MAX_TEXT_CHARS = 300
#: The first torch whose structured trace says what the watch reads (found in each release's source, 2.4 to 2.13): a
#: graph break's place and reason from 2.6 (Dynamo's explanation and hint with it from 2.7), a recompile's failed
#: guard from 2.7 (before, the frame compiled again is there, not why); the graphs compiled in every one.
BREAKS_FROM, GUARDS_FROM = (2, 6), (2, 7)
_LIVE = f"(a live option, key {DYNAMIC.key})"
#: What the ``dynamic`` live option offers a frame that recompiles for a size, by its value in force.
_DYNAMIC_FIX = {"off": f"{DYNAMIC.name}=auto or on {_LIVE} compiles a changing size once; ",
                "auto": f"{DYNAMIC.name}=on {_LIVE} compiles every size dynamic from the first compile; ",
                "on": ""}


@dataclass
class _Seen:
    """A break or recompile as seen so far (the payload's fields but ``count``), and how often."""

    fields: dict[str, Any]
    count: int = 1
    #: a recompile's tensor dimension whose size failed its guards: (frame, file, line, tensor, dimension)
    dimension: tuple | None = None


class CompileWatch(logging.Handler):
    """Collects what each compile reports (see the module docstring); ``report`` says it, ``news`` whether it moved."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.recompile_limit = 8  # torch's, read as the watch attaches
        self.compile_s = 0.0  # the engine's own measure: the boundary's compile and the steps that compiled again
        self.graphs = 0
        self.watch_s = 0.0
        self.news = False
        self.dynamic = "auto"  #: the ``dynamic`` option the graphs are compiled under
        self.unseen = ""  #: what this torch does not report (``unseen_by``)
        self.sees_breaks = True
        #: what a forward ran eagerly between its graphs, counted on a step after the graphs changed (compile_census.py)
        self.eager: EagerOps | None = None
        self.census_due = False
        self._breaks: dict[tuple, _Seen] = {}
        self._recompiles: dict[tuple, _Seen] = {}
        #: the sizes each tensor dimension whose size failed a guard took, in the order met, by (frame, file, line,
        #: tensor, dimension): a frame's recompiles for one dimension are one entry, "sizes 12, 8, 16"
        self._sizes: dict[tuple, list[str]] = {}

    def attach(self) -> None:
        from torch._dynamo import config
        from torch._logging._internal import trace_log

        self.recompile_limit = int(getattr(config, "recompile_limit", getattr(config, "cache_size_limit", 8)))
        version = torch_version()
        self.unseen, self.sees_breaks = unseen_by(version), version >= BREAKS_FROM
        if self not in trace_log.handlers:
            trace_log.addHandler(self)

    def forget_recompiles(self) -> None:
        """torch's graphs were dropped (another ``dynamic``): the frames' graphs count from none again."""
        self._recompiles.clear()
        self._sizes.clear()
        self.news = True

    def detach(self) -> None:
        from torch._logging._internal import trace_log

        trace_log.removeHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        started = time.perf_counter()
        metadata = getattr(record, "metadata", None)
        if isinstance(metadata, dict):
            artifact = metadata.get("artifact")
            if isinstance(artifact, dict) and artifact.get("name") == "dynamo_graph_break_reason":
                self._on_break(str(getattr(record, "payload", "") or ""))
            elif isinstance(metadata.get("compilation_metrics"), dict):
                self._on_frame(metadata["compilation_metrics"])
        self.watch_s += time.perf_counter() - started

    def _on_break(self, payload: str) -> None:
        where = _BREAK_AT.search(payload)
        if where is None:
            return
        file, line = where["file"], int(where["line"])
        reason, explanation, hint = _break_reason(payload)
        key = (file, line, reason)
        if key in self._breaks:
            self._breaks[key].count += 1
        else:
            self._breaks[key] = _Seen({"file": file, "line": line, "code": linecache.getline(file, line).strip(),
                                       "reason": reason, "explanation": explanation, "hint": hint})
        self.news = True

    def _on_frame(self, metrics: dict[str, Any]) -> None:
        if metrics.get("graph_op_count"):
            self.graphs += 1
            self.news = self.census_due = True
        guard = metrics.get("recompile_reason")
        if not guard:
            return
        guard = _GRAPH_ID.sub("", str(guard).strip().splitlines()[0])[:MAX_TEXT_CHARS]
        frame, file, line = str(metrics.get("co_name")), str(metrics.get("co_filename")), int(metrics.get("co_firstlineno") or 0)
        compiled = int(metrics.get("cache_size") or 0) + 1
        key, dimension = (frame, file, line, guard), None
        size = _SIZE_MISMATCH.search(guard)
        if size is not None:
            key = dimension = (frame, file, line, size["tensor"], size["dim"])
            sizes = self._sizes.setdefault(dimension, [])
            sizes.extend(number for number in (size["expected"], size["actual"]) if number and number not in sizes)
            guard = f"tensor '{size['tensor']}' size mismatch at index {size['dim']}" + (
                f": sizes {', '.join(sizes)}" if sizes else "")
        if key in self._recompiles:
            seen = self._recompiles[key]
            seen.count += 1
            seen.fields["compiled"] = max(seen.fields["compiled"], compiled)
            seen.fields["guard"] = guard
        else:
            self._recompiles[key] = _Seen({"frame": _frame_name(frame), "file": file, "line": line, "guard": guard,
                                           "compiled": compiled}, dimension=dimension)
        self.news = True

    def took_census(self, eager: EagerOps | None, census_s: float) -> None:
        """A step's census of the ops run between graphs (compile_census.py), and what taking it cost."""
        self.eager, self.census_due, self.news = eager, False, True
        self.watch_s += census_s

    def report(self, step: int) -> CompileReport:
        """All of it so far, as the event; ``news`` is cleared."""
        self.news = False
        breaks = sorted(self._breaks.values(), key=lambda seen: -seen.count)
        recompiles = sorted(self._recompiles.values(), key=lambda seen: -seen.count)
        return CompileReport(step=step, compile_s=self.compile_s, graphs=self.graphs,
                             breaks=[GraphBreak(**seen.fields, count=seen.count) for seen in breaks],
                             recompiles=[Recompile(**seen.fields, count=seen.count, hint=self._hint(seen))
                                         for seen in recompiles],
                             recompile_limit=self.recompile_limit, watch_s=self.watch_s, dynamic=self.dynamic,
                             unseen=self.unseen, sees_breaks=self.sees_breaks,
                             eager_ops=self.eager.ops if self.eager is not None else None,
                             graphs_run=self.eager.graphs if self.eager is not None else 0,
                             eager_most=self.eager.most if self.eager is not None else [])

    def _hint(self, seen: _Seen) -> str:
        """What to do of a recompile: where its frame is a recompile from running eagerly, raise the limit; where a
        tensor's dimension took three sizes, compile it dynamic."""
        fields = seen.fields
        if fields["compiled"] >= self.recompile_limit - 1:
            fix = _DYNAMIC_FIX[self.dynamic] if seen.dimension is not None else ""
            return (f"{fields['frame']} has {fields['compiled']} graphs of torch's limit of {self.recompile_limit}: "
                    f"past it, it runs eagerly; {fix}torch._dynamo.config.recompile_limit raises the limit")
        if seen.dimension is None or seen.count < 2:  # a second size: automatic dynamic shapes (dynamic=auto) take it
            return ""
        _, _, _, tensor, dim = seen.dimension
        return (f"dimension {dim} of '{tensor}' took {seen.count + 1} sizes, each compiled: {_DYNAMIC_FIX[self.dynamic]}"
                "torch._dynamo.mark_dynamic on it before the first compile, or padding the batches to a few lengths, "
                "keeps one graph")


def torch_version() -> tuple[int, int]:
    """This torch's major and minor version: ``2.13.0+cpu`` as (2, 13)."""
    import torch

    major, minor = re.match(r"(\d+)\.(\d+)", torch.__version__).groups()
    return int(major), int(minor)


def unseen_by(version: tuple[int, int]) -> str:
    """What a torch of ``version`` does not say to the watch, in a sentence with what does; empty where it says all."""
    named = f"torch {version[0]}.{version[1]}"
    if version < BREAKS_FROM:
        return (f"{named} reports neither its graph breaks nor why it recompiles to the workbench (torch 2.7 does; "
                "TORCH_LOGS=graph_breaks,recompiles prints them to the trainer's log)")
    if version < GUARDS_FROM:
        return (f"{named} reports its graph breaks but not why it recompiles (torch 2.7 does; TORCH_LOGS=recompiles "
                "prints it to the trainer's log)")
    return ""


def _frame_name(code_name: str) -> str:
    """A frame as its code names it; Dynamo's continuation after a graph break as the function and the break's line."""
    resumed = _RESUMED.fullmatch(code_name)
    return f"{resumed['function']} after its break at line {resumed['line']}" if resumed else code_name


def _break_reason(payload: str) -> tuple[str, str, str]:
    """Dynamo's title of a break (the one after its generic title, where a call broke), its first explanation and
    hint, each a line."""
    lines = [line.strip() for line in payload.splitlines() if line.strip()]
    title = next((line.split(":", 1)[1].strip() for line in lines if line.startswith(_REASON_LINE)), "")
    if title.startswith(_GENERIC_TITLE) or not title:
        index = next((i for i, line in enumerate(lines) if line.startswith(_REASON_LINE)), -1)
        title = next((line for line in lines[index + 1:] if not line.startswith(("Explanation:", "Hint:"))), title)
    explanation = next((line.removeprefix("Explanation:").strip() for line in lines if line.startswith("Explanation:")), "")
    hint = next((line.removeprefix("Hint:").strip() for line in lines if line.startswith("Hint:")), "")
    return title[:MAX_TEXT_CHARS], explanation[:MAX_TEXT_CHARS], hint[:MAX_TEXT_CHARS]
