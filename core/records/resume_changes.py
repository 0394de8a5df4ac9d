"""What a resume changed from its checkpoint, said once: each setting's change (``SettingChange``), whether it breaks
exactness (the resumed run then differs from one that was never stopped: ``BREAKS_EXACTNESS``), and the note the run
journals as ``resume_changed_settings`` (``resume_note``), one line for the CLI, the app and ``events.jsonl``.

The launcher's plan makes the changes the flags ask for (core/launch/training_plan.py); the supervisor adds the world size,
which only it knows (core/engine/ranks/supervisor.py), and says the note again with it, in the same words.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torchlab.core.options import OPTION_NAMES, format_option_value
from torchlab.core.wire.protocol import LogLevel

#: Settings whose change on a resume makes the run differ from one that was never stopped.
BREAKS_EXACTNESS = ("workload", "seed", "batch_size", "lr", "weight_decay", "schedule", "warmup_steps", "optimizer")


@dataclass(frozen=True)
class SettingChange:
    """A setting whose value on this resume differs from the checkpoint's."""

    setting: str
    stored: Any
    value: Any

    @property
    def breaks_exactness(self) -> bool:
        return self.setting in BREAKS_EXACTNESS

    def describe(self) -> str:
        return f"{self.setting} {shown_setting(self.setting, self.stored)} → {shown_setting(self.setting, self.value)}"

    @classmethod
    def of_record(cls, record: Mapping[str, Any]) -> SettingChange:
        """A change as a note's ``changes`` entry holds it (``as_dict``)."""
        return cls(record["setting"], record["stored"], record["value"])

    def as_dict(self) -> dict[str, Any]:
        return {"setting": self.setting, "stored": _jsonable(self.stored), "value": _jsonable(self.value),
                "breaks_exactness": self.breaks_exactness}


def resume_note(changes: Sequence[SettingChange]) -> dict[str, Any] | None:
    """What a resume changed, as the run journals it (``resume_changed_settings``: its changes, one line, and a warning
    where one breaks exactness); None where nothing did."""
    if not changes:
        return None
    level = LogLevel.WARNING if any(change.breaks_exactness for change in changes) else LogLevel.INFO
    return {"changes": [change.as_dict() for change in changes], "message": describe_changes(changes), "level": level}


def describe_changes(changes: Sequence[SettingChange]) -> str:
    """One line for the user: the overrides that break exactness as a warning, or the others plainly."""
    breaking = [change.describe() for change in changes if change.breaks_exactness]
    others = [change.describe() for change in changes if not change.breaks_exactness]
    if breaking:
        text = f"resumed with {_and(breaking)}: from here on the run differs from one that was never stopped"
        return text + (f"; also {_and(others)}" if others else "")
    return f"resumed with {_and(others)}"


def shown_setting(setting: str, value: Any) -> str:
    """A setting's or live option's value as a line for the user writes it: an option as its own words (``off``), a
    list as ``[1, 2]``, no value as ``default``."""
    if setting in OPTION_NAMES:
        return format_option_value(setting, value)
    if isinstance(value, tuple):
        return "[" + ", ".join(str(item) for item in value) + "]"
    return "default" if value is None else str(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(item) for item in value]
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
