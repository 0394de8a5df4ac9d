"""A workload's own starting values (``Workload.settings``: a transformers Trainer's TrainingArguments) taken into a
run's configuration in the place of the defaults, never of what the user gave; and, for a resumed run, which keeps
its own, what the workload's code now says otherwise. Torch-free: the trainer takes them (``starting_configuration``,
``changed_since_the_start``) and the launcher writes the configuration they make (core/launch/training_plan.py
``ConfigRecord``) with the same function.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from torchlab.core.errors import ConfigError, WorkloadError, shown
from torchlab.core.records.config import TrainConfig, suggestion
from torchlab.core.records.resume_changes import shown_setting
from torchlab.core.records.settings import SETTINGS
from torchlab.core.options import OPTIONS_BY_NAME, LiveOptions, OptionChangeError, parse_option_value

#: What ``Workload.settings`` may not set, and why: each is decided before the workload's code runs.
NOT_THE_WORKLOADS = {
    "seed": "it seeds the workload's own code (its factory runs after it): give --seed",
    "device": "the run chose its device before the workload's code ran: give --device",
    "world_size": "the ranks are started before the workload's code runs: give --world-size",
    "shared_run_dir": "the run directory is made before the workload's code runs: give --shared-run-dir",
    "tensorboard": "the run's writers are made before the workload's code runs: give --tensorboard",
    "telemetry_interval": "the run's sampler starts before the workload's code runs: give --telemetry-interval",
}


_SETTING_NAMES = frozenset(setting.name for setting in SETTINGS)


def with_workload_settings(config: TrainConfig, settings: Mapping[str, Any], explicit: set[str] | frozenset[str],
                           where: str) -> tuple[TrainConfig, dict[str, Any]]:
    """``config`` with a workload's own starting values (``Workload.settings``: a transformers Trainer's
    TrainingArguments) in the place of the defaults: each one the user gave (``explicit``: the flags and the
    ``--config`` file) stays the user's. Returns the configuration and the values it took that differ from the ones it
    had, by name, as the configuration holds them (what run_started reports and config.toml records). A value the
    setting does not accept is the WorkloadError of ``where``, naming it."""
    top: dict[str, Any] = {}
    options = config.options
    for name, value in settings.items():
        if name in NOT_THE_WORKLOADS:
            raise WorkloadError(f"{where}: Workload.settings cannot set {name}: {NOT_THE_WORKLOADS[name]}.")
        if name not in _SETTING_NAMES and name not in OPTIONS_BY_NAME:
            known = [setting.name for setting in SETTINGS] + list(OPTIONS_BY_NAME)
            raise WorkloadError(f"{where}: Workload.settings names {shown(name)}, which is no setting or live option of "
                                f"torchlab{suggestion(str(name), known)}.")
        if name in explicit:
            continue
        if name in _SETTING_NAMES:
            top[name] = value
            continue
        try:
            options = options.with_value(name, parse_option_value(name, value))
        except OptionChangeError as refusal:
            raise WorkloadError(f"{where}: Workload.settings {name} = {shown(value)}: {refusal}.") from None
    try:
        taken = replace(config, **top, options=options)
    except ConfigError as error:
        raise WorkloadError(f"{where}: Workload.settings: {error}") from None
    return taken, {name: value_of(taken, name) for name in settings
                   if name not in explicit and value_of(taken, name) != value_of(config, name)}


def value_of(config: TrainConfig, name: str) -> Any:
    """A setting's value (``steps`` is one), or a live option's."""
    return getattr(config, name) if name in _SETTING_NAMES else getattr(config.options, name)


def starting_configuration(config: TrainConfig, settings: Mapping[str, Any] | None,
                           explicit: set[str]) -> tuple[TrainConfig, dict[str, Any]]:
    """The configuration a new run trains with, and the workload's values (``settings``) it took, by name. Every rank
    takes the same, from the same code, so the ranks a supervisor starts and those torchrun starts agree untold."""
    if not settings:
        return config, {}
    return with_workload_settings(config, settings, explicit, f"workload {config.workload}")


def changed_since_the_start(config: TrainConfig, options: LiveOptions, settings: Mapping[str, Any] | None,
                            explicit: set[str]) -> str | None:
    """For a resumed run, which keeps its own values (config.toml and its checkpoint hold them; a relaunch for a new
    world size resumes too): the workload's own (``settings``) that differ from the run's (its configuration, the
    options it resumed with), as one line that says the run keeps its own and how to take the workload's; None where
    none differ. A user who edited TrainingArguments and resumed would otherwise believe the edit took. The user's
    explicit values are the run's by choice: not compared."""
    if not settings:
        return None
    current = replace(config, options=options)
    _, differ = with_workload_settings(current, settings, explicit, f"workload {config.workload}")
    if not differ:
        return None
    said = ", ".join(f"{name} {shown_setting(name, theirs)} (the run's: {shown_setting(name, value_of(current, name))})"
                     for name, theirs in differ.items())
    flags = " ".join(word for name, theirs in differ.items() for word in _flag(name, theirs))
    return (f"the workload's own starting values differ from the run's: {said}. A resume keeps the run's; to take the "
            f"workload's, resume with {flags}")


def _flag(name: str, value: Any) -> list[str]:
    option = OPTIONS_BY_NAME.get(name)
    return option.flag_arguments(value) if option is not None else [f"--{name.replace('_', '-')}", str(value)]
