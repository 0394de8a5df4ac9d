"""Profiler snapshots: real profiles of training steps, their tables built off the training thread."""

from __future__ import annotations

import csv
import json

from trainers import TINY, make_trainer
from torchlab.core.errors import EXIT_OK
from torchlab.core.launch.cli import main
from torchlab.core.wire.protocol import ProfileCommand


def test_a_snapshot_profiles_the_next_steps_and_writes_three_files(tmp_path):
    trainer, seen = make_trainer(steps=12, profiles_dir=tmp_path, profile_at=(3,), profile_steps=4, telemetry_interval=0)
    assert trainer.run().status == "finished"
    [started] = seen.of("profile_started")
    [report] = seen.of("profile")
    assert started["step"] == 3 and (report["first_step"], report["last_step"]) == (4, 7)  # 1 warm-up, 4 recorded
    assert report["error"] is None
    names = [row["name"] for row in report["rows"]]
    assert any(name in ("aten::addmm", "aten::mm") for name in names)
    assert report["rows"][0]["self_cpu_us"] >= report["rows"][-1]["self_cpu_us"] > 0 or len(report["rows"]) == 1
    folder = tmp_path / "0000003"
    assert json.loads((folder / "trace.json").read_text())["traceEvents"]
    assert "aten::" in (folder / "table.txt").read_text()
    with open(folder / "table.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert {"name", "calls", "self_cpu_us", "self_device_us", "self_cpu_memory_bytes"} <= set(rows[0])
    assert any(row["input_shapes"] not in ("", "[]") for row in report["rows_by_shape"])


def test_a_second_request_while_recording_is_refused(tmp_path):
    trainer, seen = make_trainer(steps=8, profiles_dir=tmp_path, telemetry_interval=0)
    trainer.submit(ProfileCommand(3))
    trainer.submit(ProfileCommand(3))
    trainer.run()
    [refusal] = seen.of("option_refused")
    assert refusal["option"] == "profile" and "already recording" in refusal["reason"]
    assert len(seen.of("profile")) == 1


def test_a_run_that_ends_mid_profile_ends_cleanly(tmp_path):
    trainer, seen = make_trainer(steps=3, profiles_dir=tmp_path, profile_at=(2,), profile_steps=5, telemetry_interval=0)
    assert trainer.run().status == "finished"
    assert seen.of("profile") == []


def test_profile_at_from_the_command_line(tmp_path, capsys):
    code = main([
        TINY, "--headless", "--steps", "8", "--run-dir", str(tmp_path / "run"),
        "--profile-at", "2", "--profile-steps", "2", "--telemetry-interval", "0"])
    assert code == EXIT_OK
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    [profile] = [e for e in events if e["event"] == "profile"]
    assert (profile["first_step"], profile["last_step"]) == (3, 4)
    assert (tmp_path / "run" / "profiles" / "0000002" / "trace.json").exists()
    assert "profile in" in capsys.readouterr().err
