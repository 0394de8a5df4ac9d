"""The matrix's invariants (benchmarks/matrix/invariants.py) held to journals written by hand: each names what broke,
and holds where nothing did. Cheap: no training (the cells are tests/product/test_matrix_fast.py)."""

from __future__ import annotations

import json

from benchmarks.matrix.invariants import Evidence, each_compile_reported


def _journal(tmp_path, *events: dict) -> Evidence:
    (tmp_path / "events.jsonl").write_text("".join(json.dumps({"time": 1.0, **event}) + "\n" for event in events))
    return Evidence(run=tmp_path)


def _applied(step: int, option: str, value, source: str = "--at") -> dict:
    return {"event": "option_applied", "step": step, "option": option, "value": value, "previous": None, "source": source}


def _report(step: int, dynamic: str = "auto", graphs: int = 2) -> dict:
    return {"event": "compile_report", "step": step, "graphs": graphs, "dynamic": dynamic}


def test_each_compile_and_each_change_of_its_shapes_has_its_report(tmp_path):
    assert each_compile_reported(_journal(tmp_path, _report(1), _applied(1, "compile", True, "start"),
                                          _report(4, "on"), _applied(4, "dynamic", "on"),
                                          _applied(6, "compile", False), _applied(7, "dynamic", "off"))) is None
    assert each_compile_reported(_journal(tmp_path, _applied(1, "compile", True, "start"))) == (
        "compile=True applied at step 1 (start), compiled, and no compile_report at that step")
    assert each_compile_reported(_journal(tmp_path, _report(1), _applied(1, "compile", True), _report(4, "auto"),
                                          _applied(4, "dynamic", "on"))) == (
        "the compile_report of step 4 says 2 graphs compiled under dynamic=auto (dynamic=on was in force)")
