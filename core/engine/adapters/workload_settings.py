"""A workload's own starting values (``Workload.settings``: a transformers Trainer's TrainingArguments) and the run.

A new run takes each one the user did not give (core/records/starting_values.py ``with_workload_settings``); every rank
takes the same, from the same code, so the ranks a supervisor starts and those torchrun starts agree without being
told. A resumed run keeps its own, as config.toml and its checkpoint hold them (a relaunch for a new world size
resumes too), and says where the workload's code now says otherwise: a user who edited TrainingArguments and
resumed would otherwise believe the edit took.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torchlab.core.records.config import TrainConfig
from torchlab.core.records.starting_values import value_of, with_workload_settings
from torchlab.core.wire.options import OPTIONS_BY_NAME, LiveOptions, format_option_value
from torchlab.core.workload import Workload


def starting_configuration(config: TrainConfig, workload: Workload, explicit: set[str]) -> tuple[TrainConfig, dict[str, Any]]:
    """The configuration a new run trains with, and the workload's values it took (by name)."""
    if not workload.settings:
        return config, {}
    return with_workload_settings(config, workload.settings, explicit, f"workload {config.workload}")


def changed_since_the_start(config: TrainConfig, options: LiveOptions, workload: Workload, explicit: set[str]) -> str | None:
    """For a resumed run: the workload's own values that differ from the run's (its configuration, the options it
    resumed with), as one line that says the run keeps its own and how to take the workload's; None where none
    differ. The user's explicit values are the run's by choice: not compared."""
    if not workload.settings:
        return None
    current = dataclasses.replace(config, options=options)
    _, differ = with_workload_settings(current, workload.settings, explicit, f"workload {config.workload}")
    if not differ:
        return None
    said = ", ".join(f"{name} {_shown(name, theirs)} (the run's: {_shown(name, value_of(current, name))})"
                     for name, theirs in differ.items())
    flags = " ".join(word for name, theirs in differ.items() for word in _flag(name, theirs))
    return (f"the workload's own starting values differ from the run's: {said}. A resume keeps the run's; to take the "
            f"workload's, resume with {flags}")


def _flag(name: str, value: Any) -> list[str]:
    option = OPTIONS_BY_NAME.get(name)
    return option.flag_arguments(value) if option is not None else [f"--{name.replace('_', '-')}", str(value)]


def _shown(name: str, value: Any) -> str:
    return format_option_value(name, value) if name in OPTIONS_BY_NAME else str(value)
