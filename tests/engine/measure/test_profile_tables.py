"""Tables from trace.json agree with torch.profiler's own key_averages(), and build without torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from torchlab.core.engine.measure.profile_tables import build_tables, communication_time, format_table, write_tables


def _profiled_trace(tmp_path):
    """A real profile of a few training steps of a small model with a same-named nested op (mul by a scalar)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters())
    data = torch.randn(8, 16)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True) as recorded:
        for _ in range(3):
            loss = (model(data) * 0.5).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    recorded.export_chrome_trace(str(tmp_path / "trace.json"))
    return recorded, json.loads((tmp_path / "trace.json").read_text())


def test_every_row_matches_key_averages(tmp_path):
    recorded, trace = _profiled_trace(tmp_path)
    rows, rows_by_shape, sort = build_tables(trace)
    ours = {row["name"]: row for row in rows}
    theirs = {event.key: event for event in recorded.key_averages()}
    assert sort == "self_cpu_us" and set(ours) == set(theirs)
    assert "aten::addmm" in ours and "aten::mul" in ours
    for name, event in theirs.items():
        row = ours[name]
        assert row["calls"] == event.count, name
        assert row["self_cpu_us"] == pytest.approx(event.self_cpu_time_total, abs=1.0), name
        assert row["cpu_total_us"] == pytest.approx(event.cpu_time_total, abs=1.0), name
        assert row["self_cpu_memory_bytes"] == event.self_cpu_memory_usage, name
        assert row["self_device_us"] == 0 and row["device_total_us"] == 0
    assert [row["self_cpu_us"] for row in rows] == sorted((row["self_cpu_us"] for row in rows), reverse=True)
    by_shape_calls = sum(row["calls"] for row in rows_by_shape if row["name"] == "aten::addmm")
    assert by_shape_calls == ours["aten::addmm"]["calls"]
    assert any(row["input_shapes"] == "[[32], [8, 16], [16, 32], [], []]" for row in rows_by_shape)


def test_device_time_goes_to_the_launching_op_and_up_through_its_parents():
    def op(name, ts, dur, external_id, tid=1):
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": {"External id": external_id}}

    trace = {"traceEvents": [
        op("aten::linear", 0, 100, 1),
        op("aten::addmm", 10, 80, 2),
        op("ProfilerStep#7", 0, 200, 3, tid=1),
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 50, "dur": 30, "args": {"External id": 2}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": 8, "ts": 95, "dur": 5, "args": {"External id": 1}},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 20, "args": {"Bytes": 4096, "Device Type": 1}},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 95, "args": {"Bytes": 512, "Device Type": 0}},
    ]}
    rows, _, sort = build_tables(trace)
    by_name = {row["name"]: row for row in rows}
    assert sort == "self_device_us"
    assert (by_name["aten::addmm"]["self_device_us"], by_name["aten::addmm"]["device_total_us"]) == (30, 30)
    assert (by_name["aten::linear"]["self_device_us"], by_name["aten::linear"]["device_total_us"]) == (5, 35)
    assert by_name["ProfilerStep*"]["device_total_us"] == 35 and by_name["ProfilerStep*"]["self_cpu_us"] == 100
    assert by_name["aten::addmm"]["self_device_memory_bytes"] == 4096
    assert by_name["aten::linear"]["self_cpu_memory_bytes"] == 512


def test_the_child_process_writes_the_tables_without_torch(tmp_path):
    _profiled_trace(tmp_path)
    code = (
        "import sys, runpy; sys.argv = ['profile_tables', sys.argv[1]]\n"
        "runpy.run_module('torchlab.core.engine.measure.profile_tables', run_name='__main__')\n"
    )
    guard = "import sys; sys.modules['torch'] = None\n"  # importing torch would now fail
    done = subprocess.run([sys.executable, "-c", guard + code, str(tmp_path)], capture_output=True, text=True, check=True)
    report = json.loads(done.stdout)
    assert report["sort"] == "self_cpu_us" and report["rows"][0]["calls"] > 0
    assert report["communication"] is None  # one process: no collective
    assert "aten::addmm" in (tmp_path / "table.txt").read_text()
    assert (tmp_path / "table.csv").read_text().startswith("name,input_shapes,calls,")
    assert "Input shapes" in (tmp_path / "table_by_shape.txt").read_text()


def _range(name, ts, dur, *, cat="user_annotation", tid=1):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": {}}


def test_gloo_communication_is_the_union_of_its_ranges_within_the_profiled_steps():
    trace = {"traceEvents": [
        _range("ProfilerStep#1", 0, 100), _range("ProfilerStep#2", 100, 100),  # the steps: 0..200
        _range("c10d::allgather_", 5, 60, cat="cpu_op"),  # the training thread's call: not gloo's work
        _range("gloo:all_gather", 10, 30, tid=2), _range("gloo:all_gather", 30, 40, tid=3),  # two threads: 10..70
        _range("gloo:all_reduce", 65, 15, tid=2),  # overlaps all_gather: in both kinds, once in the whole
        _range("gloo:all_reduce", 150, 80, tid=2),  # runs past the last step: 150..200 counts
        _range("gloo:all_reduce", 160, 10, tid=3),  # inside the one above
        _range("gloo:broadcast", -50, 40, tid=2),  # before the steps: not theirs
    ]}
    assert communication_time(trace) == {
        "steps_us": 200, "us": 120, "share": 0.6,  # 10..80 and 150..200
        "by_kind": [{"kind": "all_reduce", "us": 65}, {"kind": "all_gather", "us": 60}], "source": "gloo",
    }


def test_on_a_gpu_communication_is_nccl_kernels_by_the_kind_their_name_says():
    trace = {"traceEvents": [
        _range("ProfilerStep#3", 0, 100, cat="cpu_op"),
        _range("gemm", 0, 100, cat="kernel", tid=7),  # compute beside them: not communication
        _range("ncclDevKernel_AllGather_RING_LL", 10, 20, cat="kernel", tid=8),
        _range("ncclKernel_AllReduce_RING_LL_Sum_float", 20, 30, cat="kernel", tid=9),
        _range("ncclDevKernel_SendRecv", 60, 10, cat="kernel", tid=8),
        _range("ncclDevKernel_Unheard_Of", 92, 28, cat="kernel", tid=8),  # an unknown kind, past the step's end
    ]}
    assert communication_time(trace) == {
        "steps_us": 100, "us": 58, "share": 0.58,
        "by_kind": [{"kind": "AllReduce", "us": 30}, {"kind": "AllGather", "us": 20}, {"kind": "SendRecv", "us": 10},
                    {"kind": "ncclDevKernel_Unheard_Of", "us": 8}],
        "source": "nccl kernels",
    }


def test_a_trace_without_collectives_has_no_communication():
    single_process = {"traceEvents": [_range("ProfilerStep#1", 0, 100), _range("aten::mm", 10, 50, cat="cpu_op"),
                                      _range("gemm", 20, 30, cat="kernel", tid=7)]}
    assert communication_time(single_process) is None
    assert communication_time({"traceEvents": [_range("gloo:all_reduce", 0, 10)]}) is None  # and no steps to share


def test_text_table_columns_line_up():
    rows = [
        {"name": "aten::mm", "input_shapes": "", "calls": 3, "self_cpu_us": 1500.0, "cpu_total_us": 1600.0,
         "self_device_us": 0.0, "device_total_us": 0.0, "self_cpu_memory_bytes": 2**20, "self_device_memory_bytes": 0},
    ]
    lines = format_table(rows).splitlines()
    assert lines[0].startswith("Name") and "Input shapes" not in lines[0]
    assert "1.500" in lines[2] and "1.00" in lines[2]
    assert len({len(line) for line in lines[:2]}) == 1


def test_a_missing_trace_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_tables(tmp_path)
