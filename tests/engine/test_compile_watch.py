"""torch.compile, seen (core/engine/compile_watch.py): each graph break at the user's file and line with Dynamo's
reason, each recompile with the guard that failed, the graphs and the compile time, from torch's structured trace
while compile is on; a run that never compiles imports none of it."""

from __future__ import annotations

import subprocess
import sys

from trainers import TINY, WORKLOADS, make_trainer
from torchlab.core.wire.compile_report import CompileReport, compile_sentence
from torchlab.core.wire.events import describe

TINY_FILE = WORKLOADS / "tiny.py"


def last_report(seen) -> CompileReport:
    return CompileReport(**{key: value for key, value in seen.of("compile_report")[-1].items()
                            if key not in ("event", "time")})


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


def test_three_sequence_lengths_recompile_and_the_failed_guard_is_named():
    trainer, seen = make_trainer(f"{TINY_FILE}:three_lengths", steps=10, options={"compile": "on"})
    assert trainer.run().status == "finished"
    report = last_report(seen)
    [recompile] = report.recompiles  # the second length: the dimension is dynamic from then on (automatic dynamic)
    assert recompile.frame == "forward" and recompile.file == str(TINY_FILE) and recompile.compiled == 2
    assert recompile.guard.startswith("tensor 'tokens' size mismatch at index 1. expected ")
    assert report.breaks == [] and report.recompile_limit >= 2
    assert "recompiled forward (workloads/tiny.py:" in compile_sentence(report)


def test_a_model_that_compiles_cleanly_has_no_break_and_is_said_so_once():
    trainer, seen = make_trainer(TINY, steps=6, options={"compile": "on"})
    assert trainer.run().status == "finished"
    [report] = seen.of("compile_report")  # at the boundary's compile; no step compiled again
    assert report["breaks"] == [] and report["recompiles"] == [] and report["graphs"] >= 1
    said = describe(last_report(seen))
    assert not said.warning and "no graph break" in said.text


def test_a_run_that_never_compiles_imports_no_watch_and_writes_no_trace():
    """Compile off: the watch is not imported, nor its handler on torch's structured trace (torch's own, which writes
    nothing without TORCH_TRACE, is there in any process; torch's own optimizers import torch._dynamo, whatever the
    run does)."""
    script = (f"import sys; sys.path[:0] = {[str(WORKLOADS.parent / 'helpers'), str(WORKLOADS.parent)]!r}\n"
              "from trainers import make_trainer\n"
              "trainer, _ = make_trainer(steps=3)\n"
              "trainer.run()\n"
              "from torch._logging._internal import trace_log\n"
              "print('torchlab.core.engine.compile_watch' in sys.modules, [type(h).__name__ for h in trace_log.handlers])")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False ['LazyTraceHandler']"  # torch's own, which writes nothing


def test_switching_compile_off_stops_the_watch():
    from torch._logging._internal import trace_log

    trainer, seen = make_trainer(TINY, steps=6, options={"compile": "on"}, at=["4:compile=off"])
    assert trainer.run().status == "finished"
    assert trainer.parts.model.compile_watch is not None and trainer.parts.model.compile_watch not in trace_log.handlers


def test_a_frame_near_torchs_recompile_limit_is_named_before_it_runs_eagerly(monkeypatch):
    """Shapes kept static (no automatic dynamic dimension) and a limit of 3 graphs a frame: a new length recompiles,
    and the frame one graph short of the limit is said to run eagerly past it, with the setting that raises it."""
    import torch._dynamo

    monkeypatch.setattr(torch._dynamo.config, "automatic_dynamic_shapes", False)
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 3)
    trainer, seen = make_trainer(f"{TINY_FILE}:three_lengths", steps=12, options={"compile": "on"})
    try:
        assert trainer.run().status == "finished"
    finally:  # a code object past the limit runs eagerly for the rest of the process: the tests after this one compile
        torch._dynamo.reset()
    report = last_report(seen)
    forward = [entry for entry in report.recompiles if entry.frame == "forward"]
    assert report.recompile_limit == 3 and forward  # a second length (the batches are padded to their longest)
    nearest = max(forward, key=lambda entry: entry.compiled)
    assert nearest.compiled >= 2  # one short of the limit
    assert "runs eagerly" in nearest.hint and "torch._dynamo.config.recompile_limit" in nearest.hint
