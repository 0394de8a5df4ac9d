"""torch.compile, seen (core/engine/compile_watch.py): each graph break at the user's file and line with Dynamo's
reason, each recompile with the guard that failed, the graphs and the compile time, from torch's structured trace
while compile is on; a run that never compiles imports none of it."""

from __future__ import annotations

import logging
import re
import subprocess
import sys

import pytest
from trainers import TINY, WORKLOADS, make_trainer
from torchlab.core.engine.compile_watch import BREAKS_FROM, CompileWatch, unseen_by
from torchlab.core.wire.compile_report import CompileReport, compile_sentence
from torchlab.core.wire.events import describe

TINY_FILE = WORKLOADS / "tiny.py"
#: What the watch reads is Dynamo's: the breaks, guards and recompiles of any backend (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("dynamo_only")


def report_of(event: dict) -> CompileReport:
    return CompileReport(**{key: value for key, value in event.items() if key not in ("event", "time")})


def last_report(seen) -> CompileReport:
    return report_of(seen.of("compile_report")[-1])


def test_a_data_dependent_branch_and_a_print_are_two_graph_breaks_at_their_lines():
    trainer, seen = make_trainer(f"{TINY_FILE}:graph_breaks", steps=6, options={"compile": "on"})
    assert trainer.run().status == "finished"
    report = last_report(seen)
    marked = [number for number, line in enumerate(TINY_FILE.read_text().splitlines(), 1) if "# BREAK" in line]
    assert [(entry.file, entry.line) for entry in report.breaks] == [(str(TINY_FILE), line) for line in marked]
    branch, printed = report.breaks
    assert branch.reason == "Data-dependent branching" and branch.code.startswith("if h.mean() > 0.5:")
    assert "print" in printed.explanation and printed.code.startswith("print(")
    assert report.graphs >= 2 and report.compile_s > 0 and report.recompiles == []
    said = describe(report)
    assert said.warning and "2 graph breaks" in said.text and f"workloads/tiny.py:{marked[0]} data-dependent branching" in said.text
    # Between the graphs, eagerly: the branch's test of its condition (Dynamo resumes the rest in graphs of their own)
    assert report.eager_ops == 1 and report.eager_most == ["aten::is_nonzero x1"] and report.graphs_run == report.graphs
    assert f"a forward runs {report.graphs} graphs and 1 op eagerly between them (aten::is_nonzero x1)" in said.text
    assert report.step == 1  # counted on the first step after the boundary's compile


def test_three_sequence_lengths_recompile_and_the_failed_guard_is_named():
    trainer, seen = make_trainer(f"{TINY_FILE}:three_lengths", steps=10, options={"compile": "on"})
    assert trainer.run().status == "finished"
    report = last_report(seen)
    [recompile] = report.recompiles  # the second length: the dimension is dynamic from then on (automatic dynamic)
    assert recompile.frame == "forward" and recompile.file == str(TINY_FILE) and recompile.compiled == 2
    assert re.fullmatch(r"tensor 'tokens' size mismatch at index 1: sizes \d+, \d+", recompile.guard)
    assert report.breaks == [] and report.recompile_limit >= 2
    assert "recompiled forward (workloads/tiny.py:" in compile_sentence(report)


def test_a_model_that_compiles_cleanly_has_no_break_and_is_said_so_once():
    trainer, seen = make_trainer(TINY, steps=6, options={"compile": "on"})
    assert trainer.run().status == "finished"
    first, counted = seen.of("compile_report")  # at the boundary's compile (no step compiled again), and counted after
    assert first["breaks"] == [] and first["recompiles"] == [] and first["graphs"] >= 1 and first["eager_ops"] is None
    report = last_report(seen)
    assert report.eager_ops == 0 and report.eager_most == [] and report.graphs_run == 1
    said = describe(report)
    assert not said.warning and "no graph break" in said.text and "a forward runs 1 graph and no op eagerly" in said.text


def test_a_run_that_never_compiles_imports_no_watch_and_writes_no_trace():
    """Compile off: the watch is not imported, nor its handler on torch's structured trace (torch's own, which writes
    nothing without TORCH_TRACE, is there in any process; torch's own optimizers import torch._dynamo, whatever the
    run does)."""
    script = (f"import sys; sys.path[:0] = {[str(WORKLOADS.parent / 'helpers'), str(WORKLOADS.parent)]!r}\n"
              "from trainers import make_trainer\n"
              "trainer, _ = make_trainer(steps=3)\n"
              "trainer.run()\n"
              "from torch._logging._internal import trace_log\n"
              "print(any(name in sys.modules for name in ('torchlab.core.engine.compile_watch', 'torchlab.core.engine.compile_census')), "
              "[type(h).__name__ for h in trace_log.handlers])")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False ['LazyTraceHandler']"  # torch's own, which writes nothing


def test_switching_compile_off_stops_the_watch():
    from torch._logging._internal import trace_log

    trainer, seen = make_trainer(TINY, steps=6, options={"compile": "on"}, at=["4:compile=off"])
    assert trainer.run().status == "finished"
    assert trainer.parts.model.compile_watch is not None and trainer.parts.model.compile_watch not in trace_log.handlers


def test_static_shapes_near_torchs_recompile_limit_are_named_and_dynamic_switched_on_live_compiles_once(monkeypatch):
    """``dynamic=off`` (a graph for each size) and a limit of 3 graphs a frame: each new length recompiles, and the
    frame one graph short of the limit is said to run eagerly past it, with the live option and the setting that would
    keep it compiled. ``dynamic=on`` typed at step 8 compiles afresh at that boundary: torch's graphs of each size are
    forgotten (their guards would pass again) and one graph takes every length after it."""
    import torch._dynamo

    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 3)
    trainer, seen = make_trainer(f"{TINY_FILE}:three_lengths", steps=12, options={"compile": "on", "dynamic": "off"},
                                 at=["8:dynamic=on"])
    try:
        assert trainer.run().status == "finished"
    finally:  # a code object past the limit runs eagerly for the rest of the process: the tests after this one compile
        torch._dynamo.reset()
    reports = [report_of(event) for event in seen.of("compile_report")]
    static = [report for report in reports if report.dynamic == "off"][-1]
    [nearest] = [entry for entry in static.recompiles if entry.frame == "forward"]  # one dimension: one entry
    assert static.recompile_limit == 3 and nearest.count == 2  # the three lengths by step 6: two recompiles
    assert nearest.guard == "tensor 'tokens' size mismatch at index 1: sizes 12, 8, 16"
    assert nearest.compiled == 3  # at the limit: the next length would run eagerly
    assert "runs eagerly" in nearest.hint and "torch._dynamo.config.recompile_limit" in nearest.hint
    assert "dynamic=auto or on (a live option, key Y)" in nearest.hint
    [applied] = [event for event in seen.of("option_applied") if event["option"] == "dynamic"]
    assert applied["step"] == 8 and applied["detail"].startswith("compiled with dynamic=on in ")
    assert reports[-1].dynamic == "on" and reports[-1].recompiles == []  # lengths 16, 12 and 8 after it: one graph
    assert "(dynamic=on)" in compile_sentence(reports[-1])


def _recompiled(frame: str, guard: str, cache_size: int) -> logging.LogRecord:
    record = logging.LogRecord("torch.__trace", logging.DEBUG, __file__, 1, "", None, None)
    record.metadata = {"compilation_metrics": {"co_name": frame, "co_filename": "model.py", "co_firstlineno": 10,
                                               "cache_size": cache_size, "graph_op_count": 5,
                                               "recompile_reason": f"0/{cache_size - 1}: {guard}"}}
    return record


def test_a_dimension_that_took_three_sizes_is_one_recompile_offered_the_live_setting_that_compiles_it_once():
    """A frame's recompiles for one tensor dimension are one entry (each size's guard text, "expected 12, actual 8",
    differs), with the sizes it took; at a third size, the ``dynamic`` option in force says which of its values
    compiles it once."""
    watch = CompileWatch()
    watch.emit(_recompiled("forward", "tensor 'tokens' size mismatch at index 1. expected 12, actual 8", 1))
    assert watch.report(3).recompiles[0].hint == ""  # a second size: automatic dynamic shapes may take it
    watch.dynamic = "off"
    watch.emit(_recompiled("forward", "tensor 'tokens' size mismatch at index 1. expected 12, actual 16", 2))
    [entry] = watch.report(5).recompiles
    assert (entry.guard, entry.count) == ("tensor 'tokens' size mismatch at index 1: sizes 12, 8, 16", 2)
    assert entry.hint.startswith("dimension 1 of 'tokens' took 3 sizes, each compiled: dynamic=auto or on")
    watch.dynamic = "on"
    assert "dynamic=" not in watch.report(5).recompiles[0].hint and "mark_dynamic" in watch.report(5).recompiles[0].hint
    watch.forget_recompiles()  # another dynamic: torch's graphs were dropped
    assert watch.report(9).recompiles == []


def _broke(payload: str) -> logging.LogRecord:
    record = logging.LogRecord("torch.__trace", logging.DEBUG, __file__, 1, "", None, None)
    record.metadata, record.payload = {"artifact": {"name": "dynamo_graph_break_reason", "encoding": "string"}}, payload
    return record


#: A graph break's record as each torch release writes it (torch/_dynamo/symbolic_convert.py's ``log_graph_break`` and
#: exc.py's ``format_graph_break_message`` in each release's source): 2.6 names the reason on a "Reason:" line, 2.7 to
#: 2.12 on "Graph Break Reason:" with Dynamo's explanation and hint indented under it (2.13 is the real one, above).
BREAK_RECORDS = {
    (2, 6): ("Graph break in user code at /home/u/model.py:17\nReason: Unsupported: generic_jump TensorVariable()\n"
             "User code traceback:\n  File \"/home/u/model.py\", line 17, in forward\n    if h.mean() > 0:\n",
             "Unsupported: generic_jump TensorVariable()", ""),
    (2, 7): ("Graph break in user code at /home/u/model.py:17\nGraph Break Reason: Data-dependent branching\n"
             "  Explanation: Detected data-dependent branching (e.g. `if my_tensor.sum() > 0:`). Dynamo does not support "
             "tracing dynamic control flow.\n  Hint: This graph break is fundamental - it is unlikely that Dynamo will "
             "ever be able to trace through your code. Consider finding a workaround.\n  Hint: Use `torch.cond` to "
             "express dynamic control flow.\n\n  Developer debug context: attempted to jump with TensorVariable()\n\n"
             "User code traceback:\n  File \"/home/u/model.py\", line 17, in forward\n",
             "Data-dependent branching", "Detected data-dependent branching"),
}


@pytest.mark.parametrize("version", sorted(BREAK_RECORDS), ids=lambda version: "torch %d.%d" % version)
def test_each_torch_release_s_graph_break_record_is_read_for_its_place_and_reason(version):
    payload, reason, explanation = BREAK_RECORDS[version]
    watch = CompileWatch()
    watch.emit(_broke(payload))
    [entry] = watch.report(2).breaks
    assert (entry.file, entry.line, entry.reason) == ("/home/u/model.py", 17, reason)
    assert entry.explanation.startswith(explanation)


@pytest.mark.parametrize("version, said", [
    ((2, 4), "torch 2.4 reports neither its graph breaks nor why it recompiles"),
    ((2, 5), "torch 2.5 reports neither its graph breaks nor why it recompiles"),
    ((2, 6), "torch 2.6 reports its graph breaks but not why it recompiles"),
    ((2, 7), ""), ((2, 13), ""),
], ids=lambda value: "torch %d.%d" % value if isinstance(value, tuple) else "")
def test_what_each_torch_release_does_not_report_is_said_not_shown_as_none(version, said):
    """Before 2.6 torch's trace has no graph break and before 2.7 no recompile's guard: the report says so, and a report
    of no breaks from such a torch is not "no graph break"."""
    assert unseen_by(version).startswith(said) and bool(unseen_by(version)) == bool(said)
    report = CompileReport(step=1, compile_s=1.0, graphs=1, breaks=[], recompiles=[], recompile_limit=8,
                           unseen=unseen_by(version), sees_breaks=version >= BREAKS_FROM)
    sentence = compile_sentence(report)
    assert ("no graph break" in sentence) == (version >= BREAKS_FROM) and (said in sentence)
