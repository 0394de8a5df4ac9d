"""The GPU pass's scripts still run against today's engine, checked on a CPU with the tests' tiny workloads.

A machine with a GPU is lent for minutes, rarely: a script that broke since it last ran (the engine moved
an attribute it reads) spends them. On 2026-11-27 ``probe_overhead.py`` failed that way on the H100. Each
script here runs its whole path once on a workload file of the tests (``--workload path.py:factory``; the residual
CNN where the naive hooks need a model without in-place activations), a step or two a variant; what it measures
on a CPU is not read (the sync counts are zero by construction there), only that it ran to its JSON. The samples
(``mlp``, ``tiny_gpt``) cost several times as much for the same path: the scripts' warm-ups train a fixed number
of steps.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
TINY = str(Path(__file__).resolve().parent.parent / "workloads" / "tiny.py") + ":workload"
RESIDUAL_CNN = TINY.replace(":workload", ":residual_cnn")  # no in-place activation


@pytest.mark.parametrize(("script", "arguments"), [
    ("probe_overhead", ["--workload", RESIDUAL_CNN, "--batch-size", "2", "--rounds", "1", "--steps-per-block", "1"]),
    ("host_syncs", ["--workload", TINY, "--device", "cpu", "--steps", "1", "--rounds", "1", "--steps-per-block", "1"]),
    ("gpu_gaps", ["--workload", TINY, "--device", "cpu", "--steps", "1"]),
])
def test_the_script_runs_to_its_figures(script, arguments, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # as when run as a script: its siblings import by name
    module = importlib.import_module(script)
    figures = tmp_path / "figures.json"
    monkeypatch.setattr(sys, "argv", [module.__file__, *arguments, "--json", str(figures)])
    module.main()
    assert json.loads(figures.read_text())["workload"] == arguments[1]


def test_the_forecast_stage_prints_its_table_row(monkeypatch, capsys):
    """The GPU pass's ``forecast`` stage: on a GPU its last column is the CUDA allocator's peak; here, the same path on a
    CPU (the real-tensor peak), one model and one setting."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    module = importlib.import_module("memory_forecast")
    monkeypatch.setattr(sys, "argv", [module.__file__, "--models", "mlp", "--settings", "off", "--device", "cpu"])
    module.main()
    [row] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| mlp | off |")]
    assert row.count("|") == 13 and "cannot" not in row
