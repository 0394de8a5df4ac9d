"""Run configuration: one keyword-only dataclass, validated where it is built.

Precedence, lowest first: defaults, then a ``--config`` TOML file, then command-line flags. Every error
names the setting (and the file, for TOML) so the user knows what to change. The resolved configuration
is written to the run directory as ``config.toml``, which ``--config`` reads back. A workload file is recorded as
an absolute path (core/launch/arguments.py ``workload_as_stored``), so a run resumes from any directory.

Each setting that is not live is one declaration here (a ``Setting``, core/records/settings.py; in ``SETTINGS``): its
default, what it accepts (a number's ``Bounds``, core/wire/options.py, with its range and what 0 or "auto" mean;
a choice; a check), its flag and help. TrainConfig's field defaults, the checks where a TrainConfig is built, the
flags (core/launch/arguments.py) and the list of settings a command line sets all come from those declarations,
so a flag's text, a TOML value and a value built in code are checked alike; ``steps`` is the live option's own
(``STEPS``).
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
from torchlab.core.records.settings import ChoiceSetting, NumberSetting, Setting, StepsSetting, SwitchSetting, TextSetting
from torchlab.core.safe_open import UnsafeFileError, open_regular
from torchlab.core.wire.options import (
    LIVE_OPTIONS, MAX_STEPS, OPTIONS_BY_NAME, STEPS, WORKERS, Bounds, LiveOptions, OptionRefused, format_option_value,
    parse_option_value,
)
from torchlab.core.wire.protocol import DEFAULT_PROFILE_STEPS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

DEFAULT_WORKLOAD = "tiny_gpt"
OPTIMIZERS = ("adamw", "sgd")
#: NumPy's legacy seeding (numpy.random.seed) takes 32-bit seeds; a larger one raised deep inside a run.
MAX_SEED = 2**32 - 1
#: torch keeps a device index in 8 signed bits: "cuda:200" became "cuda:-56".
MAX_CUDA_INDEX = 127
#: Seconds between system samples, at most: a longer wait overflowed the sampler's timer (1e30 did).
MAX_TELEMETRY_INTERVAL_S = 3600.0
#: ... and at least, unless 0 (off): each sample is a line of system.jsonl and a message to the app, and it costs
#: ~0.6 ms of a core; 1e-9 wrote ~900 lines a second. Ten a second is more than a person reads.
MIN_TELEMETRY_INTERVAL_S = 0.1
#: Steps one profiler snapshot may record: each adds its events to a trace held in memory until the snapshot ends.
MAX_PROFILE_STEPS = 1000
MAX_TRIAL_STEPS = 1000
DEFAULT_TRIAL_STEPS = 20
#: Step checkpoints kept besides last.pt: each is a whole copy of the model and its optimizer (1.2 GB for 100M
#: parameters with AdamW), so a thousand is more than any disk wants; 1e20 was taken.
MAX_KEPT_CHECKPOINTS = 1000
#: The largest batch: more samples than any device holds at once (the largest published batches are ~64k);
#: a larger figure is a typo, otherwise found only when the dataset is counted.
MAX_BATCH_SIZE = 2**24
SCHEDULES = ("constant", "cosine", "onecycle")

#: A cadence of steps (evaluations, activation statistics): every N steps, or 0 for never.
EVERY_FEW_STEPS = Bounds(whole=True, minimum=1, maximum=MAX_STEPS, off=0, must_be="a whole number of steps from 1 to 10^9, or 0 (off)")
#: A cadence the run can also choose itself ("auto"): core/engine/probe.py, checkpoint.py, memory.py.
AUTO_CADENCE = Bounds(whole=True, minimum=1, maximum=MAX_STEPS, off=0, auto=True,
                      must_be="a whole number of steps from 1 to 10^9, 0 (off) or auto")
#: One optimizer step, as ``--at``, ``--trial`` and ``--profile-at`` name it.
OPTIMIZER_STEP = Bounds(whole=True, minimum=1, maximum=MAX_STEPS, must_be="an optimizer step from 1 to 10^9")
#: The steps of each arm of a trial: ``--trial-steps``, and a trial typed in the app (core/analysis/trials.py).
TRIAL_STEPS = Bounds(whole=True, minimum=1, maximum=MAX_TRIAL_STEPS, must_be=f"a whole number from 1 to {MAX_TRIAL_STEPS} (steps an arm)")


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
        except OptionRefused as refusal:
            raise ConfigError(f"{flag} {shown(text)}: {refusal}.") from None
        return cls(step, option, value)

    def __str__(self) -> str:
        return f"{self.step}:{self.option}={self.value}"


def _is_device(name: str) -> bool:
    match = re.fullmatch(r"auto|cpu|cuda(?::(\d{1,4}))?", name)
    return match is not None and (match.group(1) is None or int(match.group(1)) <= MAX_CUDA_INDEX)


def _absolute_path(typed: str) -> str:
    """A directory typed on the command line, as a run records it: the same from any directory (a resume)."""
    return str(Path(typed).expanduser().absolute())


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


#: The settings that are not live, each declared once (core/records/settings.py): TrainConfig's field defaults, the
#: checks, the flags and their help come from here. In the order ``torchlab-tui --help`` lists them under their
#: headings (config.toml follows TrainConfig's fields). ``steps`` is the live option's own (STEPS): one definition.
STEPS_SETTING = NumberSetting(
    name=STEPS.name, default=STEPS.default, bounds=STEPS.bounds,
    group="training", metavar=STEPS.metavar, help=STEPS.flag_help,
)
BATCH_SIZE = NumberSetting(
    name="batch_size", default=None,
    bounds=Bounds(whole=True, minimum=1, maximum=MAX_BATCH_SIZE, must_be=f"a whole number from 1 to {MAX_BATCH_SIZE}"),
    group="training", help="per-step micro-batch size", default_means="the workload's, else 32",
)
SEED = NumberSetting(
    name="seed", default=0,
    bounds=Bounds(whole=True, minimum=0, maximum=MAX_SEED,
                  must_be=f"a whole number from 0 to {MAX_SEED} (NumPy's seeds are 32-bit)"),
    group="training", help="random seed",
)
DEVICE = TextSetting(
    name="device", default="auto",
    accepts=_is_device, requirement=f"must be auto, cpu, cuda or cuda:N with N from 0 to {MAX_CUDA_INDEX}",
    group="training", metavar="auto|cpu|cuda[:N]", help="where to train",
)
OPTIMIZER = ChoiceSetting(name="optimizer", default="adamw", choices=OPTIMIZERS, group="training", help="optimizer")
LR = NumberSetting(
    name="lr", default=1e-3,
    # No maximum: an LR too large shows itself at once, as a non-finite loss the guard names.
    bounds=Bounds(minimum=0, above=True, must_be="a positive number"),
    group="training", metavar="LR", help="peak learning rate",
)
WEIGHT_DECAY = NumberSetting(
    name="weight_decay", default=0.01,
    bounds=Bounds(minimum=0, must_be="a number ≥ 0"),
    group="training", metavar="WD", help="AdamW/SGD weight decay on matrices",
)
SCHEDULE = ChoiceSetting(
    name="schedule", default="cosine", choices=SCHEDULES,
    group="training", help="LR schedule; cosine warms up first",
)
WARMUP_STEPS = NumberSetting(
    name="warmup_steps", default=None,
    # Not bounded by ``steps``: a live or resumed shortening of the run keeps the warm-up where it was
    # (core/engine/option_hooks.py, core/launch/plan.py), so it may outlast a run cut short.
    bounds=Bounds(whole=True, minimum=0, maximum=MAX_STEPS, must_be="a whole number of steps from 0 to 10^9"),
    group="training", help="cosine warmup", default_means="5% of steps",  # TrainConfig.resolved_warmup_steps
)
EVAL_EVERY = NumberSetting(
    name="eval_every", default=50, bounds=EVERY_FEW_STEPS,
    group="training", help="validation every N steps, 0 = off",
)
EVAL_BATCHES = NumberSetting(
    name="eval_batches", default=20,
    bounds=Bounds(whole=True, minimum=1, maximum=MAX_STEPS, must_be="a whole number from 1 to 10^9"),
    group="training", help="validation batches per evaluation",
)
CHECKPOINT_EVERY = NumberSetting(  # see core/engine/state/checkpoint.py's CheckpointCadence
    name="checkpoint_every", default="auto",
    bounds=Bounds(whole=True, minimum=1, maximum=MAX_STEPS, off=0, auto=True,
                  must_be="a whole number of steps from 1 to 10^9, 0 (only at the end) or auto"),
    group="training", metavar="N|auto",
    help="checkpoint every N steps, 0 = only at the end, auto = every 100th step once a minute has passed and within "
         "1% of the time",
)
KEEP_CHECKPOINTS = NumberSetting(
    name="keep_checkpoints", default=3,
    bounds=Bounds(whole=True, minimum=1, maximum=MAX_KEPT_CHECKPOINTS,
                  must_be=f"a whole number from 1 to {MAX_KEPT_CHECKPOINTS}"),
    group="training", help="step checkpoints kept besides last.pt",
)
#: False: a new run directory is 0700 and its files 0600, whatever the umask (the checkpoints are the
#: user's weights); True: they follow the umask, for colleagues to read. An existing one keeps its mode.
SHARED_RUN_DIR = SwitchSetting(
    name="shared_run_dir", default=False, group="run",
    help="make a new run directory and its files follow your umask (0755 and 0644 under umask 022), for others to read; "
         "by default only you can (0700, files 0600, whatever the umask). An existing run directory keeps its mode, and "
         "what a resume adds follows it",
)
#: A directory where TensorBoard event files are written while training (core/engine/measure/tensorboard.py); None: not.
TENSORBOARD = TextSetting(
    name="tensorboard", default=None,
    accepts=lambda text: text.strip() != "", requirement="must be a directory to write TensorBoard event files to",
    group="run", metavar="DIR", from_flag=_absolute_path,
    help="write TensorBoard event files to DIR while training (the tensorboard extra); kept by a resume",
)
#: With ``parallel=fsdp``: free each block's gathered parameters after its forward and gather them again for its
#: backward (FSDP2's ``reshard_after_forward``, torchtitan's default), or keep them from forward to backward.
RESHARD_AFTER_FORWARD = SwitchSetting(
    name="reshard_after_forward", default=True, group="training",
    help="with --parallel fsdp, free each block's gathered parameters after its forward and gather them again for its "
         "backward (the default: the least memory); --no-reshard-after-forward keeps them, one all-gather a step "
         "fewer for the whole model's parameters held from forward to backward",
)
TRIAL_STEPS_SETTING = NumberSetting(
    name="trial_steps", default=DEFAULT_TRIAL_STEPS, bounds=TRIAL_STEPS,
    group="live", metavar="K", help="the steps of each arm of a trial (its speed is timed on past K, up to 5K and 100, while its interval is wide)",
)
SPIKE_THRESHOLD = NumberSetting(
    name="spike_threshold", default=6.0,
    bounds=Bounds(minimum=1, maximum=1000, must_be="a number of robust deviations from 1 to 1000"),
    group="live", metavar="Z",
    help="the spike guard's threshold: a step whose loss or grad norm is more than Z robust deviations (1.4826 x the "
         "median absolute deviation) above the median of the last --spike-window steps is a spike",
)
SPIKE_WINDOW = NumberSetting(
    name="spike_window", default=50,
    bounds=Bounds(whole=True, minimum=20, maximum=10_000, must_be="a whole number of steps from 20 to 10000"),
    group="live", metavar="N", help="the recent steps the spike guard judges a step against",
)
LOG_EVERY = NumberSetting(
    name="log_every", default=1,
    bounds=Bounds(whole=True, minimum=1, maximum=MAX_STEPS, must_be="a whole number of steps from 1 to 10^9"),
    group="probes", help="report metrics every N steps",
)
PROBE_EVERY = NumberSetting(
    name="probe_every", default="auto", bounds=AUTO_CADENCE,
    group="probes", metavar="N|auto", help="per-module grad norms every N steps, 0 = off, auto = within ~1% of step time",
)
ACT_STATS_EVERY = NumberSetting(
    name="act_stats_every", default=0, bounds=EVERY_FEW_STEPS,
    group="probes", help="activation statistics every N steps, 0 = off",
)
MEMORY_EVERY = NumberSetting(  # see core/engine/measure/memory.py's MemoryCadence
    name="memory_every", default="auto", bounds=AUTO_CADENCE,
    group="probes", metavar="N|auto",
    help="memory by kind (saved activations, per module) every N steps, 0 = off, auto = at most once a second",
)
PROFILE_AT = StepsSetting(  # the optimizer steps at which a profiler snapshot starts
    name="profile_at", default=(), bounds=OPTIMIZER_STEP, must_be="optimizer steps from 1 to 10^9",
    group="probes", help="profile from optimizer step STEP (repeatable)",
)
PROFILE_STEPS = NumberSetting(
    name="profile_steps", default=DEFAULT_PROFILE_STEPS,
    bounds=Bounds(whole=True, minimum=1, maximum=MAX_PROFILE_STEPS, must_be=f"a whole number from 1 to {MAX_PROFILE_STEPS}"),
    group="probes", help="steps a profiler snapshot records, after 1 warm-up",
)
TELEMETRY_INTERVAL = NumberSetting(
    name="telemetry_interval", default=1.0,
    bounds=Bounds(minimum=MIN_TELEMETRY_INTERVAL_S, maximum=MAX_TELEMETRY_INTERVAL_S, off=0.0,
                  must_be=f"0 (off) or a number of seconds from {MIN_TELEMETRY_INTERVAL_S:g} to {MAX_TELEMETRY_INTERVAL_S:g}"),
    group="probes", metavar="SECONDS", help="GPU/host sampling period, 0 = off",
)

SETTINGS: tuple[Setting, ...] = (
    SHARED_RUN_DIR, TENSORBOARD,
    STEPS_SETTING, BATCH_SIZE, SEED, DEVICE, OPTIMIZER, LR, WEIGHT_DECAY, SCHEDULE, WARMUP_STEPS, EVAL_EVERY,
    EVAL_BATCHES, CHECKPOINT_EVERY, KEEP_CHECKPOINTS, RESHARD_AFTER_FORWARD,
    TRIAL_STEPS_SETTING, SPIKE_THRESHOLD, SPIKE_WINDOW,
    LOG_EVERY, PROBE_EVERY, ACT_STATS_EVERY, MEMORY_EVERY, PROFILE_AT, PROFILE_STEPS, TELEMETRY_INTERVAL,
)

@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything a run needs besides the workload itself. Each setting's default is its declaration's (above),
    where its meaning is said; the other fields are the workload, the live options and records of the run."""

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
        except OptionRefused as refusal:
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
