"""Faults the engine survives: a full disk, a kill -9 mid-checkpoint, a user's hook that raises.

A full disk is real here, not a mock: a path that is a symlink to /dev/full fails every write with
ENOSPC, exactly as a full filesystem does.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from trainers import TINY, make_trainer
from torchlab.core.engine.state.checkpoint import load_checkpoint, save_checkpoint
from torchlab.core.errors import EXIT_FAILED, EXIT_USAGE
from torchlab.core.errors import StorageError
from torchlab.core.launch.cli import main

WORKLOADS = Path(__file__).parent.parent / "workloads" / "tiny.py"

pytestmark = pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full to make a disk that is full")


def _full_disk_at(path: Path) -> None:
    path.symlink_to("/dev/full")


def test_a_full_disk_during_a_checkpoint_is_a_clear_error_and_the_previous_one_loads(tmp_path, links_followed):
    save_checkpoint(tmp_path, 1, {"weights": torch.ones(3)}, keep=3)
    _full_disk_at(tmp_path / f".step-0000002.pt.tmp-{os.getpid()}")
    with pytest.raises(StorageError) as raised:
        save_checkpoint(tmp_path, 2, {"weights": torch.zeros(3)}, keep=3)
    message = str(raised.value)
    assert "no space left on device writing the checkpoint of step 2" in message
    assert "step-0000001.pt" in message and "intact" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "step-0000001.pt"]  # no temporary left behind
    assert torch.equal(load_checkpoint(tmp_path / "last.pt")["weights"], torch.ones(3))


def test_a_full_disk_mid_run_fails_the_run_with_that_message_and_keeps_the_last_checkpoint(tmp_path, links_followed):
    trainer, seen = make_trainer(steps=6, checkpoint_dir=tmp_path, checkpoint_every=2, telemetry_interval=0)
    _full_disk_at(tmp_path / f".step-0000004.pt.tmp-{os.getpid()}")
    outcome = trainer.run()
    assert outcome.status == "failed" and outcome.step == 4
    assert "writing the checkpoint of step 4" in outcome.message and "step-0000002.pt" in outcome.message
    [error] = seen.of("error")
    assert error["message"] == outcome.message  # the app hears it even though the disk cannot record it
    assert load_checkpoint(tmp_path / "last.pt")["step"] == 2


def test_a_periodic_checkpoint_that_fails_while_made_durable_stops_the_run_before_the_next_row(tmp_path, monkeypatch):
    """A periodic checkpoint's fsync and renames run while the next step trains; a disk that fails only
    there (an fsync's EIO) still stops the run before that step's metrics row, naming the checkpoint."""
    from torchlab.core.engine.state import checkpoint as checkpoint_module

    real_fsync = os.fsync

    def fsync_failing_for_step_4(descriptor: int) -> None:
        if os.readlink(f"/proc/self/fd/{descriptor}").endswith(f".step-0000004.pt.tmp-{os.getpid()}"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(descriptor)

    monkeypatch.setattr(checkpoint_module.os, "fsync", fsync_failing_for_step_4)
    trainer, seen = make_trainer(steps=8, checkpoint_dir=tmp_path, checkpoint_every=2, telemetry_interval=0)
    outcome = trainer.run()
    assert outcome.status == "failed" and outcome.error is StorageError
    assert outcome.message.startswith(f"input/output error writing the checkpoint of step 4 in {tmp_path}; ")
    assert "step-0000002.pt" in outcome.message and "(then:" not in outcome.message  # no other checkpoint tried
    assert [record.step for record in seen.metrics] == [1, 2, 3, 4]  # step 5 trained, its row never written
    assert [event["step"] for event in seen.of("checkpoint")] == [2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "step-0000002.pt"]  # no temporary left
    assert load_checkpoint(tmp_path / "last.pt")["step"] == 2


def test_a_periodic_checkpoint_is_reported_before_the_next_row_and_is_whole(tmp_path):
    trainer, seen = make_trainer(steps=7, checkpoint_dir=tmp_path, checkpoint_every=2, telemetry_interval=0,
                                 keep_checkpoints=2)
    order = []
    seen.on_metrics = lambda row: order.append(("row", row.step))
    seen.on_event = lambda event: order.append((event.journal_record()["event"], event.journal_record()["step"]))
    assert trainer.run().status == "finished"
    assert [item for item in order if item[0] in ("row", "checkpoint")] == [
        ("row", 1), ("row", 2), ("checkpoint", 2), ("row", 3), ("row", 4), ("checkpoint", 4), ("row", 5), ("row", 6),
        ("checkpoint", 6), ("row", 7), ("checkpoint", 7)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "step-0000006.pt", "step-0000007.pt"]
    assert load_checkpoint(tmp_path / "last.pt")["step"] == 7


def test_a_periodic_checkpoint_is_reported_while_the_run_is_paused_after_it(tmp_path):
    """Paused right after a periodic checkpoint, the run reports it at once, not when the pause ends."""
    import threading

    from torchlab.core.wire.protocol import PauseCommand, StopCommand

    trainer, seen = make_trainer(steps=50, checkpoint_dir=tmp_path, checkpoint_every=2, telemetry_interval=0)
    paused = threading.Event()
    reported = threading.Event()

    def on_metrics(row) -> None:
        if row.step == 2:
            trainer.submit(PauseCommand())
            paused.set()

    names = []

    def on_event(event) -> None:
        names.append(event.journal_record()["event"])
        if names[-1] == "checkpoint":
            reported.set()

    seen.on_metrics, seen.on_event = on_metrics, on_event
    runner = threading.Thread(target=trainer.run)
    runner.start()
    try:
        assert paused.wait(60)
        assert reported.wait(60)  # while paused at step 2: nothing else would report it
        assert trainer.step == 2
        assert names.index("checkpoint") < names.index("paused")  # step 2's checkpoint, then the pause at its end
    finally:
        trainer.submit(StopCommand())
        runner.join(60)
    assert load_checkpoint(tmp_path / "last.pt")["step"] == 2


def test_a_full_disk_for_the_metrics_stops_the_run_with_a_clear_message(tmp_path, capsys, links_followed):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)  # a run is private unless --shared-run-dir
    _full_disk_at(run / "metrics.jsonl")
    code = main([TINY, "--headless", "--steps", "5", "--run-dir", str(run), "--telemetry-interval", "0"])
    assert code == EXIT_FAILED
    output = capsys.readouterr()
    assert "writing metrics.jsonl" in output.out + output.err
    assert "no space left on device" in output.out + output.err
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert events[-1]["event"] in ("error", "checkpoint", "run_ended")
    assert any(e["event"] == "error" and "metrics.jsonl" in e["message"] for e in events)
    assert load_checkpoint(run / "checkpoints" / "last.pt")["step"] == 1  # the step that completed is kept


KILLED_MID_WRITE = textwrap.dedent("""
    import sys, torch
    from pathlib import Path
    from torchlab.core.engine.state.checkpoint import save_checkpoint

    directory = Path(sys.argv[1])
    save_checkpoint(directory, 1, {"weights": torch.ones(1000)}, keep=3)
    real_save = torch.save

    def half_then_wait(obj, handle):
        handle.write(b"half of a checkpoint")
        handle.flush()
        print("mid-write", flush=True)
        sys.stdin.read()  # until killed

    torch.save = half_then_wait
    save_checkpoint(directory, 2, {"weights": torch.zeros(1000)}, keep=3)
""")


def test_kill_9_during_a_checkpoint_write_leaves_the_previous_checkpoint_loadable(tmp_path):
    writer = subprocess.Popen(
        [sys.executable, "-c", KILLED_MID_WRITE, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout.readline().strip() == "mid-write"
        writer.send_signal(signal.SIGKILL)
        assert writer.wait(timeout=30) == -signal.SIGKILL
    finally:
        if writer.poll() is None:
            writer.kill()
    abandoned = tmp_path / f".step-0000002.pt.tmp-{writer.pid}"
    assert abandoned.exists() and not (tmp_path / "step-0000002.pt").exists()
    assert torch.equal(load_checkpoint(tmp_path / "last.pt")["weights"], torch.ones(1000))
    assert torch.equal(load_checkpoint(tmp_path)["weights"], torch.ones(1000))
    save_checkpoint(tmp_path, 3, {"weights": torch.full((1000,), 3.0)}, keep=3)  # the next save tidies up
    assert not abandoned.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "step-0000001.pt", "step-0000003.pt"]


def test_a_live_writers_temporary_file_is_left_alone(tmp_path):
    other = tmp_path / f".step-0000009.pt.tmp-{os.getppid()}"  # the test runner's parent: alive
    other.write_bytes(b"being written")
    save_checkpoint(tmp_path, 1, {"step": 1}, keep=3)
    assert other.exists()


def test_an_exception_in_a_users_forward_hook_is_reported_with_its_traceback(tmp_path, capsys):
    run = tmp_path / "run"
    code = main([f"{WORKLOADS}:forward_hook_raises", "--headless", "--steps", "3", "--run-dir", str(run), "--telemetry-interval", "0"])
    assert code == EXIT_FAILED
    output = capsys.readouterr()
    assert "the user's forward hook failed on purpose" in output.out + output.err
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    [error] = [event for event in events if event["event"] == "error"]
    # led by the user's line, where the hook raised (issue 45: the engine's frames led, at the top of the traceback)
    assert error["message"].startswith(f"{WORKLOADS}:") and "in __call__(): ValueError: the user's forward hook failed on purpose\n    raise ValueError(" in error["message"]
    assert "in __call__" in error["traceback"] and "tiny.py" in error["traceback"]
    assert error["step"] == 3 and load_checkpoint(run / "checkpoints" / "last.pt")["step"] == 2
    assert events[-1]["event"] == "checkpoint" and events[-1]["reason"] == "error"  # step 2, kept


def test_a_workloads_own_exception_at_a_later_step_leads_with_the_users_line(tmp_path, capsys):
    """Issue 45: 'ValueError: corrupt shard 7...' at step 6 said no file or line; the traceback's visible top was the
    engine's. The message leads with the user's frame, its file, line and code, and says the step it failed at."""
    helper = Path(__file__).parent.parent / "workloads" / "failing_later.py"
    code = main([f"{helper}:raises_in_a_helper_at_step_6", "--headless", "--steps", "10", "--run-dir", str(tmp_path / "run"),
                 "--telemetry-interval", "0"])
    assert code == EXIT_FAILED
    said = capsys.readouterr().err
    line = next(number for number, text in enumerate(helper.read_text().splitlines(), 1) if "raise ValueError(f\"corrupt shard" in text)
    assert (f"Training failed at step 6: {helper}:{line} in read_shard(): ValueError: corrupt shard 7: header checksum "
            f"mismatch\n    raise ValueError(f\"corrupt shard {{index}}: header checksum mismatch\")") in said


def test_a_resumed_process_that_fails_on_its_first_step_says_the_step_not_the_first_training_step(tmp_path, capsys):
    """Issue 45: a relaunch at step 334 that failed on step 335 said 'the first training step failed' (and blamed the
    dataset's batches), after 334 good steps: the first of its process, not of the run."""
    helper = Path(__file__).parent.parent / "workloads" / "failing_later.py"
    run = tmp_path / "run"
    flags = ["--headless", "--run-dir", str(run), "--telemetry-interval", "0"]
    assert main([f"{helper}:fails_from_step_3", "--steps", "6", "--checkpoint-every", "1", *flags]) == EXIT_FAILED
    capsys.readouterr()
    assert main(["--resume", str(run), *flags]) == EXIT_USAGE
    said = " ".join(capsys.readouterr().err.split())
    assert "in forward(): training step 3, the first of this process (resumed after step 2), failed: RuntimeError" in said
    assert "the first training step failed" not in said
