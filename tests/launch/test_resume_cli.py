"""``--resume`` from the command line continues *this* run: its workload and every setting come from the
checkpoint, a flag given beside it overrides (with a warning where the run can no longer match a run
that was never stopped), a larger ``--steps`` extends the run with no jump in the LR, and a resume that
fails leaves the run directory as it was."""

from __future__ import annotations

import json
import subprocess
import sys
import math
from pathlib import Path

import pytest

from trainers import WORKLOADS
from torchlab.core.engine.schedule import lr_factor
from torchlab.core.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from torchlab.core.launch.cli import main
from torchlab.core.records.config import config_from_toml
from torchlab.tui.run_history import RunHistory, differences

TINY = WORKLOADS / "tiny.py"
#: Not one of them the default: a resume that forgot any of them would train differently.
FIRST_RUN_FLAGS = ["--seed", "7", "--lr", "0.003", "--schedule", "onecycle", "--batch-size", "24",
                   "--optimizer", "sgd", "--weight-decay", "0.05", "--at", "5:clip=0.5", "--eval-every", "0"]


def headless(*args: str) -> int:
    return main([*args, "--headless"])


def metrics(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    by_step = {row["step"]: row for row in rows}
    assert len(by_step) == len(rows), "a step written twice"
    return by_step


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def test_a_checkpoint_alone_restores_the_workload_and_every_setting(tmp_path):
    straight = tmp_path / "straight"
    assert headless(f"{TINY}:workload", *FIRST_RUN_FLAGS, "--steps", "12", "--checkpoint-every", "6",
                    "--run-dir", str(straight)) == EXIT_OK
    resumed = tmp_path / "resumed"
    assert headless("--resume", str(straight / "checkpoints" / "step-0000006.pt"), "--run-dir", str(resumed)) == EXIT_OK

    expected, got = metrics(straight), metrics(resumed)
    assert sorted(got) == list(range(7, 13))
    assert [got[step]["loss"] for step in got] == [expected[step]["loss"] for step in got]  # bit for bit
    assert [got[step]["lr"] for step in got] == [expected[step]["lr"] for step in got]
    assert got[12]["clip"] == 0.5  # the scripted change, in force since step 5
    assert config_from_toml((resumed / "config.toml").read_text(), "") == config_from_toml((straight / "config.toml").read_text(), "")
    assert not [e for e in events(resumed) if e["event"] == "resume_changed_settings"]


def test_a_run_interrupted_and_resumed_with_no_flag_matches_a_straight_run(tmp_path, capsys, monkeypatch):
    """The issue's case: non-default flags on the first run only; Ctrl-C; ``--resume RUN_DIR`` alone."""
    straight = tmp_path / "straight"
    assert headless(f"{TINY}:interrupts_itself", *FIRST_RUN_FLAGS, "--steps", "40", "--run-dir", str(straight)) == EXIT_OK

    interrupted = tmp_path / "interrupted"
    monkeypatch.setenv("TORCHLAB_TEST_INTERRUPT_AT", "17")  # Ctrl-C during step 17
    assert headless(f"{TINY}:interrupts_itself", *FIRST_RUN_FLAGS, "--steps", "40", "--checkpoint-every", "0",
                    "--run-dir", str(interrupted)) == EXIT_INTERRUPTED
    monkeypatch.delenv("TORCHLAB_TEST_INTERRUPT_AT")
    assert max(metrics(interrupted)) == 17
    assert f"resume with torchlab-tui --resume {interrupted}" in capsys.readouterr().err

    assert headless("--resume", str(interrupted)) == EXIT_OK  # the hint, followed literally
    expected, got = metrics(straight), metrics(interrupted)
    assert sorted(got) == list(range(1, 41))
    assert [got[step]["loss"] for step in range(1, 41)] == [expected[step]["loss"] for step in range(1, 41)]
    assert [got[step]["lr"] for step in range(1, 41)] == [expected[step]["lr"] for step in range(1, 41)]
    assert (interrupted / "config.toml").read_text() == (straight / "config.toml").read_text().replace(
        'checkpoint_every = "auto"', "checkpoint_every = 0")  # written once, at the start; the resume changed nothing


def test_an_override_that_breaks_exactness_is_said_once_and_journalled(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert headless(f"{TINY}:workload", *FIRST_RUN_FLAGS, "--steps", "8", "--checkpoint-every", "4",
                    "--run-dir", str(run_dir)) == EXIT_OK
    started_with = (run_dir / "config.toml").read_text()
    capsys.readouterr()
    assert headless("--resume", str(run_dir / "checkpoints" / "step-0000004.pt"), "--seed", "3", "--lr", "0.01",
                    "--steps", "8") == EXIT_OK
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "warning:" in line]
    assert len(warnings) == 1
    assert "seed 7 → 3" in warnings[0] and "lr 0.003 → 0.01" in warnings[0] and "steps" not in warnings[0]

    [changed] = [e for e in events(run_dir) if e["event"] == "resume_changed_settings"]
    assert changed["step"] == 4 and changed["level"] == "warning"
    assert {c["setting"]: (c["stored"], c["value"], c["breaks_exactness"]) for c in changed["changes"]} == {
        "seed": (7, 3, True), "lr": (0.003, 0.01, True)}
    # The record of how the run started is kept; config.toml now says how it goes on.
    assert (run_dir / "config.before-step-0000004.toml").read_text() == started_with
    now = config_from_toml((run_dir / "config.toml").read_text(), "")
    assert (now.seed, now.lr, now.schedule) == (3, 0.01, "onecycle")
    # The new LR is in force: the schedule's factor times the new peak.
    row = metrics(run_dir)[5]
    assert math.isclose(row["lr"], 0.01 * lr_factor("onecycle", 4, 8, 1), rel_tol=1e-9)


def test_more_steps_extend_the_run_with_no_jump_in_the_learning_rate(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert headless(f"{TINY}:workload", "--steps", "20", "--run-dir", str(run_dir), "--eval-every", "0") == EXIT_OK
    capsys.readouterr()
    assert headless("--resume", str(run_dir), "--steps", "40") == EXIT_OK
    err = capsys.readouterr().err
    assert "resumed with steps 20 → 40" in err and "warning" not in err

    lrs = [metrics(run_dir)[step]["lr"] for step in range(1, 41)]
    peak = max(lrs)
    assert lrs[20] <= lrs[19] and (lrs[19] - lrs[20]) < 0.01 * peak  # continuous at the boundary, still decaying
    assert all(later <= earlier for earlier, later in zip(lrs[1:], lrs[2:]))  # never back up the cosine
    config = config_from_toml((run_dir / "config.toml").read_text(), "")
    assert config.steps == 40 and config.schedule_extensions == ((20, 20),)


def test_fewer_steps_than_the_checkpoint_has_is_a_clear_error(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert headless(f"{TINY}:workload", "--steps", "6", "--run-dir", str(run_dir)) == EXIT_OK
    capsys.readouterr()
    assert headless("--resume", str(run_dir), "--steps", "3") == EXIT_USAGE
    err = capsys.readouterr().err
    assert "steps (--steps) 3: last.pt is at step 6 already; give a total of at least 6" in err
    assert "Traceback" not in err


def test_resuming_a_finished_run_with_no_flag_says_there_is_nothing_to_train_and_how_to_go_on(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert headless(f"{TINY}:workload", "--steps", "6", "--run-dir", str(run_dir)) == EXIT_OK
    capsys.readouterr()
    assert headless("--resume", str(run_dir)) == EXIT_OK
    err = capsys.readouterr().err
    assert "Nothing to train: the run is at step 6, its --steps. Resume with --steps N (N > 6) to train further." in err
    assert sorted(metrics(run_dir)) == list(range(1, 7))


def test_a_resume_that_fails_changes_nothing_in_the_run_directory(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert headless(f"{TINY}:workload", "--steps", "4", "--run-dir", str(run_dir)) == EXIT_OK
    before = {path.name: path.read_bytes() for path in run_dir.iterdir() if path.is_file()}
    assert headless("--resume", str(run_dir), f"{TINY}:no_checkpoint_blocks") == EXIT_USAGE  # another model: cannot load
    assert "does not fit" in capsys.readouterr().err
    after = {path.name: path.read_bytes() for path in run_dir.iterdir() if path.is_file()}
    assert after["config.toml"] == before["config.toml"]
    assert after["metrics.jsonl"] == before["metrics.jsonl"]
    added = after["events.jsonl"][len(before["events.jsonl"]):].decode().splitlines()
    assert after["events.jsonl"].startswith(before["events.jsonl"])
    assert [json.loads(line)["event"] for line in added] == ["error"]


def test_lr_schedules_are_unchanged_without_an_extension_and_continuous_with_one():
    for schedule in ("cosine", "onecycle", "constant"):
        plain = [lr_factor(schedule, step, 40, 2) for step in range(41)]
        extended = [lr_factor(schedule, step, 80, 2, ((20, 40),)) for step in range(81)]
        assert extended[:21] == plain[:21]  # identical up to and including the step resumed at
        twice = [lr_factor(schedule, step, 120, 2, ((20, 40), (50, 80))) for step in range(121)]
        assert twice[:51] == extended[:51]
        for series, ends in ((extended, 80), (twice, 120)):
            steps = [abs(b - a) for a, b in zip(series[20:], series[21:])]
            assert max(steps, default=0) < 0.05  # no jump anywhere after the first extension
            assert math.isclose(series[ends], plain[40])  # the same end value, at the new total


def test_a_second_ctrl_c_aborts_with_one_line_and_keeps_the_checkpoints(tmp_path, capsys, monkeypatch):
    run_dir = tmp_path / "run"
    monkeypatch.setenv("TORCHLAB_TEST_INTERRUPT_AT", "13,14")  # both micro-batches of step 7: twice within a step
    assert headless(f"{TINY}:interrupts_itself", "--steps", "40", "--checkpoint-every", "3", "--accum", "2",
                    "--run-dir", str(run_dir)) == EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert "aborted; the checkpoints written so far are kept" in err and "Traceback" not in err
    monkeypatch.delenv("TORCHLAB_TEST_INTERRUPT_AT")
    assert headless("--resume", str(run_dir)) == EXIT_OK
    assert sorted(metrics(run_dir)) == list(range(1, 41))


MY_MODEL = '''
import torch
from torch.utils.data import TensorDataset
from torchlab.core.workload import Workload


def workload():
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    return Workload(model=torch.nn.Linear(4, 1), dataset=data, loss_fn=lambda model, batch: torch.nn.functional.mse_loss(model(batch[0]), batch[1]))
'''


def test_a_run_started_with_a_relative_workload_file_resumes_from_another_directory(tmp_path, monkeypatch):
    """Issue 27: the workload file was stored as typed (``my_model.py:workload``), so ``--resume`` from another
    directory looked for the file there. It is stored resolved, with a comment saying what was typed where."""
    project, elsewhere = tmp_path / "proj", tmp_path / "elsewhere"
    project.mkdir(), elsewhere.mkdir()
    (project / "my_model.py").write_text(MY_MODEL)
    flags = ["--eval-every", "0", "--telemetry-interval", "0"]
    monkeypatch.chdir(project)
    assert headless("my_model.py:workload", *flags, "--steps", "3", "--run-dir", "runs/mine") == EXIT_OK
    config = (project / "runs" / "mine" / "config.toml").read_text()
    assert f'workload = "{project / "my_model.py"}:workload"' in config
    assert f"# workload typed as my_model.py:workload in {project}" in config

    monkeypatch.chdir(elsewhere)
    assert headless("--resume", str(project / "runs" / "mine"), *flags, "--steps", "5") == EXIT_OK
    assert sorted(metrics(project / "runs" / "mine")) == [1, 2, 3, 4, 5]


def test_the_ctrl_c_hint_names_the_run_directory_absolute(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TORCHLAB_TEST_INTERRUPT_AT", "3")
    assert headless(f"{TINY}:interrupts_itself", "--steps", "10", "--run-dir", "run") == EXIT_INTERRUPTED
    assert f"resume with torchlab-tui --resume {tmp_path / 'run'}\n" in capsys.readouterr().err


def test_a_schedulers_warning_stops_at_the_step_with_a_checkpoint_and_says_how_to_resume(tmp_path, capsys, monkeypatch):
    """SIGUSR1 (Slurm's ``--signal``, ahead of the end of a job) as SIGTERM: the step ends, a checkpoint of it, the
    signal said in the journal and on the terminal, exit 130 as after Ctrl-C (core/engine/parallel/preemption.py)."""
    monkeypatch.setenv("TORCHLAB_TEST_INTERRUPT_AT", "3")
    monkeypatch.setenv("TORCHLAB_TEST_SIGNAL", "USR1")
    run = tmp_path / "run"
    assert headless(f"{TINY}:interrupts_itself", "--steps", "10", "--run-dir", str(run)) == EXIT_INTERRUPTED
    assert f"Stopped by SIGUSR1 at step 3, checkpointed there; resume with torchlab-tui --resume {run}\n" in capsys.readouterr().err
    journal = events(run)
    assert [e["reason"] for e in journal if e["event"] == "stop_requested"] == ["SIGUSR1: the run stops"]
    assert [e["step"] for e in journal if e["event"] == "checkpoint" and e["reason"] == "final"] == [3]


OWN_TRAINING = WORKLOADS / "own_training.py"


def test_config_records_the_workloads_own_optimizer_and_scheduler_not_defaults_that_never_applied(tmp_path):
    """Issue 27: a workload with its own optimizer and scheduler got ``optimizer = "adamw"``, ``lr = 0.001``,
    ``schedule = "cosine"`` in config.toml, and compare listed them as settings that differ. The record names its
    classes and each group's LR; the run resumes from it, and compare shows them in the rows they replace."""
    own, plain = tmp_path / "own", tmp_path / "plain"
    assert headless(f"{OWN_TRAINING}:workload", "--steps", "6", "--eval-every", "0", "--run-dir", str(own)) == EXIT_OK
    config = (own / "config.toml").read_text()
    settings = config.split("\n[")[0].splitlines()  # the top level, before the first table
    for never_applied in ("optimizer", "lr", "weight_decay", "schedule", "warmup_steps"):
        assert not [line for line in settings if line.startswith(f"{never_applied} =")], config
    assert ('[from_workload]\noptimizer = "torch.optim.SGD"\ngroups = ["body", "head"]\nlr = [0.05, 0.2]\n'
            'scheduler = "torch.optim.lr_scheduler.CosineAnnealingLR"\n') in config

    assert headless("--resume", str(own), "--steps", "8") == EXIT_OK  # the record is read back, and kept
    assert sorted(metrics(own)) == list(range(1, 9))
    assert "[from_workload]" in (own / "config.toml").read_text() and "steps = 8" in (own / "config.toml").read_text()

    assert headless(f"{TINY}:workload", "--steps", "6", "--eval-every", "0", "--run-dir", str(plain)) == EXIT_OK
    rows = dict(differences([RunHistory.load(own), RunHistory.load(plain)]))
    assert rows["optimizer"] == ["torch.optim.SGD (the workload's)", "adamw"]
    assert rows["lr"] == ["body 0.05 · head 0.2 (the workload's)", "0.001"]
    assert rows["schedule"] == ["torch.optim.lr_scheduler.CosineAnnealingLR (the workload's)", "cosine"]
    assert rows["weight_decay"] == ["the workload's", "0.01"]


@pytest.fixture
def two_steps(tmp_path) -> Path:
    """A run of two steps whose only checkpoint is of step 2."""
    run = tmp_path / "run"
    assert headless("mlp", "--steps", "2", "--run-dir", str(run)) == EXIT_OK
    return run


def dead_pid() -> int:
    """The pid of a process that has ended (its writes were cut short)."""
    process = subprocess.Popen([sys.executable, "-c", ""])
    process.wait()
    return process.pid


def test_a_run_killed_during_its_first_checkpoint_is_said_so_with_what_it_has_and_its_leftover_is_removed(two_steps, capsys):
    """Issue 46 item 12: the resume said only "no checkpoints/last.pt", and the unfinished write stayed for good."""
    checkpoints = two_steps / "checkpoints"
    leftover = checkpoints / f".step-0000002.pt.tmp-{dead_pid()}"  # as write_checkpoint names its temporary file
    (checkpoints / "step-0000002.pt").rename(leftover)
    (checkpoints / "last.pt").unlink()
    capsys.readouterr()
    assert headless("--resume", str(two_steps)) == EXIT_USAGE
    assert capsys.readouterr().err == (
        f"torchlab-tui: error: --resume {two_steps}: the run ended before its first checkpoint: it was stopped or killed "
        f"before writing one, or while writing it (what that write left, {leftover.name}, is removed now), so there is "
        f"nothing to continue from. It has 2 metrics rows (steps 1–2) in {two_steps / 'metrics.jsonl'}. Start it again "
        f"as a new run with the same settings: torchlab-tui --config {two_steps / 'config.toml'}\n")
    assert list(checkpoints.iterdir()) == []


def test_a_first_checkpoint_still_being_written_is_kept_and_a_step_file_without_last_pt_is_named(two_steps, capsys):
    import os

    checkpoints = two_steps / "checkpoints"
    (checkpoints / "last.pt").unlink()  # a kill between the step file's rename and last.pt's
    capsys.readouterr()
    assert headless("--resume", str(two_steps)) == EXIT_USAGE
    assert capsys.readouterr().err.endswith(f"but step-0000002.pt is there: resume from it, torchlab-tui --resume "
                                            f"{checkpoints / 'step-0000002.pt'}\n")
    writing = checkpoints / f".step-0000002.pt.tmp-{os.getpid()}"  # a live writer's: never another's to remove
    (checkpoints / "step-0000002.pt").rename(writing)
    assert headless("--resume", str(checkpoints)) == EXIT_USAGE
    assert f"its first is being written now, by process {os.getpid()}." in capsys.readouterr().err
    assert writing.exists()


def test_a_resume_at_another_world_size_is_journalled_as_a_change_of_it(tmp_path):
    """Found by the combination matrix: the error screen's restart (``--resume RUN --world-size 1``) of a 2-rank run
    trained at one rank, and impact.json began a segment there, while events.jsonl said nothing: compare, TensorBoard
    and attach showed no change. The supervisor, which knows the world size the ranks train with, adds it to the
    resume's ``resume_changed_settings``."""
    from torchlab.core.engine.ranks.supervisor import _with_world_size_change

    run_dir = tmp_path / "run"
    assert headless(f"{TINY}:workload", "--steps", "2", "--checkpoint-every", "2", "--eval-every", "0",
                    "--run-dir", str(run_dir)) == EXIT_OK
    checkpoint = run_dir / "checkpoints" / "last.pt"
    assert _with_world_size_change(None, checkpoint, 1) is None  # the checkpoint's own
    note = _with_world_size_change(None, checkpoint, 2)
    assert note == {"changes": [{"setting": "world_size", "stored": 1, "value": 2, "breaks_exactness": False}],
                    "message": "resumed with world_size 1 → 2", "level": "info"}
    lr = {"changes": [{"setting": "lr_scale", "stored": 1.0, "value": 0.5, "breaks_exactness": False}],
          "message": "resumed with lr_scale 1.0 → 0.5", "level": "info"}
    both = _with_world_size_change(lr, checkpoint, 2)
    assert [c["setting"] for c in both["changes"]] == ["lr_scale", "world_size"]
    assert both["message"] == "resumed with lr_scale 1.0 → 0.5 and world_size 1 → 2"  # said as the plan says it
