"""The option changes a run went through, read from its journal (``events.jsonl``) one way for every reader:
the TensorBoard text (live and exported), the app's account of a run's earlier steps on attach, ``compare``.

Two kinds of line record a change, each at the first step that trained with the new value:

- ``option_applied``: a live change (a key in the app, ``--at``, the OOM rescue, a world-size relaunch), at its step;
- ``resume_changed_settings``: a resume (the app's restart from the error screen is one) given a live option other
  than the checkpoint's, ``--resume RUN --amp off``: in force from the step after the checkpoint's.

A resume goes back to its checkpoint: the changes a process journalled after that step were trained over, and
leave the history (a scripted ``--at`` past the checkpoint is applied, and journalled, again).

Standard library only: the app reads it too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from torchlab.core.wire.events import ResumeChangedSettings, ResumedFromCheckpoint
from torchlab.core.options import OPTION_NAMES, format_option_value
from torchlab.core.wire.protocol import OptionApplied

#: Where a resume's change came from, as a change's ``source`` says it ("from --resume").
RESUME_SOURCE = "--resume"


@dataclass(frozen=True)
class OptionChange:
    """``option`` went from ``previous`` to ``value``, first trained with at ``step``; ``source``: who asked."""

    step: int
    option: str
    value: Any
    previous: Any
    source: str = ""

    def describe(self) -> str:
        """"step 41: amp = bf16": a line of a list of changes."""
        return f"step {self.step}: {self.option} = {format_option_value(self.option, self.value)}"


def changes_recorded(record: Mapping[str, Any]) -> list[OptionChange]:
    """The option changes one line of ``events.jsonl`` (or an event's ``journal_record()``) records: one for an
    ``option_applied`` that changed a value (none where ``previous`` is ``value``: in force already, as a resumed
    run's compile made again in its new process), one per live option a ``resume_changed_settings`` changed, none
    for any other line."""
    kind, step = record.get("event"), record.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        return []
    if kind == OptionApplied.journal_event():
        if record.get("value") == record.get("previous"):  # in force already: a resumed run's compile made again
            return []
        return [OptionChange(step, str(record.get("option")), record.get("value"), record.get("previous"),
                             str(record.get("source") or ""))]
    changes = record.get("changes")
    if kind == ResumeChangedSettings.journal_event() and isinstance(changes, list):
        return [OptionChange(step + 1, change["setting"], change.get("value"), change.get("stored"), RESUME_SOURCE)
                for change in changes if isinstance(change, dict) and change.get("setting") in OPTION_NAMES]
    return []


def option_history(records: Iterable[Mapping[str, Any]]) -> list[OptionChange]:
    """The changes ``records`` (a run's journal lines, in order) hold, in order, less those a later resume trained
    over (after the step of its ``resumed_from_checkpoint``)."""
    history: list[OptionChange] = []
    for record in records:
        if record.get("event") == ResumedFromCheckpoint.journal_event() and isinstance(step := record.get("step"), int):
            history = [change for change in history if change.step <= step]
        else:
            history.extend(changes_recorded(record))
    return history
