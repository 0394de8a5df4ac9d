"""The invariants a user relies on, one small function each, named so that a failure names the invariant.

Each takes what a cell left (``Evidence``) and returns None where it holds, or one line saying what broke.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchlab.core.records.option_history import option_history
from torchlab.core.options import OPTIONS_BY_NAME
from torchlab.core.wire.compile_report import CompileReport
from torchlab.core.wire.events import OptionApplied


@dataclass
class Process:
    """One command a cell ran, and what it said."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str


@dataclass
class Evidence:
    """What a cell left: its run directory, its processes, and what it expects of them."""

    run: Path
    processes: list[Process] = field(default_factory=list)
    last_step: int = 0  # the step the run must end at
    scripted: str | None = None  # the option an --at changed
    csv: Path | None = None
    tensorboard: Path | None = None
    refusal_word: str | None = None  # a refusal by design: the word its paragraph names
    refused_resume: Process | None = None  # a resume that must be refused (shorter than the run), kept apart
    rows_before_refusal: str = ""  # metrics.jsonl as it was before that resume
    stopped_at: tuple[int, int] | None = None  # after ``stop``: (last.pt's step, the last row's step)
    env: dict[str, str] | None = None  # the environment of the cell's processes (None: this process's)
    killed_at: tuple[int, int] | None = None  # after a kill -9: (last.pt's step, the last row's step)

    def events(self) -> list[dict[str, Any]]:
        return _lines(self.run / "events.jsonl")

    def rows(self) -> list[dict[str, Any]]:
        return _lines(self.run / "metrics.jsonl")

    def replaced(self) -> list[dict[str, Any]]:
        """The rows a resume moved aside: steps the killed process trained after its last checkpoint."""
        return _lines(self.run / "metrics.replaced.jsonl")

    def applied(self) -> list[dict[str, Any]]:
        """The option changes the run went through (option_history's reading: a live change that changed a value, a
        resume's or a restart's change at the step after its checkpoint, less what a resume trained over)."""
        last = {(change.option, change.step): change.value for change in option_history(self.events())}
        # two changes of one option at one boundary (the start's compile, then --at 1:compile=off): the step trains
        # with the last, and that is what the impact table, the CSV and TensorBoard can show for it
        return [{"option": option, "value": value, "step": step} for (option, step), value in last.items()]

    def applied_to_a_trained_step(self) -> list[dict[str, Any]]:
        """``applied()`` less a change no step trained under: a restart's change at the step after a checkpoint of the
        run's last step (the kill landed after its last step) is in the journal and compare's list, but begins no row,
        no segment, no TensorBoard text."""
        return [event for event in self.applied() if event["step"] <= self.last_step]


def _lines(path: Path) -> list[dict[str, Any]]:
    """The journal's whole lines: read while the run writes, its last may be half written (no newline yet). Read
    so, it crashed the whole matrix at cell 109 of 172 (JSONDecodeError), and the run it was watching, never stopped,
    waited on with its pipes closed."""
    if not path.exists():
        return []
    text = path.read_text()
    whole = text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in whole.splitlines() if line.strip()]


def _same(option: str, a: Any, b: Any) -> bool:
    """Two values of an option equal once each is parsed by the option itself (a CSV's "False", an event's false)."""
    live = OPTIONS_BY_NAME[option]
    return live.parse("off" if a in ("", None) else a) == live.parse("off" if b in ("", None) else b)


# -- every process ---------------------------------------------------------------------------------------------

def no_traceback(evidence: Evidence) -> str | None:
    for process in evidence.processes:
        if "Traceback (most recent call last)" in process.stdout + process.stderr:
            return f"a traceback on the terminal of `{' '.join(process.argv[1:4])} ...`"
    return None


def each_process_exits_0(evidence: Evidence) -> str | None:
    for process in evidence.processes:
        if process.returncode != 0:
            said = process.stderr.strip().splitlines()[-3:] or process.stdout.strip().splitlines()[-3:]
            return f"exit {process.returncode} from `{' '.join(process.argv[1:])}`: {' / '.join(said)}"
    return None


# -- a refusal by design ---------------------------------------------------------------------------------------

def refused_with_exit_2(evidence: Evidence) -> str | None:
    code = evidence.processes[0].returncode
    return None if code == 2 else f"expected a refusal (exit 2), got exit {code}"


def refusal_is_one_paragraph_naming_why(evidence: Evidence) -> str | None:
    said = evidence.processes[0].stderr.strip()
    if not said:
        return "refused without a word on stderr"
    if "\n\n" in said:
        return f"the refusal is more than one paragraph: {said[:200]!r}"
    if evidence.refusal_word and evidence.refusal_word not in said.lower():
        return f"the refusal does not name {evidence.refusal_word!r}: {said[:200]!r}"
    return None


def nothing_spent_before_refusal(evidence: Evidence) -> str | None:
    checkpoints = list((evidence.run / "checkpoints").glob("*.pt")) if (evidence.run / "checkpoints").exists() else []
    if evidence.rows() or checkpoints:
        return f"refused after training: {len(evidence.rows())} metrics rows, {len(checkpoints)} checkpoints"
    return None


# -- a run that trained ----------------------------------------------------------------------------------------

def losses_finite(evidence: Evidence) -> str | None:
    bad = [row["step"] for row in evidence.rows() if not math.isfinite(float(row.get("loss", math.nan)))]
    return f"a loss that is not finite at steps {bad[:5]}" if bad else None


def every_step_once(evidence: Evidence) -> str | None:
    steps = [row["step"] for row in evidence.rows()]
    twice = sorted({step for step in steps if steps.count(step) > 1})
    missing = sorted(set(range(1, evidence.last_step + 1)) - set(steps))
    beyond = sorted(step for step in set(steps) if step > evidence.last_step)
    if twice or missing or beyond:
        return f"metrics.jsonl: steps twice {twice[:5]}, missing {missing[:5]}, beyond {evidence.last_step}: {beyond[:5]}"
    return None


def scripted_change_acknowledged(evidence: Evidence) -> str | None:
    if evidence.scripted is None:
        return None
    said = [event for event in evidence.events() if event.get("event") in ("option_applied", "option_refused")
            and event.get("option") == evidence.scripted or event.get("event") == "resume_changed_settings"
            and any(change.get("setting") == evidence.scripted for change in event.get("changes", ()))]
    return None if said else f"the change of {evidence.scripted} was neither applied nor refused in events.jsonl"


def applied_changes_in_impact_history(evidence: Evidence) -> str | None:
    path = evidence.run / "impact.json"
    segments = json.loads(path.read_text()) if path.exists() else []
    for event in evidence.applied_to_a_trained_step():
        option = event["option"]
        if not OPTIONS_BY_NAME[option].shapes_a_step:
            continue
        if not any(segment["first_step"] == event["step"] and _same(option, segment["options"].get(option), event["value"])
                   for segment in segments):
            return f"{option}={event['value']} applied at step {event['step']} begins no segment of impact.json"
    return None


def applied_changes_in_csv(evidence: Evidence) -> str | None:
    if evidence.csv is None:
        return None
    rows = {int(row["step"]): row for row in csv.DictReader(evidence.csv.open())}
    for event in evidence.applied_to_a_trained_step():
        row = rows.get(event["step"])
        if row is None or not _same(event["option"], row.get(event["option"]), event["value"]):
            shown = None if row is None else row.get(event["option"])
            return f"the CSV's step {event['step']} has {event['option']}={shown!r}, the change applied {event['value']!r}"
    return None


def _tensorboard(directory: Path) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(directory), size_guidance={"tensors": 0, "scalars": 0})
    accumulator.Reload()
    return accumulator


def tensorboard_has_every_step(evidence: Evidence) -> str | None:
    if evidence.tensorboard is None:
        return None
    accumulator = _tensorboard(evidence.tensorboard)
    if "train/loss" not in accumulator.Tags()["scalars"]:
        return f"no train/loss in the TensorBoard files of {evidence.tensorboard}"
    steps = {scalar.step for scalar in accumulator.Scalars("train/loss")}
    return None if evidence.last_step in steps else f"TensorBoard's train/loss ends at {max(steps, default=None)}"


def applied_changes_in_tensorboard(evidence: Evidence) -> str | None:
    if evidence.tensorboard is None:
        return None
    accumulator = _tensorboard(evidence.tensorboard)
    texts = [(tensor.step, b" ".join(tensor.tensor_proto.string_val).decode())
             for tag in accumulator.Tags()["tensors"] if tag.startswith("options")
             for tensor in accumulator.Tensors(tag)]
    for event in evidence.applied_to_a_trained_step():
        if not any(step == event["step"] and f"{event['option']} = " in text for step, text in texts):
            return f"{event['option']} applied at step {event['step']} is not in TensorBoard's options text ({texts[:3]})"
    return None


def applied_changes_in_compare(evidence: Evidence) -> str | None:
    from torchlab.tui.run_history import RunHistory

    changed_at = RunHistory.load(evidence.run).changed_at
    for event in evidence.applied():
        if event["step"] not in changed_at:
            return f"compare lists no change at step {event['step']} ({event['option']}); it lists {changed_at}"
    return None


def last_checkpoint_loads_at_the_end(evidence: Evidence) -> str | None:
    from torchlab.core.engine.state.checkpoint import load_checkpoint

    last = evidence.run / "checkpoints" / "last.pt"
    if not last.exists():
        return "no checkpoints/last.pt"
    step = load_checkpoint(last)["step"]
    return None if step == evidence.last_step else f"last.pt holds step {step}, the run ended at {evidence.last_step}"


def each_compile_reported(evidence: Evidence) -> str | None:
    """Each compile says what it compiled (docs/options.md, "What compile did"): every ``compile=on`` applied (at the
    start, typed live, or compiled again by a resumed or relaunched process), and every ``dynamic`` applied while
    compiled, has its ``compile_report`` at that boundary, with a graph and the ``dynamic`` in force, whatever else the
    cell combines."""
    events = evidence.events()
    reports = {event["step"]: event for event in events if event.get("event") == CompileReport.journal_event()}
    dynamic_changes = sorted((change["step"], change["value"]) for change in evidence.applied() if change["option"] == "dynamic")
    compiled = False
    for event in (event for event in events if event.get("event") == OptionApplied.journal_event()):
        if event.get("option") == "compile":
            compiled = event.get("value") is True
        if not compiled or event.get("option") not in ("compile", "dynamic"):
            continue
        step = event["step"]
        dynamic = next((value for at, value in reversed(dynamic_changes) if at <= step), "auto")
        report = reports.get(step)
        if report is None:
            return f"{event['option']}={event.get('value')} applied at step {step} ({event.get('source')}), compiled, and no compile_report at that step"
        if report.get("graphs", 0) < 1 or report.get("dynamic") != dynamic:
            return (f"the compile_report of step {step} says {report.get('graphs')} graphs compiled under "
                    f"dynamic={report.get('dynamic')} (dynamic={dynamic} was in force)")
    return None


REFUSED = (refused_with_exit_2, refusal_is_one_paragraph_naming_why, no_traceback, nothing_spent_before_refusal)
TRAINED = (each_process_exits_0, no_traceback, losses_finite, every_step_once, scripted_change_acknowledged,
           applied_changes_in_impact_history, applied_changes_in_csv, tensorboard_has_every_step,
           applied_changes_in_tensorboard, last_checkpoint_loads_at_the_end, each_compile_reported)


def rows_kept_up_to_last_checkpoint(evidence: Evidence) -> str | None:
    """After a kill -9: every step up to the checkpoint a resume starts from has its row (README, "A kill ...")."""
    from torchlab.core.engine.state.checkpoint import load_checkpoint

    step = load_checkpoint(evidence.run / "checkpoints" / "last.pt")["step"]
    missing = sorted(set(range(1, step + 1)) - {row["step"] for row in evidence.rows()})
    return f"killed with last.pt at step {step}: rows missing for steps {missing[:5]}" if missing else None


def trial_recorded(evidence: Evidence) -> str | None:
    """A trial asked for is in trials.jsonl (its result, or why it could not run)."""
    trials = evidence.run / "trials.jsonl"
    lines = [line for line in trials.read_text().splitlines() if line.strip()] if trials.exists() else []
    return None if lines else "the --trial left no line in trials.jsonl"


def shorter_resume_refused_changing_nothing(evidence: Evidence) -> str | None:
    """``--resume RUN --steps N`` below the run's last step is refused (README, "Resuming a run"): exit 2, one
    paragraph naming ``--steps``, no traceback, and the run's rows as they were."""
    process = evidence.refused_resume
    if process is None:
        return "the shorter resume did not run"
    said = process.stderr.strip()
    if process.returncode != 2:
        return f"a resume shorter than the run: exit {process.returncode}, expected a refusal (2): {said[-200:]!r}"
    if "\n" in said or "Traceback" in said or "steps" not in said:
        return f"a resume shorter than the run is not refused in one paragraph naming --steps: {said[:200]!r}"
    if (evidence.run / "metrics.jsonl").read_text() != evidence.rows_before_refusal:
        return "a refused resume changed metrics.jsonl"
    return None


def stopped_with_a_final_checkpoint(evidence: Evidence) -> str | None:
    """A headless run stopped (SIGTERM, as Ctrl-C) ends at a step boundary with a checkpoint of its last step
    (README, exit codes: 130, a checkpoint was saved): last.pt holds the step of the last row written."""
    stopped_at = evidence.stopped_at
    if stopped_at is None:
        return "the run was not stopped (it ended first, or its exit status was not 130)"
    return None if stopped_at[0] == stopped_at[1] else (
        f"stopped at step {stopped_at[1]} (its last row) with last.pt at step {stopped_at[0]}")


def signal_named_in_the_journal(evidence: Evidence) -> str | None:
    """A scheduler's warning to one rank (or to the one process) is journalled as such (docs/ranks.md, "Preemption"):
    ``stop_requested`` names the signal, and the rank where there are ranks, whichever process it reached."""
    reasons = [event["reason"] for event in evidence.events() if event.get("event") == "stop_requested"]
    wanted = ("SIGUSR1 to rank ", "SIGUSR1: the run stops")
    return None if any(reason.startswith(wanted) for reason in reasons) else f"no stop_requested names SIGUSR1: {reasons}"


def resumed_steps_bit_for_bit(evidence: Evidence) -> str | None:
    """After a kill -9 and ``--resume`` alone: the steps the killed process trained after its last checkpoint are
    trained again, and each has the loss the killed process had, bit for bit (README, "Resuming a run": on the same
    device the resumed run is the run never stopped). A kill that landed on a checkpoint leaves none to compare."""
    again = {row["step"]: row for row in evidence.rows()}
    for first in evidence.replaced():
        second = again.get(first["step"])
        if second is None:
            return f"step {first['step']} was trained before the kill and not again after the resume"
        if first["loss"] != second["loss"]:
            return (f"step {first['step']}: loss {first['loss']!r} before the kill, {second['loss']!r} after the resume "
                    f"(from last.pt at step {evidence.killed_at[0] if evidence.killed_at else '?'})")
    return None


def killed_mid_run(evidence: Evidence) -> str | None:
    """The kill -9 landed while the run trained, after a checkpoint (else the cell tried no kill)."""
    if evidence.killed_at is None:
        return "the run was not killed mid-run (it ended first, or no checkpoint landed)"
    if evidence.killed_at[1] >= evidence.last_step:
        return f"the kill landed after the run's last step ({evidence.killed_at[1]})"
    return None


def out_of_memory_rescued(evidence: Evidence) -> str | None:
    """On a device that holds half the batch the OOM rescue took a rung (``oom_rescued``), and every row from that
    step on trained with it or further down the ladder (README, "OOM rescue": the rung is the option's value from then
    on, as if typed)."""
    rescues = [event for event in evidence.events() if event.get("event") == "oom_rescued"]
    if not rescues:
        return "no oom_rescued in events.jsonl: the out-of-memory forward was not rescued"
    first = rescues[0]
    option, value = first["option"], first["value"]
    if option != "split":
        return None  # checkpointing rungs: what "further down" means is the ladder's (tests/engine/guards/test_oom_rescue.py)
    lower = [row["step"] for row in evidence.rows() if row["step"] >= first["step"] and int(row["split"]) < int(value)]
    return f"rows at steps {lower[:5]} trained at a split below the rescue's {value}" if lower else None
