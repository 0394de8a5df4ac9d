"""What compiling bought, in the impact row of the segment compile came on in (core/analysis/compile_payback.py): the
compile time against the time saved a step, the step it pays back at, its graph breaks; nothing of a saving the table
did not judge, nor of a row that is not compile's."""

from __future__ import annotations

import dataclasses

import pytest

from fake_link import impact
from trainers import WORKLOADS, make_trainer
from torchlab.core.analysis.compile_payback import payback_words
from torchlab.core.analysis.impact import ImpactTracker
from torchlab.core.records.compile_history import RunCompileTime
from torchlab.core.wire.compile_report import CompileReport, GraphBreak

START, BF16 = impact().segments[:2]  # 17.2 ms a step, then 10.0 ms, judged 1.72x faster
EAGER = START
COMPILED = dataclasses.replace(BF16, change="compile=on", options={**BF16.options, "amp": "off", "compile": True})
REPORT = CompileReport(step=121, compile_s=41.0, graphs=3, breaks=[], recompiles=[], recompile_limit=8)


def run_compiled(*reports: CompileReport) -> RunCompileTime:
    """A run's compile time of one process a report."""
    compiled = RunCompileTime()
    for report in reports:
        compiled.process_started()
        compiled.reported(report)
    return compiled


def test_a_judged_saving_pays_back_its_compile_time_at_a_step_named():
    # 41 s / 7.2 ms saved = 5,695 steps after step 121
    assert payback_words(COMPILED, EAGER, run_compiled(REPORT), 20_000) == "compiled in 41.0 s, saves 7.2 ms a step: pays back at step 5,816 of 20,000"
    assert payback_words(COMPILED, EAGER, run_compiled(REPORT), 2_000).endswith("pays back at step 5,816 of 2,000; the run ends first")


def test_a_slower_compile_never_pays_back_and_its_breaks_are_named():
    slower = dataclasses.replace(COMPILED, median_step_time_s=0.020)
    broken = dataclasses.replace(REPORT, breaks=[GraphBreak("/home/me/model.py", 17, "if x:", "Data-dependent branching")])
    assert payback_words(slower, EAGER, run_compiled(broken), None) == (
        "compiled in 41.0 s, 2.8 ms slower a step: never pays back; 1 graph break (me/model.py:17)")


def test_nothing_is_said_of_a_saving_not_judged_nor_of_a_row_that_is_not_compiles():
    unjudged = dataclasses.replace(COMPILED, speedup=None)
    assert payback_words(unjudged, EAGER, run_compiled(REPORT), 20_000) == "compiled in 41.0 s"
    assert payback_words(BF16, START, run_compiled(REPORT), 20_000) is None
    assert payback_words(COMPILED, EAGER, RunCompileTime(), 20_000) is None


def test_a_resumed_run_s_compile_time_is_every_process_s():
    """Each process compiles again what the run had and its reports count its own compiling: the run paid for all of
    it, and the payback step is of the sum (the journal read back on a resume, or the events as they come alike)."""
    resumed = dataclasses.replace(REPORT, step=3_000, compile_s=9.0)
    assert payback_words(COMPILED, EAGER, run_compiled(REPORT, resumed), 20_000).startswith(
        "compiled in 50.0 s, saves 7.2 ms a step: pays back at step 7,066 of 20,000")
    records = [{"event": "run_started", "step": 0}, REPORT.journal_record(), {"event": "compile_report", "step": 9, "graphs": "?"},
               {"event": "run_started", "step": 2_999}, resumed.journal_record()]
    read = RunCompileTime.of(records)  # a record this version cannot read is left, not a crash
    assert (read.seconds, read.newest) == (50.0, resumed)


@pytest.mark.usefixtures("dynamo_only")  # the row's words, whatever the backend; inductor's speed: test_step_phases.py
def test_the_impact_row_of_a_real_compile_says_what_it_bought():
    """Hundreds of tiny ops a step, compiled at step 40: the row says its compile time and what it bought."""
    tracker = ImpactTracker()
    trainer, seen = make_trainer(f"{WORKLOADS / 'tiny.py'}:many_small_ops", steps=100, at=["40:compile=on"])
    trainer.observers.append(tracker)
    trainer.run()
    compiled = tracker.table()[-1]
    assert compiled.change == "compile=on" and "; compiled in " in compiled.verdict, compiled.verdict
    assert compiled.speedup is None or "pays back at step " in compiled.verdict or "never pays back" in compiled.verdict
