"""A hang explained (core/engine/parallel/hang_watch.py): rank 1 stops in a forward for an hour (tests/workloads/tiny.py
``hangs_on_rank_1``); within ``--hang-after`` times the usual step (at least 10 s) both ranks write where they are,
and rank 0 journals and says which rank is where: rank 1 at the workload's line, rank 0 waiting in its backward, with
the run's last checkpoint. A stop then (Ctrl-C) ends the run at once, naming that checkpoint, every rank gone."""

from __future__ import annotations

import json
import os
import re
import re
import signal
import subprocess
import sys
import time

from test_ranks import TINY, read_jsonl
from torchlab.core.errors import EXIT_FAILED
from torchlab.core.engine.parallel.hang_watch import HANG_MIN_S


def test_a_rank_stuck_in_its_forward_is_named_with_its_line_and_every_ranks_stack_is_kept(tmp_path):
    run = tmp_path / "run"
    marked = next(number for number, line in enumerate(TINY.read_text().splitlines(), 1) if line.endswith("  # HANG"))
    command = [sys.executable, "-m", "torchlab.core.launch.cli", f"{TINY}:hangs_on_rank_1", "--headless", "--world-size",
               "2", "--steps", "100", "--eval-every", "0", "--checkpoint-every", "5", "--hang-after", "3",
               "--run-dir", str(run), "--telemetry-interval", "0"]
    running = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + HANG_MIN_S + 90
        hangs: list[dict] = []
        while not hangs and time.monotonic() < deadline and running.poll() is None:
            time.sleep(0.2)
            hangs = [event for event in read_jsonl(run / "events.jsonl") if event["event"] == "hang"] if (run / "events.jsonl").exists() else []
        assert hangs, "no hang was said"
        os.kill(running.pid, signal.SIGINT)  # Ctrl-C: a stop, which no boundary will take: the run ends at its hang
        _, said = running.communicate(timeout=60)
    finally:
        if running.poll() is None:
            os.killpg(running.pid, signal.SIGKILL)
            running.communicate()
    last = run / "checkpoints" / "step-0000010.pt"
    assert running.returncode == EXIT_FAILED, said
    assert "Ended at a hang: step 12 hung; ended as asked (" in " ".join(said.split()), said
    assert f"its last checkpoint is step 10's ({last}), what --resume starts from" in " ".join(said.split()), said
    [error] = [event for event in read_jsonl(run / "events.jsonl") if event["event"] == "error"]
    assert error["step"] == 12 and "with no final checkpoint (its ranks are stuck)" in error["message"]
    [hang] = hangs
    assert hang["step"] == 12 and hang["waited_s"] >= HANG_MIN_S
    assert (hang["checkpoint_step"], hang["checkpoint"]) == (10, str(last))
    explanation = hang["explanation"]
    assert f"rank 1 at workloads/tiny.py:{marked} in stop_on_rank_1 (`time.sleep(3600)  # HANG`)" in explanation, explanation
    # torch's own count of the collectives each rank issued: rank 0 has issued DDP's gradient all_reduce of step 12,
    # which rank 1, asleep in its forward, never reached
    issued = {int(rank): int(count.replace(",", "")) for rank, count in re.findall(r"rank (\d) at [^;]*?, ([\d,]+) collectives issued", explanation)}
    assert issued.keys() == {0, 1} and issued[0] > issued[1], explanation
    assert "rank 1 is behind: the others wait in a collective it has not issued" in explanation
    folder = run / "hangs" / "step-0000012"
    assert hang["folder"] == str(folder) and sorted(path.name for path in folder.iterdir()) == ["rank-0.txt", "rank-1.txt"]
    rank_1 = (folder / "rank-1.txt").read_text()
    assert json.loads(rank_1.splitlines()[0])["issued"] == issued[1] and f'tiny.py", line {marked} in stop_on_rank_1' in rank_1
    assert folder.stat().st_mode & 0o777 == 0o700  # as private as the run


def test_under_torchrun_on_hang_end_ends_the_run_where_it_hangs_and_every_rank_leaves(tmp_path):
    """Under torchrun rank 0's process is the run's: its records are the supervisor's observers' (the journal, the
    headless lines), reached through the relay as it leaves; rank 1, asleep in its forward, takes the agent's SIGTERM
    as a stop during its own hang and leaves too, instead of being waited out for torchrun's 30 s before a SIGKILL."""
    run = tmp_path / "run"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "torchlab.core.launch.cli", f"{TINY}:hangs_on_rank_1", "--headless", "--steps", "100",
               "--eval-every", "0", "--checkpoint-every", "5", "--hang-after", "3", "--on-hang", "end",
               "--run-dir", str(run), "--telemetry-interval", "0"]
    ended = subprocess.run(command, capture_output=True, text=True, timeout=HANG_MIN_S + 90)
    said = " ".join(ended.stderr.split())
    assert ended.returncode == EXIT_FAILED and "Ended at a hang: step 12 hung; ended as asked (--on-hang end)" in said, said
    assert "Unable to shutdown process" not in said  # rank 1 left on the agent's SIGTERM: no SIGKILL after its grace
    [error] = [event for event in read_jsonl(run / "events.jsonl") if event["event"] == "error"]
    assert error["message"].startswith("step 12 hung; ended as asked (--on-hang end)")
