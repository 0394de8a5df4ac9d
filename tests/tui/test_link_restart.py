"""ProcessLink's restart, with a stand-in trainer (a process that only waits): what it resumes from,
and what it says when the new trainer is killed before it reports anything."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from torchlab.core.wire.protocol import Error, Message
from torchlab.tui.link import ProcessLink


def stand_in_trainer(tmp_path: Path) -> Path:
    """An executable the link starts in place of Python: it takes any arguments and waits to be killed."""
    path = tmp_path / "stand-in-trainer"
    path.write_text("#!/bin/sh\nexec sleep 600\n")
    path.chmod(0o755)
    return path


def run_with_checkpoints(run_dir: Path, *steps: int, last: int) -> None:
    checkpoints = run_dir / "checkpoints"
    checkpoints.mkdir(parents=True)
    for step in steps:
        (checkpoints / f"step-{step:07d}.pt").write_bytes(b"not loaded: the app never imports torch")
    os.link(checkpoints / f"step-{last:07d}.pt", checkpoints / "last.pt")


def next_error(link: ProcessLink) -> Error:
    """The link's next Error message (its reader thread reports the trainer's exit)."""
    seen: list[Message] = []
    while True:
        assert link.arrived.wait(30), f"no error from the link; it said {seen}"
        link.arrived.clear()
        seen += link.drain()
        errors = [message for message in seen if isinstance(message, Error)]
        if errors:
            return errors[0]


def test_a_restarted_trainer_killed_before_it_reports_failed_after_the_step_of_its_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    run_with_checkpoints(run_dir, 50, 100, last=100)
    link = ProcessLink(run_dir, ["mlp", "--amp", "bf16"], python=str(stand_in_trainer(tmp_path)))
    link.last_step = 146  # how far the trainer before it got
    assert link.restart_point() == "step-0000100.pt, step 100"

    link.restart()
    try:
        assert link.process.args[-3:] == ["--", "--resume", str(run_dir)]  # not the first flags: they would override
        os.kill(link.pid, signal.SIGKILL)
        error = next_error(link)
    finally:
        link.close()
    assert error.step == 100, "it resumed at step 100 and was killed before it reported: not step 0, not 146"
    assert "was killed by signal 9 (SIGKILL) after step 100" in error.message

