"""``torchlab-tui plan``: will it fit, before launching (core/launch/plan.py)."""

from __future__ import annotations

import json
import subprocess
import sys

from trainers import WORKLOADS
from torchlab.core.launch.cli import main

TIED_BATCHNORM = f"{WORKLOADS / 'tied_batchnorm.py'}:workload"


def test_the_table_says_what_fits_a_given_memory_per_rank_in_80_columns(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["plan", TIED_BATCHNORM, "--gpus", "2", "--device-memory", "5MiB"]) == 0
    out = capsys.readouterr().out
    assert all(len(line) <= 80 for line in out.splitlines())
    rows = {line[:28].strip(): line[28:].split() for line in out.splitlines() if "MiB" in line[28:40]}
    assert rows["as configured"][2] == "no"  # 5.77 MiB: over the 5 MiB
    assert rows["world_size=2, parallel=ddp"][2] == "yes"
    assert "memory: 5 MiB per rank (--device-memory)" in out
    prose = " ".join(out.split())
    assert "amp=fp16 cannot run: fp16 needs CUDA" in prose  # a CPU plan says why, in the table
    assert "Not modelled: the allocator's cache" in prose
    assert "its weights were never held" in prose


def test_json_lines_carry_each_prediction_and_its_verdict(capsys):
    assert main(["plan", TIED_BATCHNORM, "--gpus", "2", "--device-memory", "80GiB", "--json", "--amp", "bf16"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    configured = rows[0]
    assert configured["change"] == "as configured" and configured["fits"] == "yes"
    prediction = configured["prediction"]
    assert prediction["settings"]["amp"] == "bf16"  # the flags given are the configuration planned
    assert prediction["peak_bytes"] == sum(prediction["at_peak"].values())
    assert [row["change"] for row in rows if row["change"].startswith("amp=")] == ["amp=off", "amp=fp16"]


def test_a_size_that_is_not_one_is_a_usage_error_naming_the_flag(capsys):
    assert main(["plan", "mlp", "--device-memory", "lots"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("torchlab-tui plan: device memory (--device-memory): 'lots' is not a size")


def test_a_step_fake_tensors_cannot_run_is_one_paragraph_naming_the_op_and_exit_1():
    done = subprocess.run([sys.executable, "-m", "torchlab.core.launch.cli", "plan", f"{WORKLOADS / 'tiny.py'}:reads_its_loss"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    said = " ".join(done.stderr.split())
    assert "needs a tensor's value read in Python (.item()" in said and "--memory-every 1" in said
    assert "tiny.py:" in said and "in checked_mse()" in said  # the user's line that reads it


def test_a_reader_that_closed_its_pipe_ends_the_plan_quietly():
    """`plan --json | head -1`: the reader may be gone before the plan writes (here it always is)."""
    plan = subprocess.Popen([sys.executable, "-m", "torchlab.core.launch.cli", "plan", "mlp", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    plan.stdout.close()  # the reader leaves at once
    assert plan.wait(timeout=120) == 0
    assert plan.stderr.read() == ""


def test_a_transformers_trainer_is_planned_whole_with_each_rank_keeping_its_per_device_batch(capsys):
    assert main(["plan", f"{WORKLOADS / 'hf_trainer.py'}:workload", "--gpus", "2", "--json"]) == 0
    rows = {row["change"]: row for row in map(json.loads, capsys.readouterr().out.splitlines())}
    configured = rows["as configured"]["prediction"]["settings"]
    on_two = rows[f"world_size=2, batch_size={2 * configured['batch_size']}, parallel=ddp"]["prediction"]["settings"]
    assert on_two["batch_size"] // on_two["world_size"] == configured["batch_size"]  # per_device_train_batch_size each


def test_the_largest_batch_predicted_to_fit_is_found_on_a_line_and_predicted_to_check_it(capsys):
    assert main(["plan", TIED_BATCHNORM, "--device-memory", "5MiB", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    largest = rows[-1]
    batch = largest["prediction"]["settings"]["batch_size"]
    assert largest["change"] == f"largest batch that fits: batch_size={batch}" and 1 <= batch < 16  # 16 does not fit
    assert largest["fits"] == "yes" and largest["prediction"]["peak_bytes"] <= 0.9 * 5 * 2**20
