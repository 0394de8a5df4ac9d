"""The rules behind the profiler screens, without a terminal: comparison, sorting, units, table.csv."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from torchlab.core.analysis.profile_compare import compare_tables
from torchlab.tui.profiles import (
    ProfileSnapshot,
    compare_entries,
    format_bytes,
    format_times,
    format_us,
    next_top_n,
    snapshot_rows,
    sort_rows,
)

BEFORE = [
    {"name": "aten::mm", "input_shapes": "[[32, 64], [64, 64]]", "calls": 10, "self_cpu_us": 100.0},
    {"name": "aten::relu", "input_shapes": "[[32, 64]]", "calls": 10, "self_cpu_us": 10.0},
]
AFTER = [
    {"name": "aten::mm", "input_shapes": "[[32, 64], [64, 64]]", "calls": 10, "self_cpu_us": 50.0},
    {"name": "aten::mm", "input_shapes": "[[32, 64], [64, 256]]", "calls": 5, "self_cpu_us": 20.0},
    {"name": "aten::gelu", "input_shapes": "[[32, 64]]", "calls": 10, "self_cpu_us": 5.0},
]


def test_compare_tables_pairs_ops_and_gives_after_over_before() -> None:
    by_name = {entry["name"]: entry for entry in compare_tables(BEFORE, AFTER[:1] + AFTER[2:], ["self_cpu_us", "calls"])}
    assert by_name["aten::mm"]["ratios"] == {"self_cpu_us": pytest.approx(0.5), "calls": 1.0}
    assert by_name["aten::relu"]["after"] is None and by_name["aten::relu"]["ratios"]["self_cpu_us"] is None
    assert by_name["aten::gelu"]["before"] is None


def test_grouped_by_shape_the_same_op_with_other_shapes_is_another_row() -> None:
    keys = [(entry["name"], entry["input_shapes"]) for entry in compare_tables(BEFORE, AFTER, ["self_cpu_us"], by_shape=True)]
    assert ("aten::mm", "[[32, 64], [64, 64]]") in keys and ("aten::mm", "[[32, 64], [64, 256]]") in keys
    assert len(keys) == 4


def test_compare_entries_are_flat_rows_with_change_and_where_an_op_is_missing() -> None:
    entries = {entry["name"]: entry for entry in compare_entries(BEFORE, AFTER[:1] + AFTER[2:], "self_cpu_us", by_shape=False)}
    assert entries["aten::mm"]["change"] == -50.0 and entries["aten::mm"]["size"] == 100.0
    assert entries["aten::relu"]["only_in"] == "before" and entries["aten::gelu"]["only_in"] == "after"


def test_sorting_puts_missing_values_last_both_ways() -> None:
    rows = [{"name": "b", "x": 2}, {"name": "a", "x": None}, {"name": "c", "x": 5}]
    assert [row["name"] for row in sort_rows(rows, "x")] == ["c", "b", "a"]
    assert [row["name"] for row in sort_rows(rows, "x", reverse=True)] == ["b", "c", "a"]
    assert [row["name"] for row in sort_rows(rows, "name")] == ["a", "b", "c"]


def test_units_read_like_a_person_would_write_them() -> None:
    assert format_us(850) == "850 µs" and format_us(2.5) == "2.5 µs" and format_us(12_345) == "12.3 ms"
    assert format_us(4_560_000) == "4.56 s" and format_us(None) == "–"
    assert format_bytes(512) == "512 B" and format_bytes(1536) == "1.5 KiB" and format_bytes(-3 * 2**20) == "-3 MiB"
    assert format_bytes(41.2 * 2**30) == "41.2 GiB"
    assert format_times(0.5) == "0.50x" and format_times(12.34) == "12.3x" and format_times(None) == "–"


def test_top_n_steps_through_its_choices_and_stops_at_the_ends() -> None:
    assert next_top_n(20, 1) == 50 and next_top_n(20, -1) == 10 and next_top_n(10, -1) == 10
    assert next_top_n(100, 1) == 0 and next_top_n(0, 1) == 0  # 0: all rows


def test_snapshot_rows_prefer_table_csv_and_fall_back_to_the_rows_sent(tmp_path: Path) -> None:
    sent = [{"name": "aten::mm", "input_shapes": "", "calls": 1, "self_cpu_us": 9.0}]
    snapshot = ProfileSnapshot(1, 12, 16, str(tmp_path), rows=sent, rows_by_shape=[])
    assert snapshot_rows(snapshot, by_shape=False).note == "the trainer's top 1 by self CPU"
    with open(tmp_path / "table.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["name", "input_shapes", "calls", "self_cpu_us", "cpu_total_us", "self_device_us",
                         "device_total_us", "self_cpu_memory_bytes", "self_device_memory_bytes"])
        writer.writerow(["aten::mm", "", "3", "9.5", "12", "0", "0", "-1024", "0"])
        writer.writerow(["aten::add", "", "2", "1", "1", "0", "0", "", "0"])
    rows = snapshot_rows(snapshot, by_shape=False)
    assert rows.complete and rows.note == "all 2 ops (table.csv)"
    assert rows.rows[0] == {"name": "aten::mm", "input_shapes": "", "calls": 3, "self_cpu_us": 9.5, "cpu_total_us": 12,
                            "self_device_us": 0, "device_total_us": 0, "self_cpu_memory_bytes": -1024,
                            "self_device_memory_bytes": 0}
    assert rows.rows[1]["self_cpu_memory_bytes"] is None
    assert not snapshot_rows(snapshot, by_shape=True).complete  # no table_by_shape.csv yet
    (tmp_path / "table_by_shape.csv").write_text(
        "name,input_shapes,calls,self_cpu_us,cpu_total_us,self_device_us,device_total_us,self_cpu_memory_bytes,self_device_memory_bytes\n"
        'aten::mm,"[[8, 16], [16, 32]]",3,9.5,12,0,0,0,0\n'
    )
    by_shape = snapshot_rows(snapshot, by_shape=True)
    assert by_shape.complete and by_shape.rows[0]["input_shapes"] == "[[8, 16], [16, 32]]"
    assert by_shape.note == "all 1 op/shape pairs (table_by_shape.csv)"
