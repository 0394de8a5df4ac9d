"""Live options: the settings that may change while a run trains. Each is one ``LiveOption`` object in
``LIVE_OPTIONS``, and everything else is generated from or dispatched through that registry.

An option owns its name, how a value is parsed (from a command line, ``--at``, a TOML file, a prompt
or a protocol message: strings and JSON values alike) and shown back, its refusal of values no run
could take (``OptionChangeError`` with a reason the user can act on), its command-line flag, its key, its
prompt and its row in the app's options panel. What a number accepts is its ``Bounds`` (core/bounds.py): the one definition
of its type, range and off-word that every way of giving it goes through; the run's numeric settings
(core/records/settings.py, ``--steps``, ``--keep-checkpoints``...) have theirs too, and ``steps`` is one definition
as a setting and as a live option. What makes a value real is the trainer's: it enacts
each option with the hook registered for that name (core/engine/option_hooks.py, ``@enacts``), and refuses
what *this* run cannot do (fp16 without CUDA, checkpointing of a model without blocks).

Adding an option: one ``LiveOption`` here, appended to ``LIVE_OPTIONS``, and its enact hook in
core/engine/option_hooks.py (docs/options.md, "Adding a live option").
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, make_dataclass, replace
from typing import Any

from torchlab.core.bounds import AUTO_WORD, OFF_WORDS, ON_WORDS, Bounds, OptionChangeError
from torchlab.core.cpu_share import usable_cores
from torchlab.core.errors import shown


def usable_cpus() -> int:
    """The CPU cores this process may use: its affinity, or its cgroup's CPU quota where that is smaller
    (core/cpu_share.py)."""
    return usable_cores()


def max_workers() -> int:
    """The most data-loader workers a run may ask for here: each is a process with a copy of the dataset,
    so ``--workers 1000`` (a typo) forked a thousand and brought a 2-core box to a load of 200."""
    return max(8, 4 * usable_cpus())


#: The most optimizer steps a run may be given, and the largest step a change, a trial or a profile may name.
#: At a millisecond a step, 10^9 steps train for 12 days; a larger figure is a slip of the keyboard
#: (``--steps 99999999999999999999`` was taken: a run that never ends).
MAX_STEPS = 10**9


@dataclass(frozen=True, kw_only=True)
class LiveOption:
    """One live option. Subclasses say what its values are (``Choice``, ``Switch``, ``Number``)."""

    name: str  #: the key in LiveOptions, commands, events, metrics.jsonl and config.toml's [options]
    default: Any
    label: str  #: the options panel's row
    short: str  #: the one-line options panel (small terminals)
    key: str  #: the app's key
    footer: str  #: the key's label in the footer
    help: str  #: the key's help line and command-palette entry
    flag_help: str  #: the command-line flag's help
    metavar: str = "VALUE"  #: the flag's value in --help
    in_footer: bool = True
    #: a row of the app's options panel (``steps`` is not: the header shows it, "step 59/2000")
    in_panel: bool = True
    #: what the app says a request will do, in the event log
    takes_effect: str = "applies at the next step"
    #: its start value is the run's setting of the same name (``--steps``; ``steps`` at the top of a TOML file),
    #: which owns the flag and the key; the option carries it on from there as it changes
    setting: bool = False
    #: its value changes what a step does and costs: the impact table begins a segment at each change of it
    #: (the run's length, ``steps``, does not: a segment there would compare a run with itself)
    shapes_a_step: bool = True
    #: its value changes the memory a step takes, as the forecast models it (core/engine/forecast/memory_forecast.py
    #: ``StepShape``): a change of it is predicted before it is made, and what fits is asked again after it
    shapes_memory: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def parse(self, value: Any) -> Any:
        """``value`` as this option's typed value, or OptionChangeError saying why not."""
        raise NotImplementedError

    def format(self, value: Any) -> str:
        """The value as a user would type it back (``clip=off``, ``checkpointing=on``)."""
        return str(value)

    def brief(self, value: Any) -> str:
        """The value in a few characters, for the options panel (``checkpointing``'s blocks: "2 blocks")."""
        return self.format(value)

    def add_flag(self, group: argparse._ArgumentGroup) -> None:
        """The command-line flag; its raw text is parsed with the settings (core/records/config.py), so a bad
        value is refused with the same words as in a TOML file or a prompt."""
        group.add_argument(self.flag, dest=self.name, metavar=self.metavar, help=self.flag_help)

    def flag_arguments(self, value: Any) -> list[str]:
        """The command-line words that set this option to ``value`` (what ``add_flag`` reads back): how the app
        restarts a run with options set on its error screen (``--resume RUN --lr-scale 0.5 --clip 1.0``)."""
        return [self.flag, self.format(value)]


@dataclass(frozen=True, kw_only=True)
class Choice(LiveOption):
    """One of a few named modes; its key cycles through them, skipping those this run refused."""

    choices: tuple[str, ...]

    def parse(self, value: Any) -> str:
        text = str(value).strip().lower() if value is not None else "off"
        if text in OFF_WORDS and "off" in self.choices:
            return "off"
        if text in ON_WORDS and "on" in self.choices:
            return "on"
        if text not in self.choices:
            raise OptionChangeError(f"{self.name} must be one of {', '.join(self.choices)}, got {shown(value)}")
        return text

    def add_flag(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument(self.flag, dest=self.name, choices=self.choices, help=self.flag_help)

    def next_value(self, current: Any, refused: Callable[[str], bool]) -> str:
        """The mode after ``current`` in the cycle, skipping those ``refused``; "off" if all are."""
        position = self.choices.index(current) if current in self.choices else 0
        for offset in range(1, len(self.choices) + 1):
            candidate = self.choices[(position + offset) % len(self.choices)]
            if not refused(candidate):
                return candidate
        return self.default


@dataclass(frozen=True, kw_only=True)
class Switch(LiveOption):
    """On or off; its key toggles it. With ``auto`` (what it means, for the help), "auto" is a value too: None,
    which the trainer makes on or off for its device when the run starts."""

    auto: str = ""

    def parse(self, value: Any) -> bool | None:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower() if value is not None else (AUTO_WORD if self.auto else "off")
        if text in ON_WORDS:
            return True
        if text in OFF_WORDS:
            return False
        if self.auto and text == AUTO_WORD:
            return None
        raise OptionChangeError(f"{self.name} must be on{', off or auto' if self.auto else ' or off'}, got {shown(value)}")

    def format(self, value: Any) -> str:
        if value is None and self.auto:
            return AUTO_WORD
        return "on" if value else "off"

    def add_flag(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument(self.flag, dest=self.name, action=argparse.BooleanOptionalAction, default=None, help=self.flag_help)

    def flag_arguments(self, value: Any) -> list[str]:
        if value is None and self.auto:  # auto is the flag not given
            return []
        return [self.flag if value else "--no-" + self.flag[2:]]

    def next_value(self, current: Any, refused: Callable[[bool], bool]) -> bool:
        return not bool(current)


@dataclass(frozen=True, kw_only=True)
class Blocks(Switch):
    """On (every block the model names), off, or some of its blocks by name: ``blocks.2,blocks.3``, held as that text
    (a JSON scalar on the wire, in checkpoints and in rows, as every option's value is); the OOM rescue takes the
    blocks that saved the most activations first. Its key toggles it off, and on for all of them."""

    def parse(self, value: Any) -> bool | str:
        if isinstance(value, (list, tuple)):  # a TOML array
            names = [item.strip() if isinstance(item, str) else item for item in value]
        elif isinstance(value, str) and value.strip().lower() not in ON_WORDS | OFF_WORDS:
            names = [name.strip() for name in value.split(",")]
        elif isinstance(value, (bool, str)) or value is None:
            return super().parse(value)
        else:  # a number: not a count of blocks (1 was on)
            names = []
        if not names or not all(isinstance(name, str) and name for name in names):
            raise OptionChangeError(f"{self.name} must be on, off or block names separated by commas, got {shown(value)}")
        return ",".join(dict.fromkeys(names))  # each block once, in the order given

    @staticmethod
    def names(value: bool | str) -> list[str] | None:
        """The blocks a value names: None for on (all of them), none for off."""
        if isinstance(value, str):
            return value.split(",")
        return None if value else []

    def format(self, value: Any) -> str:
        return value if isinstance(value, str) else super().format(value)

    def brief(self, value: Any) -> str:
        if isinstance(value, str):
            count = len(self.names(value))
            return f"{count} block{'s' if count != 1 else ''}"
        return self.format(value)

    def add_flag(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument(self.flag, dest=self.name, nargs="?", const=True, default=None, metavar="BLOCKS",
                           help=self.flag_help)
        group.add_argument("--no-" + self.flag[2:], dest=self.name, action="store_const", const=False,
                           help=f"no {self.label} of any block{' (the default)' if self.default is False else ''}")

    def flag_arguments(self, value: Any) -> list[str]:
        return [self.flag, value] if isinstance(value, str) else super().flag_arguments(value)


@dataclass(frozen=True, kw_only=True)
class Number(LiveOption):
    """A number typed in a prompt, within its ``bounds``."""

    bounds: Bounds
    prompt: str  #: the prompt's title
    hint: str  #: the prompt's hint under the input

    def parse(self, value: Any) -> int | float | None:
        return self.bounds.parse(self.name, value)

    def format(self, value: Any) -> str:
        return "off" if value is None else str(value)

    def shown_in_prompt(self, value: Any) -> str:
        """The current value, pre-filled in the prompt."""
        return self.format(value) if value is not None or self.bounds.can_be_off else ""


AMP = Choice(
    name="amp", default="off", shapes_memory=True, choices=("off", "bf16", "fp16"),
    label="amp", short="amp", key="a", footer="AMP",
    help="Cycle mixed precision: off → bf16 → fp16 → off",
    flag_help="autocast precision (default off; fp16 needs CUDA)",
)
CHECKPOINTING = Blocks(
    name="checkpointing", default=False, shapes_memory=True,
    label="checkpointing", short="ckpt", key="c", footer="Ckpt",
    help="Toggle activation checkpointing of the model's blocks",
    flag_help="activation checkpointing of the model's blocks (all of them, or BLOCKS: names separated by commas)",
)
CLIP = Number(
    name="clip", default=None,
    bounds=Bounds(minimum=0, above=True, off=None, wording="a positive max grad norm, or 0 or off for no clipping"),
    label="clip norm", short="clip", key="g", footer="Clip", metavar="NORM|off",
    help="Set the max gradient norm to clip to (0 or empty = off)",
    prompt="Clip gradients to a max global norm", hint="a positive number, e.g. 1.0; 0 or off: no clipping",
    flag_help="clip the global grad norm to NORM (default off; 0 or off: no clipping)",
)
ACCUM = Number(
    name="accum", default=1, shapes_memory=True,
    bounds=Bounds(whole=True, minimum=1, maximum=4096, wording="a whole number from {minimum} to {maximum}"),
    label="accumulation", short="accum", key="m", footer="Accum", metavar="N",
    help="Set gradient accumulation steps",
    prompt="Gradient accumulation steps", hint="a whole number from 1 to 4096; the batch per optimizer step grows with it",
    flag_help="gradient accumulation micro-steps per optimizer step (default 1)",
)
SPLIT = Number(
    name="split", default=1, shapes_memory=True,
    bounds=Bounds(whole=True, minimum=1, maximum=4096, wording="a whole number of pieces from {minimum} to {maximum}"),
    label="batch split", short="split", key="k", footer="Split", metavar="N", in_footer=False,
    help="Split each batch into pieces run in turn: less memory, the same gradient",
    prompt="Split each batch into pieces", hint="a whole number from 1; each piece's activations alone are alive at once, "
         "the step's samples and gradient stay the same",
    flag_help="cut each batch into N pieces along its first dimension, run one after another with their gradients "
              "accumulated: the same samples and gradient per step (for a loss that is a mean over the batch), a "
              "fraction of the activations' memory (default 1)",
)
OOM_RESCUE = Switch(
    name="oom_rescue", default=True,
    label="oom rescue", short="oom", key="O", footer="OOM", in_footer=False, in_panel=False,
    help="Toggle OOM rescue: a step out of memory is retried with its batch split (then checkpointing)",
    flag_help="retry a step that runs out of memory with its batch split in two, down to one sample, then with "
              "activation checkpointing, each kept as the option's value (default on; --no-oom-rescue: stop instead)",
)
SPIKE_GUARD = Choice(
    name="spike_guard", default="off", choices=("off", "skip", "rollback"),
    label="spike guard", short="spike", key="G", footer="Spike", in_footer=False,
    help="Cycle the spike guard: off → skip (a spiking step's update held back) → rollback (to a copy 10-20 steps back)",
    flag_help="what a step whose loss or grad norm spikes above the recent steps' gets (--spike-threshold over "
              "--spike-window steps): off (a notice; default), skip (its update held back) or rollback (the weights and "
              "optimizer back 10-20 steps, from copies in host memory; a second within a window halves the LR a while)",
)
LR_SCALE = Number(
    name="lr_scale", default=1.0,
    bounds=Bounds(minimum=0, above=True, maximum=1000, wording="a factor above {minimum} and at most {maximum}"),
    label="lr scale", short="lr×", key="l", footer="LR×", metavar="X",
    help="Set the learning-rate scale (multiplies the schedule)",
    prompt="Learning-rate scale", hint="a factor above 0 that multiplies the schedule, e.g. 0.5",
    flag_help="multiply the schedule's LR (default 1)",
)
WORLD_SIZE = Number(
    name="world_size", default=1, shapes_memory=True, bounds=Bounds(whole=True, minimum=1, maximum=1024, wording="a whole number from {minimum} to {maximum}"),
    label="world size", short="ws", key="w", footer="World", metavar="N", in_footer=False,
    help="Set the number of training processes",
    prompt="World size", hint="the number of training processes (ranks), from 1; the trainer checkpoints and relaunches them",
    flag_help="data-parallel ranks, one per GPU or CPU core; the global batch stays --batch-size (default 1)",
    takes_effect="checkpoint and relaunch at the next step",
)
PARALLEL = Choice(
    name="parallel", default="ddp", shapes_memory=True, choices=("ddp", "fsdp"),
    label="parallel", short="par", key="D", footer="Parallel", in_footer=False,
    help="Switch how the ranks hold the model: ddp (a whole copy each) ↔ fsdp (sharded over them)",
    flag_help="how the ranks hold the model: ddp (each a whole copy; default) or fsdp (FSDP2: parameters, gradients "
              "and optimizer state sharded over the ranks, each block gathered whole only while it runs); from world "
              "size 2",
    takes_effect="checkpoint and relaunch the ranks at the next step",
)

STEPS = Number(
    name="steps", default=200, bounds=Bounds(whole=True, minimum=1, maximum=MAX_STEPS, wording="a whole number of steps from {minimum} to {maximum}"),
    label="steps", short="steps", key="e", footer="Steps", metavar="N", in_footer=False,
    help="Set the step the run ends at: extend or shorten it while it trains",
    prompt="Train to step", hint="the step to end at, not below the current one; torchlab's LR schedules go on without a jump, "
         "a workload's own scheduler is built again for the new total",
    flag_help="optimizer steps to train to", setting=True, in_panel=False, shapes_a_step=False,  # its setting states the default
)

COMPILE = Switch(
    name="compile", default=False,
    label="compile", short="compile", key="C", footer="Compile", in_footer=False,
    help="Toggle torch.compile of the model (it compiles at the next step boundary)",
    flag_help="torch.compile the model (default mode, inductor), at the first step boundary; "
              "if it cannot compile, the run says why and trains uncompiled",
    takes_effect="compiles at the next step boundary: seconds to a minute the first time, training waits",
)
DYNAMIC = Choice(
    name="dynamic", default="auto", choices=("auto", "on", "off"),
    label="dynamic shapes", short="dyn", key="Y", footer="Dynamic", in_footer=False, in_panel=False,
    help="Cycle torch.compile's shapes: auto (a size that changes is compiled dynamic) → on (one graph for every size) "
         "→ off (a graph for each size)",
    flag_help="torch.compile's shapes while compile is on: auto (each size specialised, a dimension that changes made "
              "dynamic at its first recompile: torch's default), on (dynamic from the first compile: one graph for every "
              "size) or off (a graph specialised to each size, until torch's recompile_limit: then the frame runs "
              "eagerly)",
    takes_effect="compiles again at the next step boundary while compile is on; kept for when it is on",
)
WORKERS = Number(
    name="workers", default=0,
    bounds=Bounds(whole=True, minimum=0, maximum=max_workers(),
                  wording="a whole number from {minimum} (load in the training process) to {maximum} on this machine "
                          f"({usable_cpus()} usable CPU cores; more workers than cores only compete)"),
    label="data workers", short="workers", key="W", footer="Workers", metavar="N", in_footer=False,
    help="Set the number of DataLoader worker processes",
    prompt="DataLoader worker processes",
    hint="0 loads in the training process; the batches are the same whatever the number",
    flag_help="DataLoader worker processes (default 0); the batches and their order are the same whatever the number",
    takes_effect="applies at the next step: the loader restarts where it is",
)
PIN_MEMORY = Switch(
    name="pin_memory", default=None, auto="on with CUDA, off without",
    label="pin memory", short="pin", key="n", footer="Pin", in_footer=False,
    help="Toggle pinned (page-locked) host memory for batches, CUDA only",
    flag_help="load batches into page-locked memory, for faster copies to a GPU (CUDA only; default: on with CUDA)",
    takes_effect="applies at the next step: the loader restarts where it is",
)

#: Every live option, in the order the app and the command line list them.
#: The app's key that trials a change (a few steps with it on the same batches, then undone): the option keys above
#: and the words that point to a trial (core/analysis/bottleneck.py) name it from here.
TRIAL_KEY = "T"

LIVE_OPTIONS: tuple[LiveOption, ...] = (AMP, CHECKPOINTING, COMPILE, DYNAMIC, CLIP, ACCUM, SPLIT, OOM_RESCUE, SPIKE_GUARD, LR_SCALE,
                                         WORKERS, PIN_MEMORY, WORLD_SIZE, PARALLEL, STEPS)
#: The source of the ``set`` a resumed process gives itself for an option its checkpoint had on but cannot hold
#: (compile: a compiled model is made again in each process): its ``option_applied`` has ``previous`` equal to
#: ``value`` (in force already), which no reader of a run's history counts as a change (core/records/option_history.py).
RESUMED = "resumed"
#: The options whose change may take new rank processes: the trainer checkpoints, its supervisor starts the ranks
#: again (amp only where the ranks shard the model: FSDP2's mixed precision policy is fixed while they live).
RELAUNCHED_BY = (WORLD_SIZE.name, PARALLEL.name, AMP.name)
OPTIONS_BY_NAME: dict[str, LiveOption] = {option.name: option for option in LIVE_OPTIONS}
OPTION_NAMES = tuple(OPTIONS_BY_NAME)
#: The options whose value changes a step's memory (``shapes_memory``), in the registry's order.
MEMORY_SHAPING = tuple(option.name for option in LIVE_OPTIONS if option.shapes_memory)


def live_option(name: Any) -> LiveOption:
    """The option called ``name``, or OptionChangeError naming the ones there are."""
    option = OPTIONS_BY_NAME.get(name) if isinstance(name, str) else None
    if option is None:
        raise OptionChangeError(f"unknown option {shown(name)}; the live options are: {', '.join(OPTION_NAMES)}")
    return option


def parse_option_value(name: str, value: Any) -> Any:
    """``value`` as the typed value of the option ``name``, or OptionChangeError saying why not."""
    return live_option(name).parse(value)


def format_option_value(name: str, value: Any) -> str:
    """The value as a user would type it back; a name that is no option (a journal's "profile") as it is."""
    option = OPTIONS_BY_NAME.get(name)
    return option.format(value) if option is not None else str(value)


class _LiveOptionsBase:
    def with_value(self, option: str, value: Any) -> LiveOptions:
        return replace(self, **{option: value})

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in OPTION_NAMES}

    def items(self) -> Iterator[tuple[LiveOption, Any]]:
        """Each option with its value in force."""
        return ((option, getattr(self, option.name)) for option in LIVE_OPTIONS)


#: The options in force for an optimizer step: a frozen dataclass with one field per live option (``clip``
#: is a max global grad norm, or None for off), generated from the registry.
LiveOptions = make_dataclass(
    "LiveOptions",
    [(option.name, Any, field(default=option.default)) for option in LIVE_OPTIONS],
    bases=(_LiveOptionsBase,),
    frozen=True,
    kw_only=True,
)
LiveOptions.__module__ = __name__
