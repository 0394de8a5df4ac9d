"""``kill -9`` at random moments, hundreds of times: is every step a checkpoint holds still in ``metrics.jsonl``?

    .venv/bin/python benchmarks/stress_kills.py --kills 200 --seed 1      # ~15 minutes on a 2-core VM

docs/run-files.md promises that a kill loses "never a row of a step a checkpoint holds": a resume from ``last.pt`` trains
only the steps after it, so a row of a step up to it that is not in ``metrics.jsonl`` then is lost for good (issue
46 saw seven lost once in 22 kills: ``last.pt`` at step 231, the rows ending at 224).

Each kill starts ``torchlab-tui --headless`` on benchmarks/spiking_workload.py (a few ms a step) with a checkpoint
every 7 steps and the spike guard rolling back every 17 steps, so that checkpoints, rollbacks and their events are
close together; waits until it trains (or, one time in ``AT_LAUNCH_ONE_IN``, not: a kill while it starts or resumes,
where a resume moves replayed rows aside), then a random moment more, and for half of those kills on until a new
``last.pt`` lands (polled: the moment after a checkpoint's rename, before the next step, is where a row not yet
written is lost); and kills its whole process group with SIGKILL. Then it checks the run directory:

- ``last.pt`` loads (its digest, its entries: what a resume reads) and holds step S;
- every step 1..S has its row in ``metrics.jsonl`` (a step missing is a row lost);
- no step has two rows (a resume moves the rows it trains again aside; a duplicate is a row it failed to move);
- every line parses (each row is one ``write``: a kill cannot tear one).

The next kill resumes that run (``--resume RUN``), so each kill after the first of a run also checks a resume and
the rows it moved aside (a row lost is counted once, at the kill that lost it); after ``--kills-per-run`` kills (or
a kill before the first checkpoint, which leaves nothing to resume) a new run starts. Prints the kills, the rows
checked (the sum of S over the kills), the rows lost, and each finding.

World size 1 only (the headless path every single-process run takes, the app's too); with ranks the supervisor
writes the rows rank 0 sends, and tests/engine/test_rows_before_checkpoint.py checks that rank 0 waits for them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = f"{ROOT / 'benchmarks' / 'spiking_workload.py'}:workload"
CLI = str(Path(sys.executable).with_name("torchlab-tui"))
TRAIN = ["--headless", "--steps", "1000000", "--checkpoint-every", "7", "--spike-guard", "rollback",
         "--telemetry-interval", "0.2"]
#: A kill lands this long at most after the run's first new row (a few hundred steps of the workload).
MAX_TRAINING_S = 1.0
#: One kill in this many lands at a random moment of the start instead (loading, resuming, the first steps).
AT_LAUNCH_ONE_IN = 8
MAX_LAUNCH_S = 4.0
#: Of the kills mid-run, this share waits for a new last.pt after the random moment, and kills within this long of it.
AFTER_CHECKPOINT_SHARE, AFTER_CHECKPOINT_S = 0.5, 0.002
#: A start that trains no step in this long is a finding of its own.
STALLED_AFTER_S = 120.0


@dataclass
class Tally:
    kills: int = 0
    rows_checked: int = 0
    rows_lost: int = 0
    duplicates: int = 0
    lost_in_this_run: set[int] = field(default_factory=set)  # counted once, though every later kill sees them
    findings: list[str] = field(default_factory=list)


def metrics_steps(run: Path) -> tuple[list[int], int]:
    """The steps of ``metrics.jsonl``'s rows in file order, and how many lines did not parse."""
    steps, torn = [], 0
    try:
        lines = (run / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    except FileNotFoundError:
        return [], 0
    for line in lines:
        try:
            steps.append(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            torn += 1
    return steps, torn


def rows_written(run: Path) -> int:
    try:
        return (run / "metrics.jsonl").stat().st_size
    except FileNotFoundError:
        return 0


def start(run: Path, resume: bool) -> subprocess.Popen:
    """A headless run in ``run`` (new, or resumed from its last.pt), in a process group of its own."""
    args = [CLI, *TRAIN, "--resume", str(run)] if resume else [CLI, WORKLOAD, *TRAIN, "--run-dir", str(run)]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def checkpoint_landed(last: Path) -> int:
    """``last.pt``'s inode (0: none yet): each checkpoint's rename gives it a new one."""
    try:
        return last.stat().st_ino
    except FileNotFoundError:
        return 0


def kill_at_random(process: subprocess.Popen, run: Path, rng: random.Random) -> str:
    """Wait for the moment, SIGKILL the process group; what happened, if not a kill mid-run."""
    after_checkpoint = False
    if rng.randrange(AT_LAUNCH_ONE_IN) == 0:
        wait_s = rng.uniform(0.0, MAX_LAUNCH_S)
    else:
        after_checkpoint = rng.random() < AFTER_CHECKPOINT_SHARE
        before, started = rows_written(run), time.monotonic()
        while rows_written(run) == before and process.poll() is None:  # polled: a benchmark, not a test
            if time.monotonic() - started > STALLED_AFTER_S:
                break
            time.sleep(0.01)
        wait_s = rng.uniform(0.0, MAX_TRAINING_S)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and process.poll() is None:
        time.sleep(min(0.01, max(0.0, deadline - time.monotonic())))
    if after_checkpoint:
        last = run / "checkpoints" / "last.pt"
        landed, started = checkpoint_landed(last), time.monotonic()
        while checkpoint_landed(last) == landed and process.poll() is None and time.monotonic() - started < STALLED_AFTER_S:
            pass  # spun, not slept: the moment after the rename lasts a step (a few ms)
        time.sleep(rng.uniform(0.0, AFTER_CHECKPOINT_S))
    ended = process.poll()
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _, stderr = process.communicate()
    if ended is not None:
        return f"exited {ended} before the kill: {stderr.decode(errors='replace').strip()[-400:]}"
    return ""


def check(run: Path, tally: Tally, label: str) -> bool:
    """The invariant after a kill; whether the run has a checkpoint to resume from."""
    from torchlab.core.engine.state.checkpoint import load_training_state
    from torchlab.core.errors import ConfigError

    last = run / "checkpoints" / "last.pt"
    steps, torn = metrics_steps(run)
    if torn:
        tally.findings.append(f"{label}: {torn} line(s) of metrics.jsonl do not parse")
    seen, duplicates = set(), 0
    for step in steps:
        duplicates += step in seen
        seen.add(step)
    if duplicates:
        tally.duplicates += duplicates
        tally.findings.append(f"{label}: {duplicates} duplicate row(s) in metrics.jsonl")
    if not last.exists():
        return False
    try:
        held = load_training_state(last).step
    except ConfigError as error:
        tally.findings.append(f"{label}: last.pt does not load: {error}")
        return False
    missing = [step for step in range(1, held + 1) if step not in seen and step not in tally.lost_in_this_run]
    tally.rows_checked += held
    if missing:
        tally.lost_in_this_run.update(missing)
        tally.rows_lost += len(missing)
        tally.findings.append(f"{label}: last.pt at step {held}, {len(missing)} row(s) lost: steps {missing[0]}–{missing[-1]}"
                              f" (metrics.jsonl ends at {steps[-1] if steps else 'nothing'})")
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kills-per-run", type=int, default=5, help="kills of one run (each after the first a resume)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    tally, began = Tally(), time.monotonic()
    with tempfile.TemporaryDirectory(prefix="stress-kills-") as folder:
        run, kills_of_run, runs = None, 0, 0
        while tally.kills < args.kills:
            if run is None or kills_of_run >= args.kills_per_run:
                runs += 1
                run, kills_of_run = Path(folder) / f"run{runs}", 0
                tally.lost_in_this_run.clear()
            process = start(run, resume=kills_of_run > 0)
            label = f"run {runs}, kill {kills_of_run + 1}"
            note = kill_at_random(process, run, rng)
            tally.kills += 1
            kills_of_run += 1
            if note and "Finished" not in note:
                tally.findings.append(f"{label}: {note}")
            if not check(run, tally, label):
                run = None  # nothing to resume: a new run next
            if tally.kills % 20 == 0:
                print(f"{tally.kills} kills, {tally.rows_checked:,} rows checked, {tally.rows_lost} lost "
                      f"({time.monotonic() - began:.0f} s)", flush=True)
    for finding in tally.findings:
        print(finding)
    print(f"{tally.kills} kills of {runs} runs (seed {args.seed}): {tally.rows_checked:,} rows checked, "
          f"{tally.rows_lost} rows lost, {tally.duplicates} duplicate rows, {len(tally.findings)} finding(s); "
          f"{time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
