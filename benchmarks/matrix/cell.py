"""One cell of the matrix, run for real: the headless CLI in subprocesses, a run directory under a temporary folder,
then the run event (a resume, a kill -9 and a resume, a trial, compare's history) and the figures (export, or
TensorBoard written live), and the invariants (invariants.py) over what they left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.matrix import invariants
from benchmarks.matrix.factors import (APP_EVENTS, CHANGE_AT, ROOT, changed_option, changed_value, model_skipped,
                                       run_length, start_flags, start_options)
from benchmarks.matrix.invariants import Evidence, Process
from benchmarks.matrix.rules import expected_refusal
from benchmarks.matrix.workloads.out_of_memory import LIMIT_FILE, PIECES
from torchlab.core.options import OPTIONS_BY_NAME

CLI = str(Path(sys.executable).with_name("torchlab-tui"))
#: Flags every cell trains with: checkpoints and evaluations inside its few steps, no telemetry thread.
COMMON = ["--headless", "--seed", "0", "--checkpoint-every", "2", "--eval-every", "3", "--eval-batches", "2",
          "--telemetry-interval", "0"]
#: A process of a cell that runs longer than this is a hang, a finding of its own.
PROCESS_TIMEOUT_S = 600
#: A kill -9 (or stop) cell is killed (stopped) once a checkpoint has landed and KILL_AFTER rows are written.
KILL_AFTER = 4
#: How often a kill -9 cell looks at the run's files: its few steps take tens of milliseconds each.
POLL_S = 0.01


@dataclass
class Verdict:
    cell: dict[str, str]
    outcome: str  # "ok", "refused as expected", "skipped: ...", "FAILED"
    failures: list[tuple[str, str]]  # (invariant, what broke)
    wall_s: float
    commands: list[str]
    landed: str = ""  # where a kill or a stop landed: "killed after step 7, last.pt at step 6"


def _run(argv: list[str], evidence: Evidence) -> Process:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S, start_new_session=True,
                          env=evidence.env)
    process = Process(argv, done.returncode, done.stdout, done.stderr)
    evidence.processes.append(process)
    return process


def _kill_mid_run(argv: list[str], evidence: Evidence) -> Process:
    """Start the run, wait (polling) until a checkpoint of step KILL_AFTER or later has landed, SIGKILL its group."""
    last = evidence.run / "checkpoints" / "last.pt"
    started = time.monotonic()
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, env=evidence.env) as running:
        while running.poll() is None and time.monotonic() - started < PROCESS_TIMEOUT_S:
            if last.exists() and len(evidence.rows()) >= KILL_AFTER:
                os.killpg(running.pid, signal.SIGKILL)
                break
            time.sleep(POLL_S)
        stdout, stderr = running.communicate()
    # killed on purpose: the kill's exit status is no finding, its terminal's tracebacks are
    process = Process(argv, 0 if running.returncode == -signal.SIGKILL else running.returncode, stdout, stderr)
    evidence.processes.append(process)
    if last.exists() and evidence.rows():
        from torchlab.core.engine.state.checkpoint import load_checkpoint

        evidence.killed_at = (load_checkpoint(last)["step"], max(row["step"] for row in evidence.rows()))
    return process


def _stop_mid_run(argv: list[str], evidence: Evidence, *, to_a_rank: bool = False) -> None:
    """Start the run, wait (polling) until a checkpoint and KILL_AFTER rows have landed, then stop it as a headless
    run is stopped from another terminal: SIGTERM to its process (README: the next step boundary, a checkpoint,
    exit 130). (``torchlab-tui stop`` stops runs of the app, attached or detached, not headless ones.) ``to_a_rank``:
    a scheduler's warning instead, SIGUSR1 to the last rank's process where there are ranks (docs/ranks.md,
    "Preemption": every rank stops at the same step), to the trainer itself where there are none. Records where it
    stopped: last.pt's step and its last row's."""
    last = evidence.run / "checkpoints" / "last.pt"
    started = time.monotonic()
    signalled = False
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, env=evidence.env) as running:
        while running.poll() is None and time.monotonic() - started < PROCESS_TIMEOUT_S:
            if last.exists() and len(evidence.rows()) >= KILL_AFTER:
                target = _last_rank(evidence) if to_a_rank else None
                os.kill(target or running.pid, signal.SIGUSR1 if to_a_rank else signal.SIGTERM)
                signalled = True
                break
            time.sleep(POLL_S)
        try:
            stdout, stderr = running.communicate(timeout=PROCESS_TIMEOUT_S)
        except subprocess.TimeoutExpired:  # a stop that never comes: the hang is the finding (exit -9 below)
            os.killpg(running.pid, signal.SIGKILL)
            stdout, stderr = running.communicate()
    # stopped on purpose: 130 is the status a stopped headless run owes (each_process_exits_0 judges the rest)
    evidence.processes.append(Process(argv, 0 if signalled and running.returncode == 130 else running.returncode,
                                      stdout, stderr))
    if signalled and running.returncode == 130:
        from torchlab.core.engine.state.checkpoint import load_checkpoint

        evidence.stopped_at = (load_checkpoint(last)["step"], max(row["step"] for row in evidence.rows()))


def _last_rank(evidence: Evidence) -> int | None:
    """The process of the run's last rank, from its newest ``run_started`` (None: one process, no ranks)."""
    started = [event for event in evidence.events() if event.get("event") == "run_started"]
    ranks = (started[-1].get("ranks") or []) if started else []
    return ranks[-1]["pid"] if len(ranks) > 1 else None


def run_cell(cell: dict[str, str], cuda: bool) -> Verdict:
    started = time.monotonic()
    skipped = model_skipped(cell["model"])
    if skipped:
        return Verdict(cell, f"skipped: {cell['model']} {skipped}", [], 0.0, [])
    with tempfile.TemporaryDirectory(prefix="torchlab-matrix-") as folder:
        evidence = Evidence(run=Path(folder) / "run", scripted=None if cell["live_change"] == "none" else cell["live_change"])
        checks = _play(cell, cuda, evidence, Path(folder))
        failures = []
        for check in checks:
            try:
                problem = check(evidence)
            except Exception as error:  # a check that cannot read what the run left: that is the finding
                problem = f"{type(error).__name__}: {error}"
            if problem:
                failures.append((check.__name__, problem))
        refused = evidence.refusal_word is not None
        outcome = "FAILED" if failures else ("refused as expected" if refused else "ok")
        return Verdict(cell, outcome, failures, time.monotonic() - started,
                       [" ".join(process.argv) for process in evidence.processes], _landed(evidence))


def _landed(evidence: Evidence) -> str:
    for word, at in (("killed", evidence.killed_at), ("stopped", evidence.stopped_at)):
        if at is not None:
            return f"{word} after step {at[1]}, last.pt at step {at[0]}, {len(evidence.replaced())} steps trained again"
    return ""


def _play(cell: dict[str, str], cuda: bool, evidence: Evidence, folder: Path) -> list[Callable[[Evidence], str | None]]:
    """Run the cell's processes; the checks that apply to what they did."""
    steps = run_length(cell)
    if cell["live_change"] == "steps":
        steps = changed_value(OPTIONS_BY_NAME["steps"], start_options(cell))
    train = [CLI, *start_flags(cell), *COMMON, "--run-dir", str(evidence.run)]
    if cell["figures"] == "live_tensorboard":
        evidence.tensorboard = folder / "tensorboard"
        train += ["--tensorboard", str(evidence.tensorboard)]
    if cell["run_event"] == "trial":
        train += ["--trial", f"{CHANGE_AT}:checkpointing={'off' if cell['checkpointing'] == 'on' else 'on'}",
                  "--trial-steps", "2"]
    evidence.env = dict(os.environ)
    if cell["device"] == "half_batch":  # the small device's limit, the same for every process of the cell
        evidence.env[LIMIT_FILE] = str(folder / "device-limit")
        evidence.env[PIECES] = str((1 if cell["parallel"] == "one" else 2) * (2 if cell["batching"] == "split2" else 1))
    if cell["run_event"] in APP_EVENTS:  # the cell's runs listed apart from the user's, for attach to find
        (folder / "runtime").mkdir(mode=0o700)
        evidence.env.update(XDG_RUNTIME_DIR=str(folder / "runtime"), PYTHONPATH=str(ROOT))
    evidence.refusal_word = expected_refusal(cell, cuda)
    if evidence.refusal_word:
        _run([*train, "--steps", str(steps)], evidence)
        return list(invariants.REFUSED)

    checks = list(invariants.TRAINED)
    if cell["device"] == "half_batch":
        checks.append(invariants.out_of_memory_rescued)
    resume = [CLI, "--headless", "--resume", str(evidence.run)]
    event = cell["run_event"]
    if event in APP_EVENTS:
        option, value = changed_option(cell) or ("none", "")
        at = train.index("--run-dir")  # the app's link names the run directory itself
        flags = [flag for flag in train[1:at] + train[at + 2:] if flag != "--headless"]
        _run([sys.executable, "-m", "benchmarks.matrix.app_cell", event, str(evidence.run), option, value, "--",
              *flags, "--steps", str(run_length(cell))], evidence)
    elif event == "kill9_resume":  # then --resume RUN alone, to the run's end: a user repeats no flag
        _kill_mid_run([*train, "--steps", str(run_length(cell))], evidence)
        if invariants.rows_kept_up_to_last_checkpoint(evidence) is not None:
            return [invariants.rows_kept_up_to_last_checkpoint]  # no resume from a kill that lost rows
        checks += [invariants.killed_mid_run, invariants.resumed_steps_bit_for_bit]
        if evidence.killed_at is None:
            return checks
        _run(resume, evidence)
    elif event in ("stop_resume", "rank_signal_resume"):
        _stop_mid_run([*train, "--steps", str(run_length(cell))], evidence, to_a_rank=event == "rank_signal_resume")
        checks.append(invariants.stopped_with_a_final_checkpoint)
        if event == "rank_signal_resume":
            checks.append(invariants.signal_named_in_the_journal)
        if evidence.stopped_at is None:
            return checks
        _run(resume, evidence)
    else:
        _run([*train, "--steps", str(steps)], evidence)
        if event == "resume_alone":
            _run(resume, evidence)
        elif event == "resume_longer":
            steps += 3
            _run([*resume, "--steps", str(steps)], evidence)
        elif event == "resume_shorter":
            evidence.rows_before_refusal = (evidence.run / "metrics.jsonl").read_text()
            shorter = [*resume, "--steps", str(steps - 2)]
            done = subprocess.run(shorter, capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S, env=evidence.env)
            evidence.refused_resume = Process(shorter, done.returncode, done.stdout, done.stderr)
            checks.append(invariants.shorter_resume_refused_changing_nothing)
        elif event == "compare":
            checks.append(invariants.applied_changes_in_compare)
    evidence.last_step = steps
    if cell["figures"] == "export":
        evidence.csv, evidence.tensorboard = folder / "metrics.csv", folder / "exported"
        _run([CLI, "export", str(evidence.run), "--csv", str(evidence.csv), "--tensorboard", str(evidence.tensorboard)],
             evidence)
    if event == "trial":
        checks.append(invariants.trial_recorded)
    return checks

