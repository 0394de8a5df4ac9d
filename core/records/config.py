"""Run configuration: one keyword-only dataclass, validated where it is built, and its TOML.

Precedence, lowest first: defaults, then a ``--config`` TOML file, then command-line flags. Every error
names the setting (and the file, for TOML) so the user knows what to change. The resolved configuration
is written to the run directory as ``config.toml``, which ``--config`` reads back. A workload file is recorded as
an absolute path (core/launch/arguments.py ``workload_as_stored``), so a run resumes from any directory.

Each setting that is not live is one declaration in core/records/settings.py (``SETTINGS``): its default, what it
accepts, its flag and help. TrainConfig's field defaults and the checks where a TrainConfig is built come from those
declarations, so a flag's text, a TOML value and a value built in code are checked alike. This module holds what
a run's configuration is made of beyond them (the workload, the live options, ``--at`` and ``--trial`` changes, the
workload's own optimizer and scheduler) and how a configuration is merged, written as TOML and read back.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from torchlab.core.errors import ConfigError, shown
from torchlab.core.records.settings import (
    ACT_STATS_EVERY, BATCH_SIZE, CHECKPOINT_EVERY, DEVICE, EVAL_BATCHES, EVAL_EVERY, FORECAST_PRIORITY, HANG_AFTER, KEEP_CHECKPOINTS, ON_HANG,
    LOG_EVERY, LR,
    MEMORY_EVERY, OPTIMIZER, OPTIMIZER_STEP, PEAK_TFLOPS, PROBE_EVERY, PROFILE_AT, PROFILE_STEPS, RESHARD_AFTER_FORWARD, SCHEDULE,
    SEED, SETTINGS, SHARED_RUN_DIR, SPIKE_THRESHOLD, SPIKE_WINDOW, STEPS_SETTING, TELEMETRY_INTERVAL, TENSORBOARD,
    TRIAL_STEPS_SETTING, WARMUP_STEPS, WEIGHT_DECAY,
)
from torchlab.core.safe_open import UnsafeFileError, open_regular
from torchlab.core.options import (
    LIVE_OPTIONS, OPTIONS_BY_NAME, WORKERS, LiveOptions, OptionChangeError, format_option_value, parse_option_value,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

DEFAULT_WORKLOAD = "tiny_gpt"


_AT_PATTERN = re.compile(r"^\s*(\d+)\s*:\s*([A-Za-z_]+)\s*=\s*(.*?)\s*$")


@dataclass(frozen=True)
class ScheduledChange:
    """A scripted live change (``--at STEP:OPTION=VALUE``): takes effect for optimizer step ``step``. Also a
    scripted trial (``--trial STEP:OPTION=VALUE``): tried at the boundary before step ``step``."""

    step: int
    option: str
    value: str

    @classmethod
    def parse(cls, text: str, flag: str = "--at") -> ScheduledChange:
        match = _AT_PATTERN.match(text)
        if not match:
            raise ConfigError(
                f"{flag} {shown(text)} is not of the form STEP:OPTION=VALUE (for example {flag} 50:amp=bf16)."
            )
        option, value = match.group(2), match.group(3)
        try:
            step = OPTIMIZER_STEP.parse("STEP", match.group(1))
            parse_option_value(option, value)
        except OptionChangeError as refusal:
            raise ConfigError(f"{flag} {shown(text)}: {refusal}.") from None
        return cls(step, option, value)

    def __str__(self) -> str:
        return f"{self.step}:{self.option}={self.value}"


#: config.toml's table for the optimizer and scheduler a workload brought: a record of what the run used, in the
#: place of the settings they replace, which compare shows and which is not read back as settings.
FROM_WORKLOAD_TABLE = "from_workload"


@dataclass(frozen=True)
class FromWorkload:
    """The workload's own optimizer and scheduler (``Workload(optimizer=..., scheduler=...)``), as the trainer built
    them (core/engine/optimization.py ``own_training``): with them, ``--optimizer``, ``--lr`` and ``--weight-decay``,
    or ``--schedule`` and ``--warmup-steps``, did not apply, so config.toml records these instead of those."""

    optimizer: str | None = None  #: its class (``torch.optim.SGD``), where the workload gives the optimizer
    groups: tuple[str, ...] = ()  #: each parameter group's name (its index where it has none)
    lrs: tuple[float, ...] = ()  #: each group's LR at the start of its schedule
    scheduler: str | None = None  #: its class, where the workload gives the scheduler

    def replaced_settings(self) -> tuple[str, ...]:
        return ((("optimizer", "lr", "weight_decay") if self.optimizer else ())
                + (("schedule", "warmup_steps") if self.scheduler else ()))

    def as_dict(self) -> dict[str, Any]:
        """As config.toml's table and run_started's field hold it: what the workload does not give is left out."""
        record: dict[str, Any] = {}
        if self.optimizer:
            record.update(optimizer=self.optimizer, groups=list(self.groups), lr=list(self.lrs))
        if self.scheduler:
            record["scheduler"] = self.scheduler
        return record

    @classmethod
    def from_mapping(cls, record: Any, source: str) -> FromWorkload:
        """Read back from ``as_dict``'s form (a run's config.toml, a run_started event); a ConfigError where it is not."""
        ok = isinstance(record, Mapping) and set(record) <= {"optimizer", "groups", "lr", "scheduler"}
        groups, lrs = (record.get("groups", []), record.get("lr", [])) if ok else ([], [])
        ok = ok and all(isinstance(record.get(name, ""), str) for name in ("optimizer", "scheduler"))
        ok = ok and isinstance(groups, list) and all(isinstance(name, str) for name in groups)
        ok = ok and isinstance(lrs, list) and len(lrs) == len(groups) and all(_is_number(lr) for lr in lrs)
        if not ok:
            raise ConfigError(f"{source}: [{FROM_WORKLOAD_TABLE}] must hold optimizer, groups and lr (one LR a group) "
                              f"and scheduler, as torchlab writes it.")
        return cls(record.get("optimizer"), tuple(groups), tuple(float(lr) for lr in lrs), record.get("scheduler"))

    def shown(self) -> dict[str, str]:
        """The settings it replaces, as compare shows them (``optimizer``: ``torch.optim.SGD (the workload's)``)."""
        shown: dict[str, str] = {}
        if self.optimizer:
            lrs = " · ".join(f"{group} {lr:g}" for group, lr in zip(self.groups, self.lrs))
            shown.update(optimizer=f"{self.optimizer} (the workload's)", lr=f"{lrs} (the workload's)",
                         weight_decay="the workload's")
        if self.scheduler:
            shown.update(schedule=f"{self.scheduler} (the workload's)", warmup_steps="the workload's")
        return shown


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything a run needs besides the workload itself. Each setting's default is its declaration's
    (core/records/settings.py), where its meaning is said; the other fields are the workload, the live options and records of the run."""

    workload: str = DEFAULT_WORKLOAD
    steps: int = STEPS_SETTING.default
    batch_size: int | None = BATCH_SIZE.default
    seed: int = SEED.default
    device: str = DEVICE.default
    optimizer: str = OPTIMIZER.default
    lr: float = LR.default
    weight_decay: float = WEIGHT_DECAY.default
    schedule: str = SCHEDULE.default
    warmup_steps: int | None = WARMUP_STEPS.default
    eval_every: int = EVAL_EVERY.default
    eval_batches: int = EVAL_BATCHES.default
    checkpoint_every: int | str = CHECKPOINT_EVERY.default
    keep_checkpoints: int = KEEP_CHECKPOINTS.default
    reshard_after_forward: bool = RESHARD_AFTER_FORWARD.default
    log_every: int = LOG_EVERY.default
    probe_every: int | str = PROBE_EVERY.default
    act_stats_every: int = ACT_STATS_EVERY.default
    memory_every: int | str = MEMORY_EVERY.default
    telemetry_interval: float = TELEMETRY_INTERVAL.default
    forecast_priority: str = FORECAST_PRIORITY.default
    peak_tflops: float | None = PEAK_TFLOPS.default
    hang_after: float = HANG_AFTER.default
    on_hang: str = ON_HANG.default
    profile_at: tuple[int, ...] = PROFILE_AT.default
    profile_steps: int = PROFILE_STEPS.default
    shared_run_dir: bool = SHARED_RUN_DIR.default
    tensorboard: str | None = TENSORBOARD.default
    options: LiveOptions = field(default_factory=LiveOptions)
    at: tuple[ScheduledChange, ...] = ()
    trials: tuple[ScheduledChange, ...] = ()  # --trial STEP:OPTION=VALUE (core/engine/trials.py)
    trial_steps: int = TRIAL_STEPS_SETTING.default
    spike_threshold: float = SPIKE_THRESHOLD.default
    spike_window: int = SPIKE_WINDOW.default
    #: Each time a resume changed ``steps``: (the step resumed at, the total before). The LR schedule
    #: re-plans its decay from that step (core/engine/schedule.py), so the LR has no jump at the boundary.
    schedule_extensions: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        _check(isinstance(self.workload, str) and self.workload.strip() != "", "workload",
               "must name a sample (mlp, convnet, tiny_gpt), path/to/file.py:factory or package.module:factory",
               self.workload)
        for setting in SETTINGS:  # a flag's text becomes its number here, a TOML value is checked
            object.__setattr__(self, setting.name, setting.check(getattr(self, setting.name)))
        _check(isinstance(self.options, LiveOptions), "options", "must be a LiveOptions", self.options)
        for option in LIVE_OPTIONS:  # a live option that is a setting starts at the setting's value (--steps)
            if option.setting and getattr(self.options, option.name) != getattr(self, option.name):
                object.__setattr__(self, "options", self.options.with_value(option.name, getattr(self, option.name)))
        for change in self.at:
            _check(isinstance(change, ScheduledChange), "at", "must hold STEP:OPTION=VALUE changes", change)
        for trial in self.trials:
            _check(isinstance(trial, ScheduledChange), "trials", "must hold STEP:OPTION=VALUE trials", trial)
        _check(_are_extensions(self.schedule_extensions) and all(step <= self.steps for step, _ in self.schedule_extensions),
               "schedule_extensions", "must be [step, steps before] pairs with increasing steps, each step ≤ its totals",
               self.schedule_extensions)

    @property
    def resolved_warmup_steps(self) -> int:
        return self.warmup_steps if self.warmup_steps is not None else max(1, round(0.05 * self.steps))

    def to_toml(self, *, workload_origin: str | None = None, from_workload: FromWorkload | None = None,
                workload_settings: Sequence[str] = ()) -> str:
        """The configuration as TOML that ``load_config_file`` (and ``config_from_toml``) read back.
        ``workload_origin``: a comment above ``workload`` saying what was typed where (core/launch/arguments.py).
        ``from_workload``: the workload's own optimizer and scheduler, recorded instead of the settings they replace
        (their defaults never applied; left out, they read back as the defaults, which the workload's factories
        allow). ``workload_settings``: the names whose values are the workload's own (``with_workload_settings``),
        said in a comment below ``workload``."""
        replaced = from_workload.replaced_settings() if from_workload else ()
        lines = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("options", "at", "trials", *replaced) or value is None:
                continue
            if f.name == "workload" and workload_origin:
                lines.append("# " + "".join(char if char.isprintable() else "?" for char in workload_origin))
            lines.append(f"{f.name} = {_toml_value(value)}")
            if f.name == "workload" and workload_settings:
                lines.append(f"# the workload's own starting values, where neither the command line nor --config gave "
                             f"one: {', '.join(workload_settings)}")
        for name in ("at", "trials"):
            if getattr(self, name):
                lines.append(f"{name} = [{', '.join(_toml_value(str(change)) for change in getattr(self, name))}]")
        if from_workload:
            lines.append("")
            lines.append(f"# the workload's own, in place of {', '.join(replaced)}: each group's LR at the start of its schedule")
            lines.append(f"[{FROM_WORKLOAD_TABLE}]")
            lines.extend(f"{name} = {_toml_value(value)}" for name, value in from_workload.as_dict().items())
        lines.append("")
        lines.append("[options]")
        for name, value in self.options.as_dict().items():
            if OPTIONS_BY_NAME[name].setting:  # written above, as its setting
                continue
            lines.append(f"{name} = {_toml_value(format_option_value(name, value) if value is None else value)}")
        return "\n".join(lines) + "\n"


def load_config_file(path: Path, *, follow_link: bool = False) -> dict[str, Any]:
    """Read a TOML config into keyword arguments for ``build_config`` (unknown keys are errors).

    Only a regular file: a FIFO would block for ever. A run's ``config.toml`` is read only if it is no link
    (UnsafeFileError, core/safe_open.py); ``follow_link`` is for a path the user typed (``--config``),
    which may be a link of theirs."""
    try:
        with open(os.path.realpath(path) if follow_link else path, "rb", opener=open_regular) as handle:
            data = tomllib.load(handle)
    except UnsafeFileError as error:
        if not follow_link:
            raise
        raise ConfigError(f"--config {path}: {error.kind}, not a regular file: give a TOML file.") from None
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file.") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"--config {path}: not valid TOML: {error}.") from None
    except RecursionError:
        raise ConfigError(f"--config {path}: not valid TOML here: its arrays or tables are nested too deeply to read.") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"--config {path}: not UTF-8 text (byte {error.start}); a TOML file must be UTF-8.") from None
    except OSError as error:  # no permission
        raise ConfigError(f"--config {path}: cannot be read: {error.strerror or error}.") from None
    return _settings_from_mapping(data, source=str(path))


def config_from_toml(text: str, source: str) -> TrainConfig:
    """A configuration written by ``TrainConfig.to_toml`` (a checkpoint keeps one), read back."""
    return build_config(settings_from_toml(text, source))


def settings_as_used(text: str, source: str) -> dict[str, Any]:
    """A run's config.toml as compare shows it: its settings, those the workload's own optimizer or scheduler
    replaced shown from its record (``optimizer = torch.optim.SGD (the workload's)``)."""
    settings = settings_from_toml(text, source)
    record = tomllib.loads(text).get(FROM_WORKLOAD_TABLE)
    return settings if record is None else {**settings, **FromWorkload.from_mapping(record, source).shown()}


def settings_from_toml(text: str, source: str) -> dict[str, Any]:
    """The settings of TOML text, as ``load_config_file`` gives them for a file."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{source}: not valid TOML: {error}.") from None
    except RecursionError:
        raise ConfigError(f"{source}: not valid TOML here: its arrays or tables are nested too deeply to read.") from None
    return _settings_from_mapping(data, source)


def build_config(*layers: Mapping[str, Any]) -> TrainConfig:
    """Merge defaults and ``layers`` (later wins: a file, then flags) into a validated TrainConfig.

    Each mapping holds top-level settings plus an ``options`` mapping of live options (raw values,
    parsed here) and ``at`` as a list of strings; the ``at`` lists add up (an entry given twice counts once).
    """
    merged: dict[str, Any] = {}
    option_values: dict[str, Any] = {}
    at: list[str] = []
    trials: list[str] = []
    for settings in layers:
        for key, value in settings.items():
            if key == "options":
                option_values.update(value)
            elif key == "at":
                at.extend(str(entry) for entry in value)
            elif key == "trials":
                trials.extend(str(entry) for entry in value)
            else:
                merged[key] = value
    options = LiveOptions()
    for name, raw in option_values.items():
        try:
            options = options.with_value(name, parse_option_value(name, raw))
        except OptionChangeError as refusal:
            raise ConfigError(f"options.{name} (--{name.replace('_', '-')}): {refusal}.") from None
    if "schedule_extensions" in merged:
        extensions = merged["schedule_extensions"]
        if not isinstance(extensions, (list, tuple)) or not all(isinstance(pair, (list, tuple)) for pair in extensions):
            raise ConfigError(f"schedule_extensions must be a list of [step, steps before] pairs; got {shown(extensions)}.")
        merged["schedule_extensions"] = tuple(tuple(pair) for pair in extensions)
    changes = tuple(dict.fromkeys(ScheduledChange.parse(text) for text in at))
    scripted_trials = tuple(dict.fromkeys(ScheduledChange.parse(text, "--trial") for text in trials))
    try:
        return TrainConfig(**merged, options=options, at=changes, trials=scripted_trials)
    except TypeError as error:  # an unknown keyword slipped past the checks above
        raise ConfigError(str(error)) from None


def _settings_from_mapping(data: Mapping[str, Any], source: str) -> dict[str, Any]:
    known = {f.name for f in fields(TrainConfig)}
    settings: dict[str, Any] = {}
    for key, value in data.items():
        if key == WORKERS.name:
            # A setting before it became a live option: config files and the config.toml of older runs (and
            # their checkpoints) have it at the top level, where it still counts, as [options] workers.
            options = data.get("options")
            if isinstance(options, Mapping) and WORKERS.name in options:
                raise ConfigError(f"{source}: workers is set twice, at the top level and in [options]; keep one.")
            settings.setdefault("options", {})[WORKERS.name] = value
        elif key == "options":
            if not isinstance(value, Mapping):
                raise ConfigError(f"{source}: [options] must be a table of live options.")
            for option in value:
                if option not in LiveOptions.__dataclass_fields__:
                    raise ConfigError(f"{source}: unknown option options.{option}{suggestion(option, LiveOptions.__dataclass_fields__)}.")
                if OPTIONS_BY_NAME[option].setting:
                    raise ConfigError(f"{source}: options.{option} is set at the top level, as {option} = ..., not in [options].")
            settings["options"] = {**settings.get("options", {}), **value}
        elif key in ("at", "trials"):
            if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
                raise ConfigError(f'{source}: {key} must be a list of "STEP:OPTION=VALUE" strings.')
            settings[key] = list(value)
        elif key == FROM_WORKLOAD_TABLE:  # what the workload brought: a record, not a setting (settings_as_used)
            continue
        elif key in known:
            settings[key] = value
        else:
            raise ConfigError(f"{source}: unknown setting {shown(key)}{suggestion(key, known)}.")
    return settings


def suggestion(name: str, candidates) -> str:
    """The hint for a name that is none of ``candidates``: " (did you mean 'x'?)" with the closest, or nothing."""
    close = difflib.get_close_matches(name, list(candidates), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _are_extensions(extensions: Any) -> bool:
    if not isinstance(extensions, tuple):
        return False
    previous_step = -1
    for pair in extensions:
        if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(n, int) and not isinstance(n, bool) for n in pair)):
            return False
        step, total_before = pair
        if not (previous_step < step <= total_before):
            return False
        previous_step = step
    return True


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check(ok: bool, setting: str, requirement: str, value: Any) -> None:
    if not ok:
        raise ConfigError(f"{setting} (--{setting.replace('_', '-')}) {requirement}; got {shown(value)}.")


def _toml_value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'
