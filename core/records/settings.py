"""A run's settings that are not live: how one is declared (a ``Setting``), and each of them, in ``SETTINGS``, as
core/options.py holds what a live option is and each live option (``LIVE_OPTIONS``).

A setting owns its name, its default, what it accepts (a number's ``Bounds``, core/options.py, with its range and
what 0 or "auto" mean; a few choices, on or off, a text that passes its check, a list of steps), its flag and the
flag's help. From it come TrainConfig's field default (core/records/config.py), the check where a TrainConfig is
built (``check``: the value as the setting holds it, or a ConfigError naming the setting and its flag), the flag in
``torchlab-tui --help`` under its heading (``group``), with the default stated from the declared one, and the list of
settings a command line sets (core/launch/arguments.py). A flag's text, a TOML value and a value built in code are
all checked by the same ``check``, so that none takes what another refuses; ``steps`` is the live option's own
(``STEPS``). Apart from TrainConfig, which reads and writes them as config.toml, so that a setting is one declaration
here, beside the others and the limits they are checked against.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from torchlab.core.errors import ConfigError, shown
from torchlab.core.bounds import Bounds, OptionChangeError, written_limit
from torchlab.core.options import MAX_STEPS, STEPS
from torchlab.core.wire.protocol import DEFAULT_PROFILE_STEPS

#: The heading of ``torchlab-tui --help`` a setting's flag is listed under: "run" beside ``--run-dir`` at the top,
#: "live" after the live options (a trial's length), else its own group.
Group = Literal["run", "training", "live", "probes"]


@dataclass(frozen=True, kw_only=True)
class Setting:
    """One setting. Subclasses say what its values are (``NumberSetting``, ``ChoiceSetting``, ``SwitchSetting``,
    ``TextSetting``, ``StepsSetting``)."""

    name: str  #: TrainConfig's field, config.toml's key; the flag is the name with dashes
    default: Any
    help: str  #: the flag's help, without the default: ``flag_help`` adds it from ``default``
    group: Group
    metavar: str | None = "N"
    #: what a default of None (the run's choice) means, for the help: "the workload's, else 32"
    default_means: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def check(self, value: Any) -> Any:
        """``value`` (a flag's text, a TOML value or one given in code) as the setting holds it, or the
        ConfigError that names the setting and its flag."""
        raise NotImplementedError

    def refusal(self, requirement: str, value: Any) -> ConfigError:
        return ConfigError(f"{self.name} ({self.flag}) {requirement}; got {shown(value)}.")

    def stated_default(self) -> str | None:
        """The default as ``--help`` states it ("default 0.01"); None where the help says it in words, or there is none."""
        if self.default is None:
            return f"default: {self.default_means}" if self.default_means else None
        return f"default {self.default:g}" if isinstance(self.default, float) else f"default {self.default}"

    def flag_help(self) -> str:
        default = self.stated_default()
        text = self.help if default is None else f"{self.help} ({default})"
        return text.replace("%", "%%")  # argparse formats the help with % (%(default)s)

    def add_flag(self, group: argparse._ActionsContainer) -> None:
        """The command-line flag: its raw text is checked where the TrainConfig is built, with the TOML values."""
        group.add_argument(self.flag, dest=self.name, metavar=self.metavar, help=self.flag_help())


@dataclass(frozen=True, kw_only=True)
class NumberSetting(Setting):
    """A number within its ``bounds``; a default of None (the run's choice) is kept as it is."""

    bounds: Bounds

    def check(self, value: Any) -> Any:
        if value is None and self.default is None:
            return None
        try:
            return self.bounds.parse(self.name, value)
        except OptionChangeError:
            raise self.refusal(f"must be {self.bounds.must_be}", value) from None


@dataclass(frozen=True, kw_only=True)
class ChoiceSetting(Setting):
    """One of a few names."""

    choices: tuple[str, ...]
    metavar: str | None = None  # argparse lists the choices

    def check(self, value: Any) -> str:
        if value not in self.choices:
            raise self.refusal(f"must be one of {', '.join(self.choices)}", value)
        return value

    def add_flag(self, group: argparse._ActionsContainer) -> None:
        group.add_argument(self.flag, dest=self.name, choices=self.choices, help=self.flag_help())


@dataclass(frozen=True, kw_only=True)
class SwitchSetting(Setting):
    """On or off (``--name`` / ``--no-name``; true or false in TOML). Its help says what each means."""

    def check(self, value: Any) -> bool:
        if not isinstance(value, bool):
            raise self.refusal("must be true or false", value)
        return value

    def stated_default(self) -> str | None:
        return None

    def add_flag(self, group: argparse._ActionsContainer) -> None:
        group.add_argument(self.flag, dest=self.name, action=argparse.BooleanOptionalAction, default=None, help=self.flag_help())


@dataclass(frozen=True, kw_only=True)
class TextSetting(Setting):
    """A text that ``accepts`` takes (``requirement`` says which, for the refusal); None where that is the default."""

    accepts: Callable[[str], bool]
    requirement: str  #: "must be auto, cpu, cuda or cuda:N..."
    #: what the flag's text becomes before it is checked (a path made absolute), as argparse's ``type``
    from_flag: Callable[[str], str] | None = None

    def check(self, value: Any) -> str | None:
        if value is None and self.default is None:
            return None
        if not (isinstance(value, str) and self.accepts(value)):
            raise self.refusal(self.requirement, value)
        return value

    def add_flag(self, group: argparse._ActionsContainer) -> None:
        group.add_argument(self.flag, dest=self.name, type=self.from_flag, metavar=self.metavar, help=self.flag_help())


@dataclass(frozen=True, kw_only=True)
class StepsSetting(Setting):
    """Optimizer steps, each within ``bounds``: a repeatable flag (``--profile-at 50 --profile-at 200``), a TOML
    list; held as a tuple."""

    bounds: Bounds
    must_be: str  #: what the steps must be, for the refusal
    metavar: str | None = "STEP"

    def check(self, value: Any) -> tuple[int, ...]:
        if not isinstance(value, (list, tuple)):
            raise self.refusal("must be a list of steps", value)
        return tuple(self._step(step) for step in value)

    def _step(self, step: Any) -> int:
        try:
            return self.bounds.parse(self.name, step)
        except OptionChangeError:
            raise self.refusal(f"must be {self.must_be}", step) from None

    def stated_default(self) -> str | None:
        return None

    def add_flag(self, group: argparse._ActionsContainer) -> None:
        group.add_argument(self.flag, dest=self.name, action="append", metavar=self.metavar, help=self.flag_help())


# ----------------------------------------------------------------------------- the settings, and what they accept
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
EVERY_FEW_STEPS = Bounds(whole=True, minimum=1, maximum=MAX_STEPS, off=0, wording="a whole number of steps from {minimum} to {maximum}, or 0 (off)")
#: A cadence the run can also choose itself ("auto"): core/engine/measure/probes.py, state/checkpoint.py, measure/memory.py.
AUTO_CADENCE = Bounds(whole=True, minimum=1, maximum=MAX_STEPS, off=0, auto=True,
                      wording="a whole number of steps from {minimum} to {maximum}, 0 (off) or auto")
#: One optimizer step, as ``--at``, ``--trial`` and ``--profile-at`` name it.
OPTIMIZER_STEP = Bounds(whole=True, minimum=1, maximum=MAX_STEPS, wording="an optimizer step from {minimum} to {maximum}")
#: The steps of each arm of a trial: ``--trial-steps``, and a trial typed in the app (core/analysis/trial_words.py).
TRIAL_STEPS = Bounds(whole=True, minimum=1, maximum=MAX_TRIAL_STEPS, wording="a whole number from {minimum} to {maximum} (steps an arm)")


def _is_device(name: str) -> bool:
    match = re.fullmatch(r"auto|cpu|cuda(?::(\d{1,4}))?", name)
    return match is not None and (match.group(1) is None or int(match.group(1)) <= MAX_CUDA_INDEX)


def _absolute_path(typed: str) -> str:
    """A directory typed on the command line, as a run records it: the same from any directory (a resume)."""
    return str(Path(typed).expanduser().absolute())


#: The settings that are not live, each declared once, as a ``Setting`` (above): TrainConfig's field defaults, the
#: checks, the flags and their help come from here. In the order ``torchlab-tui --help`` lists them under their
#: headings (config.toml follows TrainConfig's fields). ``steps`` is the live option's own (STEPS): one definition.
STEPS_SETTING = NumberSetting(
    name=STEPS.name, default=STEPS.default, bounds=STEPS.bounds,
    group="training", metavar=STEPS.metavar, help=STEPS.flag_help,
)
BATCH_SIZE = NumberSetting(
    name="batch_size", default=None,
    bounds=Bounds(whole=True, minimum=1, maximum=MAX_BATCH_SIZE, wording="a whole number from {minimum} to {maximum}"),
    group="training", help="per-step micro-batch size", default_means="the workload's, else 32",
)
SEED = NumberSetting(
    name="seed", default=0,
    bounds=Bounds(whole=True, minimum=0, maximum=MAX_SEED,
                  wording="a whole number from {minimum} to {maximum} (NumPy's seeds are 32-bit)"),
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
    bounds=Bounds(minimum=0, above=True, wording="a positive number"),
    group="training", metavar="LR", help="peak learning rate",
)
WEIGHT_DECAY = NumberSetting(
    name="weight_decay", default=0.01,
    bounds=Bounds(minimum=0, wording="a number ≥ {minimum}"),
    group="training", metavar="WD", help="AdamW/SGD weight decay on matrices",
)
SCHEDULE = ChoiceSetting(
    name="schedule", default="cosine", choices=SCHEDULES,
    group="training", help="LR schedule; cosine warms up first",
)
WARMUP_STEPS = NumberSetting(
    name="warmup_steps", default=None,
    # Not bounded by ``steps``: a live or resumed shortening of the run keeps the warm-up where it was
    # (core/engine/option_hooks.py, core/launch/training_plan.py), so it may outlast a run cut short.
    bounds=Bounds(whole=True, minimum=0, maximum=MAX_STEPS, wording="a whole number of steps from {minimum} to {maximum}"),
    group="training", help="cosine warmup", default_means="5% of steps",  # TrainConfig.resolved_warmup_steps
)
EVAL_EVERY = NumberSetting(
    name="eval_every", default=50, bounds=EVERY_FEW_STEPS,
    group="training", help="validation every N steps, 0 = off",
)
EVAL_BATCHES = NumberSetting(
    name="eval_batches", default=20,
    bounds=Bounds(whole=True, minimum=1, maximum=MAX_STEPS, wording="a whole number from {minimum} to {maximum}"),
    group="training", help="validation batches per evaluation",
)
CHECKPOINT_EVERY = NumberSetting(  # see core/engine/state/checkpoint.py's CheckpointCadence
    name="checkpoint_every", default="auto",
    bounds=Bounds(whole=True, minimum=1, maximum=MAX_STEPS, off=0, auto=True,
                  wording="a whole number of steps from {minimum} to {maximum}, 0 (only at the end) or auto"),
    group="training", metavar="N|auto",
    help="checkpoint every N steps, 0 = only at the end, auto = every 100th step once a minute has passed and within "
         "1% of the time",
)
KEEP_CHECKPOINTS = NumberSetting(
    name="keep_checkpoints", default=3,
    bounds=Bounds(whole=True, minimum=1, maximum=MAX_KEPT_CHECKPOINTS,
                  wording="a whole number from {minimum} to {maximum}"),
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
    bounds=Bounds(minimum=1, maximum=1000, wording="a number of robust deviations from {minimum} to {maximum}"),
    group="live", metavar="Z",
    help="the spike guard's threshold: a step whose loss or grad norm is more than Z robust deviations (1.4826 x the "
         "median absolute deviation) above the median of the last --spike-window steps is a spike",
)
SPIKE_WINDOW = NumberSetting(
    name="spike_window", default=50,
    bounds=Bounds(whole=True, minimum=20, maximum=10_000, wording="a whole number of steps from {minimum} to {maximum}"),
    group="live", metavar="N", help="the recent steps the spike guard judges a step against",
)
LOG_EVERY = NumberSetting(
    name="log_every", default=1,
    bounds=Bounds(whole=True, minimum=1, maximum=MAX_STEPS, wording="a whole number of steps from {minimum} to {maximum}"),
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
    name="profile_at", default=(), bounds=OPTIMIZER_STEP, must_be=f"optimizer steps from {written_limit(OPTIMIZER_STEP.minimum)} to {written_limit(OPTIMIZER_STEP.maximum)}",
    group="probes", help="profile from optimizer step STEP (repeatable)",
)
PROFILE_STEPS = NumberSetting(
    name="profile_steps", default=DEFAULT_PROFILE_STEPS,
    bounds=Bounds(whole=True, minimum=1, maximum=MAX_PROFILE_STEPS, wording="a whole number from {minimum} to {maximum}"),
    group="probes", help="steps a profiler snapshot records, after 1 warm-up",
)
TELEMETRY_INTERVAL = NumberSetting(
    name="telemetry_interval", default=1.0,
    bounds=Bounds(minimum=MIN_TELEMETRY_INTERVAL_S, maximum=MAX_TELEMETRY_INTERVAL_S, off=0.0,
                  wording="0 (off) or a number of seconds from {minimum} to {maximum}"),
    group="probes", metavar="SECONDS", help="GPU/host sampling period, 0 = off",
)
#: The app's forecaster (what fits: core/engine/forecast/forecaster_process.py): in Linux's idle class it runs only on
#: CPU nothing else wants, costing training nothing measurable, and waits while other work keeps every core busy;
#: niced ("low") it answers there too, for a share of a core.
FORECAST_PRIORITY = ChoiceSetting(
    name="forecast_priority", default="idle", choices=("idle", "low"), group="probes",
    help="the CPU priority of the app's what-fits forecaster: idle (the default) runs only on CPU nothing else wants; "
         "low (niced) also answers on a box whose cores other work keeps busy, taking a share of a core",
)

#: What an MFU is held to where the device's peak is not known (a GPU the table lacks, a MIG slice), or should be
#: another figure than the table's: the device's peak TFLOP/s for the run's compute dtype (core/engine/measure/flops.py)
PEAK_TFLOPS = NumberSetting(
    name="peak_tflops", default=None,
    bounds=Bounds(minimum=0, above=True, maximum=1e6, wording="a number of TFLOP/s above {minimum}, up to {maximum}"),
    group="probes", metavar="TFLOPS", default_means="the GPU's from the table of common GPUs, a CPU's measured",
    help="the device's peak TFLOP/s for the run's dtype, the MFU's denominator, for a device the table lacks",
)

#: The hang watch (core/engine/parallel/hang_watch.py): a step that has not reached its boundary after this many times
#: the run's usual step (at least HANG_MIN_S) has every rank's Python stack and its place in the collectives written
#: to the run directory, and rank 0 says which rank is where.
HANG_AFTER = NumberSetting(
    name="hang_after", default=20.0,
    bounds=Bounds(minimum=2, maximum=1e6, off=0.0, wording="0 (off) or a number of usual step times from {minimum}"),
    group="probes", metavar="TIMES",
    help="a step that has not ended after TIMES the run's usual step time (and at least 10 s) is a hang: every rank's "
         "Python stack and its place in the collectives written to the run directory, and which rank is where said",
)

#: What a hang does once said: the run waits (a slow node may catch up, and a stop then ends it at once), or ends at
#: once, naming its last checkpoint: for a run no one watches, where a hang would hold the nodes until the job's limit.
ON_HANG = ChoiceSetting(
    name="on_hang", default="wait", choices=("wait", "end"), group="probes", metavar=None,
    help="what a hang does once it is said: wait (for a slow node, or for a stop, which then ends the run at once) or "
         "end the run at once, with no final checkpoint (its ranks are stuck), naming the last",
)

SETTINGS: tuple[Setting, ...] = (
    SHARED_RUN_DIR, TENSORBOARD,
    STEPS_SETTING, BATCH_SIZE, SEED, DEVICE, OPTIMIZER, LR, WEIGHT_DECAY, SCHEDULE, WARMUP_STEPS, EVAL_EVERY,
    EVAL_BATCHES, CHECKPOINT_EVERY, KEEP_CHECKPOINTS, RESHARD_AFTER_FORWARD,
    TRIAL_STEPS_SETTING, SPIKE_THRESHOLD, SPIKE_WINDOW,
    LOG_EVERY, PROBE_EVERY, ACT_STATS_EVERY, MEMORY_EVERY, PROFILE_AT, PROFILE_STEPS, TELEMETRY_INTERVAL,
    FORECAST_PRIORITY, PEAK_TFLOPS, HANG_AFTER, ON_HANG,
)
