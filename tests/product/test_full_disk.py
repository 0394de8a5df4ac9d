"""A full disk costs nothing but the step it hit: on a real 3 MB file system (a tmpfs; skipped where
mounting one is not permitted, and tests/records/test_run_files.py covers the same logic by injected faults).

After each fault: the headless run exits 1 with one clear sentence and no traceback, no temporary file
is left in the run directory, every line of every ``.jsonl`` file parses, and ``last.pt`` loads.

The runs are ``cli.main`` in this process (a process of their own paid a torch import each, for the same code path;
tests/launch/test_cli.py checks that the installed command exits with what ``main`` returns).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tmpfs import ROOM_FOR_ONE_CHECKPOINT, leave_free, small_disk  # noqa: F401  (small_disk is a fixture: a 3 MB tmpfs)
from torchlab.core.engine.state.checkpoint import load_checkpoint
from torchlab.core.launch.cli import main


@dataclass
class Finished:
    """What a headless run returned and said."""

    returncode: int
    stdout: str
    stderr: str


def headless(capsys, *args: str) -> Finished:
    capsys.readouterr()  # what came before is not this run's
    code = main([*args, "--headless", "--telemetry-interval", "0", "--eval-every", "0"])
    said = capsys.readouterr()
    return Finished(code, said.out, said.err)


def assert_fails_clearly(result: Finished, sentence: str) -> None:
    assert result.returncode == 1, result.stderr
    assert sentence in result.stderr, result.stderr
    assert "Traceback (most recent call last)" not in result.stderr + result.stdout


def assert_whole(run: Path, last_step: int) -> None:
    """No temporary file; every line of every .jsonl parses; last.pt loads at ``last_step``."""
    assert [p.name for p in run.rglob("*") if ".tmp" in p.name] == []
    for journal in run.glob("*.jsonl"):
        text = journal.read_text()
        assert text == "" or text.endswith("\n"), f"{journal.name} ends in a torn line"
        for line in text.splitlines():
            json.loads(line)
    assert load_checkpoint(run / "checkpoints" / "last.pt")["step"] == last_step


def steps_in(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_a_full_disk_at_a_periodic_checkpoint_and_again_when_resumed_on_the_still_full_disk(small_disk, capsys):
    run = small_disk / "run"
    leave_free(small_disk, ROOM_FOR_ONE_CHECKPOINT)
    first = headless(capsys, f"{small_disk / 'workload.py'}:workload", "--steps", "15", "--checkpoint-every", "5",
                     "--run-dir", str(run))
    assert_fails_clearly(first, f"no space left on device writing the checkpoint of step 10 in {run / 'checkpoints'}; "
                                "the previous checkpoint (step-0000005.pt, which last.pt points at) is intact")
    assert_whole(run, 5)
    assert steps_in(run / "metrics.jsonl") == list(range(1, 11))

    resumed_on_full_disk = headless(capsys, "--resume", str(run))  # the trial: still full
    assert_fails_clearly(resumed_on_full_disk, "no space left on device writing the checkpoint of step 10")
    assert_whole(run, 5)
    assert steps_in(run / "metrics.jsonl") == list(range(1, 11))  # each step once
    assert steps_in(run / "metrics.replaced.jsonl") == [6, 7, 8, 9, 10]  # as the first run wrote them


def test_a_full_disk_at_the_final_checkpoint(small_disk, capsys):
    run = small_disk / "run"
    leave_free(small_disk, ROOM_FOR_ONE_CHECKPOINT)
    result = headless(capsys, f"{small_disk / 'workload.py'}:workload", "--steps", "7", "--checkpoint-every", "5",
                      "--run-dir", str(run))
    assert_fails_clearly(result, f"no space left on device writing the checkpoint of step 7 in {run / 'checkpoints'}; "
                                 "the previous checkpoint (step-0000005.pt, which last.pt points at) is intact")
    assert_whole(run, 5)


def test_a_resume_on_a_disk_with_no_space_at_all_fails_at_its_first_write_and_loses_nothing(small_disk, capsys):
    run = small_disk / "run"
    first = headless(capsys, f"{small_disk / 'workload.py'}:workload", "--steps", "8", "--checkpoint-every", "5",
                     "--run-dir", str(run))
    assert first.returncode == 0, first.stderr
    files = ["metrics.jsonl", "config.toml", "checkpoints/last.pt", "checkpoints/step-0000005.pt"]
    before = {name: (run / name).read_bytes() for name in files}
    events_before = (run / "events.jsonl").read_bytes()
    filler = leave_free(small_disk, 0)
    resumed = headless(capsys, "--resume", str(run / "checkpoints" / "step-0000005.pt"))
    assert_fails_clearly(resumed, "no space left on device writing ")
    assert "free some space, then resume" in resumed.stderr
    assert {name: (run / name).read_bytes() for name in files} == before
    assert (run / "events.jsonl").read_bytes().startswith(events_before)  # at most a line more, a whole one
    assert not (run / "metrics.replaced.jsonl").exists()
    assert_whole(run, 8)

    filler.unlink()
    resumed = headless(capsys, "--resume", str(run / "checkpoints" / "step-0000005.pt"))
    assert resumed.returncode == 0, resumed.stderr
    assert steps_in(run / "metrics.jsonl") == list(range(1, 9))
    assert steps_in(run / "metrics.replaced.jsonl") == [6, 7, 8]
    assert_whole(run, 8)


def test_a_full_disk_during_a_profile_fails_the_profile_not_the_run(small_disk, capsys):
    """The trace (about 750 kB here) does not fit; the journals and the final checkpoint do."""
    run = small_disk / "run"
    leave_free(small_disk, ROOM_FOR_ONE_CHECKPOINT)
    result = headless(capsys, f"{small_disk / 'workload.py'}:workload", "--steps", "8", "--checkpoint-every", "0",
                      "--profile-at", "2", "--profile-steps", "3", "--run-dir", str(run))
    assert result.returncode == 0, result.stderr
    assert "Traceback (most recent call last)" not in result.stderr
    [profile] = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if '"profile"' in line]
    assert profile["error"] == (
        f"no space left on device writing the profile of steps 3–5 in {run / 'profiles' / '0000002'}; none of it was "
        "kept, and training goes on: free some space, then profile again."
    )
    assert "profile failed" in result.stderr
    assert list((run / "profiles").iterdir()) == []
    assert_whole(run, 8)
