"""The one list of what a user combines: each factor, its values, and what each value means on a command line.

A new live option joins the matrix by itself: ``live_change``'s values are ``LIVE_OPTIONS`` (core/options.py),
each changed at step ``CHANGE_AT`` to a value derived from the option's own kind (``changed_value``). A new run event
joins by one entry in ``RUN_EVENTS`` (and its steps in cell.py); a new factor by one ``Factor`` in ``FACTORS``.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchlab.core.options import LIVE_OPTIONS, OPTIONS_BY_NAME, Choice, LiveOption, Number, Switch

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = Path(__file__).resolve().parent / "workloads"

#: Optimizer steps a cell trains (before any resume); the scripted change lands at CHANGE_AT, a trial starts there.
STEPS = 6
CHANGE_AT = 3
#: A cell killed or stopped mid-run trains towards this many steps (cell.py ends it after a few), and its resume, given
#: no flag, continues to them: long enough for the kill to land mid-run, short enough to train to the end.
INTERRUPTED_RUN_STEPS = 40
#: The run events that end the first process mid-run (the resume after them is ``--resume RUN`` alone).
INTERRUPTING_EVENTS = ("kill9_resume", "stop_resume", "rank_signal_resume", "app_error_restart")


@dataclass(frozen=True)
class Factor:
    """One dimension of the matrix. ``slow``: values kept out of ``--fast`` (minutes on a CPU)."""

    name: str
    values: tuple[str, ...]
    slow: frozenset[str] = field(default_factory=frozenset)


def _lacks(*modules: str) -> str | None:
    missing = [module for module in modules if importlib.util.find_spec(module) is None]
    return f"needs {', '.join(missing)} (not installed)" if missing else None


#: Each model kind: the workload argument of the CLI, and the modules it needs (skipped with the reason when absent).
MODELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "mlp": ("mlp", ()),
    "convnet": ("convnet", ()),  # BatchNorm
    "tiny_gpt_tied": (f"{WORKLOADS / 'tied_gpt.py'}:workload", ()),
    "buffered": (f"{WORKLOADS / 'buffered.py'}:workload", ()),  # a float buffer, a custom autograd.Function
    "shared_blocks": (f"{WORKLOADS / 'shared_blocks.py'}:workload", ()),  # a parameter two blocks share
    "own_batch": (f"{WORKLOADS / 'own_batch.py'}:workload", ()),  # batches of the user's own dataclass
    "lightning": (f"{ROOT / 'tests' / 'workloads' / 'lightning_module.py'}:module", ("lightning",)),
    "hf_trainer": (f"{ROOT / 'tests' / 'workloads' / 'hf_trainer.py'}:workload", ("transformers", "accelerate")),
}


def model_skipped(model: str) -> str | None:
    """Why a model kind cannot run here, or None."""
    return _lacks(*MODELS[model][1])


#: The device a cell's model meets: roomy, or one that holds half the run's first forward (``out_of_memory.py``: a
#: forward in training with more samples raises torch.OutOfMemoryError, as CUDA's allocator does) — the OOM rescue's.
DEVICES = ("roomy", "half_batch")
OOM_WORKLOAD = WORKLOADS / "out_of_memory.py"


def workload_of(cell: dict[str, str]) -> str:
    """The workload argument of a cell: its model kind, on the device it names."""
    if cell["device"] == "half_batch":
        return f"{OOM_WORKLOAD}:{cell['model']}"
    return MODELS[cell["model"]][0]


#: Start flags of each value of the factors that are plain flags.
PARALLEL = {"one": [], "ddp2": ["--world-size", "2", "--parallel", "ddp"],
            "fsdp2": ["--world-size", "2", "--parallel", "fsdp"]}
BATCHING = {"plain": [], "accum2": ["--accum", "2"], "split2": ["--split", "2"]}

#: The run events that happen in the app, through Pilot (app_cell.py): the cell's change is scripted at the first step
#: boundary, where the app pauses the run to detach or be viewed; on the error screen it is set there instead.
APP_EVENTS = ("app_detach_attach", "app_view", "app_error_restart", "app_what_fits")
#: What happens to the run besides training: each is a sequence of steps in cell.py, the app's in app_cell.py.
RUN_EVENTS = ("none", "trial", "resume_alone", "resume_longer", "resume_shorter", "kill9_resume", "stop_resume",
              "rank_signal_resume", "compare", *APP_EVENTS)
#: Where the figures go: nowhere else, ``export`` (CSV and TensorBoard) afterwards, or ``--tensorboard`` live.
FIGURES = ("none", "export", "live_tensorboard")

FACTORS: tuple[Factor, ...] = (
    Factor("model", tuple(MODELS)),
    Factor("amp", ("off", "bf16", "fp16")),
    Factor("parallel", tuple(PARALLEL)),
    Factor("checkpointing", ("off", "on")),
    Factor("batching", tuple(BATCHING)),
    Factor("compile", ("off", "on"), slow=frozenset({"on"})),
    Factor("spike_guard", OPTIONS_BY_NAME["spike_guard"].choices),
    Factor("device", DEVICES),
    Factor("live_change", ("none", *(option.name for option in LIVE_OPTIONS)), slow=frozenset({"compile"})),
    Factor("run_event", RUN_EVENTS),
    Factor("figures", FIGURES),
)
FACTOR_NAMES = tuple(factor.name for factor in FACTORS)


def changed_value(option: LiveOption, start: dict[str, Any]) -> Any:
    """A value of ``option`` other than the one a cell starts with, chosen from the option's own kind: the next
    choice (fp16 only where nothing else is left: it needs CUDA), a switch flipped, a whole number one down where it
    can go (world size 2 to 1), else one up; a factor halved; an off number on (clip 1.0); the run's end two steps
    further (``run_length``'s); on the small device a split doubled again (``start_options`` counts the rescue's
    rung: a split back up the ladder would run out of memory again, and the run stops by design)."""
    current = start.get(option.name, option.default)
    if option.name == "steps":
        return current + 2
    if isinstance(option, Choice):
        others = [value for value in option.choices if value != current and value != "fp16"]
        return (others or [value for value in option.choices if value != current])[0]
    if option.name == "split" and start.get("device") == "half_batch":
        return current * 2  # further down the rescue's ladder: back up it, the run runs out of memory again and stops
    if isinstance(option, Switch):
        return not bool(current)
    if isinstance(option, Number):
        if current is None:
            return 1.0
        if option.bounds.whole:
            return current - 1 if current > option.bounds.minimum else current + 1
        return current * 0.5
    raise TypeError(f"the matrix has no rule for changing a {type(option).__name__} option ({option.name})")


def change_step(cell: dict[str, str]) -> int:
    """The step whose boundary the cell's scripted change lands at."""
    return 1 if cell["run_event"] in APP_EVENTS else CHANGE_AT


def changed_option(cell: dict[str, str]) -> tuple[str, str] | None:
    """The option the cell changes and its new value as typed, or None."""
    if cell["live_change"] == "none":
        return None
    option = OPTIONS_BY_NAME[cell["live_change"]]
    return option.name, option.format(changed_value(option, start_options(cell)))


def run_length(cell: dict[str, str]) -> int:
    """The steps a cell's first process is started with (``--steps``)."""
    return INTERRUPTED_RUN_STEPS if cell["run_event"] in INTERRUPTING_EVENTS else STEPS


def start_options(cell: dict[str, str]) -> dict[str, Any]:
    """The live options a cell starts with, by option name (what ``changed_value`` moves away from)."""
    world_size, parallel = (1, "ddp") if cell["parallel"] == "one" else (2, cell["parallel"][:-1])
    split = 2 if cell["batching"] == "split2" else 1
    if cell["device"] == "half_batch":
        split *= 2  # the rescue's first rung, in force from the first step
    return {"steps": run_length(cell), "device": cell["device"], "amp": cell["amp"], "checkpointing": cell["checkpointing"] == "on", "compile": cell["compile"] == "on",
            "accum": 2 if cell["batching"] == "accum2" else 1, "split": split,
            "spike_guard": cell["spike_guard"], "world_size": world_size, "parallel": parallel}


def start_flags(cell: dict[str, str]) -> list[str]:
    """The command line's training flags for a cell (the workload first)."""
    flags = [workload_of(cell), "--amp", cell["amp"], "--spike-guard", cell["spike_guard"]]
    flags += ["--checkpointing"] if cell["checkpointing"] == "on" else []
    flags += ["--compile"] if cell["compile"] == "on" else []
    flags += PARALLEL[cell["parallel"]] + BATCHING[cell["batching"]]
    change = changed_option(cell)
    if change is not None and cell["run_event"] != "app_error_restart":  # that one is set on the error screen
        flags += ["--at", f"{change_step(cell)}:{change[0]}={change[1]}"]
    return flags
