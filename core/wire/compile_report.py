"""What torch.compile did, as the protocol says it (core/engine/compile_watch.py collects it): each graph break and
recompile (``GraphBreak``, ``Recompile``), the ``compile_report`` event that carries them, and its sentence, which
the app's log and a headless run say alike (``events.describe`` calls ``compile_sentence``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from torchlab.core.wire.codec import Message
from torchlab.core.wire.typed_json import JsonObject


@dataclass(frozen=True)
class GraphBreak(JsonObject):
    """Where torch.compile's Dynamo stopped tracing the user's code (core/engine/compile_watch.py): the code from there
    to the next graph runs eagerly. At ``file``:``line`` (``code``, that line), for ``reason`` (Dynamo's title of it:
    "Data-dependent branching"), with its ``explanation`` and its first ``hint``; ``count``: the compiles that broke
    there (a break is met again by each recompile of its frame)."""

    file: str
    line: int
    code: str
    reason: str
    explanation: str = ""
    hint: str = ""
    count: int = 1


@dataclass(frozen=True)
class Recompile(JsonObject):
    """A frame torch.compile compiled again because a guard of its earlier graphs failed (core/engine/compile_watch.py):
    the function ``frame`` at ``file``:``line``, the ``guard`` that failed ("tensor 'x' size mismatch at index 1.
    expected 61, actual 64"), ``count`` times for that guard; ``compiled``: the frame's graphs now, which at
    ``recompile_limit`` (CompileReport's) stop: the frame then runs eagerly. ``hint``: the fix where it is mechanical."""

    frame: str
    file: str
    line: int
    guard: str
    count: int = 1
    compiled: int = 2
    hint: str = ""


@dataclass(frozen=True)
class CompileReport(Message):
    """What torch.compile did with the model so far this process, while compile is on (core/engine/compile_watch.py):
    its graph ``breaks`` (each place once, most met first) and ``recompiles`` (each frame and failed guard once), the
    ``graphs`` compiled, the seconds compiling took (``compile_s``: at the boundary and in steps that compiled again:
    what the impact table leaves out of the step times), and what watching it cost (``watch_s``: the watch's own
    reading of torch's records, inside ``compile_s``, and the profiler of its census of the eager ops).
    ``recompile_limit``: torch's, past which a frame runs eagerly; ``dynamic``: the live option the graphs are compiled
    under (a change of it compiles afresh: the recompiles count from then). ``unseen``: what this torch does not report (graph breaks before 2.6, why a frame recompiled before
    2.7), said with the report. Sent after each compile that changed it."""

    type: ClassVar[str] = "compile_report"
    step: int
    compile_s: float
    graphs: int
    breaks: list[GraphBreak]
    recompiles: list[Recompile]
    recompile_limit: int
    watch_s: float = 0.0
    dynamic: str = "auto"
    unseen: str = ""
    sees_breaks: bool = True  #: False where this torch does not report them (``unseen`` says so): none is not "none"
    #: the ops a forward ran eagerly between its graphs, on a step profiled after the graphs changed
    #: (core/engine/compile_census.py): None until counted, or where this torch marks no compiled region
    eager_ops: int | None = None
    graphs_run: int = 0  #: the graphs that forward ran
    eager_most: list[str] = field(default_factory=list)  #: the eager ops most run, with their counts: "aten::item x2"


def compile_sentence(report: CompileReport) -> str:
    """What torch.compile did so far, in a line a person reads: its graphs and compile time, each graph break's place
    and reason (three at most, most met first), each recompile's frame and failed guard, and the fix where there is one."""
    graphs = f"{report.graphs} graph{'s' if report.graphs != 1 else ''}"
    said = f"torch.compile: {graphs}, {report.compile_s:.1f} s compiling" + (
        f" (dynamic={report.dynamic})" if report.dynamic != "auto" else "")
    if not report.breaks and report.sees_breaks:
        said += "; no graph break"
    else:
        places = "; ".join(f"{short_path(entry.file)}:{entry.line} {entry.reason[:1].lower()}{entry.reason[1:]}"
                           + (f" (`{entry.code}`)" if entry.code else "") for entry in report.breaks[:3])
        more = f" and {len(report.breaks) - 3} more" if len(report.breaks) > 3 else ""
        said += f"; {len(report.breaks)} graph break{'s' if len(report.breaks) != 1 else ''}, where the code between " \
                f"graphs runs eagerly: {places}{more}"
    if report.unseen:
        said += f"; {report.unseen}"
    if report.eager_ops is not None:
        said += f"; {eager_sentence(report)}"
    for entry in report.recompiles[:3]:
        said += (f"; recompiled {entry.frame} ({short_path(entry.file)}:{entry.line}) {entry.count}x for {entry.guard}"
                 + (f": {entry.hint}" if entry.hint else ""))
    return said


def eager_sentence(report: CompileReport) -> str:
    """What a forward ran eagerly between its graphs: "a forward runs 2 graphs and 3 ops eagerly between them
    (aten::_local_scalar_dense x2, ...)"; said once counted (``eager_ops`` not None)."""
    graphs = f"{report.graphs_run} graph{'s' if report.graphs_run != 1 else ''}"
    if not report.eager_ops:
        return f"a forward runs {graphs} and no op eagerly"
    ops = f"{report.eager_ops} op{'s' if report.eager_ops != 1 else ''}"
    return f"a forward runs {graphs} and {ops} eagerly between them ({', '.join(report.eager_most)})"


def short_path(path: str) -> str:
    """A file as a person names it: its last two parts."""
    return "/".join(path.replace("\\", "/").split("/")[-2:])
