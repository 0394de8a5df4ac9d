"""What a checkpoint holds: ``TrainingState``, one typed field per entry of the file, and the checks that a
checkpoint the trainer resumes from holds each entry as the trainer's save writes it.

The trainer's parts give their ``state_dict`` to a ``TrainingState`` (core/engine/checkpointer.py gathers them) and
take it back from one; this module is the one place that reads a checkpoint's entries by name: the trainer,
the supervisor (``saved_world_size``) and the resume (core/launch/training_plan.py) read the record's fields.

A checkpoint is loaded with ``weights_only=True``, so it runs no code; but what loads may still be crafted (a
``step`` of ``"abc"``, a list where the optimizer's state belongs, an RNG state ``torch.set_rng_state`` rejects,
a value nested thousands deep). ``TrainingState.read`` (with ``check_training_state``) names the first such entry
in one ConfigError, before any of it is used; ``check_model_fits`` compares a checkpoint's weights with the model
a workload built. core/engine/state/checkpoint.py loads and writes checkpoint files; this module only says what one holds.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from torchlab.core.engine.adapters.loading import spec_as_shown
from torchlab.core.errors import ConfigError, shown
from torchlab.core.options import OPTION_NAMES, OptionChangeError, parse_option_value
from torchlab.core.wire.strict_json import MAX_INT, nests_deeper_than  # a count torchlab writes fits in 64 bits

#: How deep a value in a checkpoint may nest: torchlab's go 4 levels deep (``optimizer.param_groups[0].params``).
#: A deeper one was not written by it, and would take a recursive reader past Python's limit.
MAX_NESTING = 16
_GRAD_SCALER_ENTRIES = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")
#: Numbers of a parameter group that the optimizers read as numbers (a group may hold others, of other kinds).
_GROUP_NUMBERS = ("lr", "initial_lr", "weight_decay", "momentum", "dampening", "eps", "alpha", "lr_decay")
_MISSING = object()


@dataclass
class TrainingState:
    """A checkpoint's contents as the trainer writes and reads them: one field per entry of the file, under the
    entry's name (the file's format is unchanged: ``contents()`` is what ``torch.save`` writes).

    ``data`` is the data position (``epoch``, ``samples``), ``options`` the live options by name, ``config`` the
    run's configuration as TOML; ``scripted_through`` the last step whose ``--at``, ``--trial`` and
    ``--profile-at`` entries were queued; ``elapsed_s`` the run's training time; ``rng_by_rank`` each rank's
    generators, where the run had ranks (rank 0's are ``rng``); ``buffers_by_rank`` each rank's buffers, where the
    ranks sharded the model (rank 0's are ``model``'s)."""

    step: int
    model: dict[str, Any]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    grad_scaler: dict[str, Any] | None
    rng: dict[str, Any]
    data: dict[str, int]
    options: dict[str, Any]
    config: str
    scripted_through: int
    elapsed_s: float
    rng_by_rank: list[dict[str, Any]] | None = None
    spike_guard: dict[str, Any] | None = None  # core/engine/guards/spike_guard.py's state; not in checkpoints before it
    #: each rank's buffers, where the ranks shard the model: FSDP2 keeps each rank's own (core/engine/checkpointer.py)
    buffers_by_rank: list[dict[str, Any]] | None = None

    @classmethod
    def read(cls, contents: dict[str, Any], path: Path) -> TrainingState:
        """The record of ``contents`` (loaded from ``path``), each entry checked first (``check_training_state``)."""
        check_training_state(contents, path)
        return cls(**{field.name: contents[field.name] for field in fields(cls) if field.name in contents})

    def contents(self) -> dict[str, Any]:
        """The entries the file holds, in the order the trainer has always written them; ``rng_by_rank`` only
        with ranks. Not ``dataclasses.asdict``, which would copy every tensor's dict."""
        contents = {field.name: getattr(self, field.name) for field in fields(self)}
        for optional in _OPTIONAL_PARTS:
            if contents[optional] is None:
                del contents[optional]
        return contents


def saved_world_size(contents: Any) -> int | None:
    """The world size a checkpoint's live options hold (1 where they hold none: from before it was live), or None
    where they are not what the trainer writes (the trainer says why when it loads the checkpoint)."""
    options = contents.get("options", {}) if isinstance(contents, Mapping) else None
    try:
        _options(options, "options", "the live options by name")
    except _NotWritten:
        return None
    return options.get("world_size", 1)


class _NotWritten(Exception):
    """An entry of a loaded checkpoint that torchlab's save does not write so: where it is, what it is, and what
    torchlab writes there."""

    def __init__(self, where: str, value: Any, expected: str, what: str | None = None) -> None:
        super().__init__(where)
        self.where, self.expected = where, expected
        self.what = what or ("missing" if value is _MISSING else _described(value))


def check_training_state(state: dict[str, Any], path: Path) -> None:
    """A ConfigError naming the first entry of ``state`` (loaded from ``path``) that the trainer's save does not
    write as it is: one paragraph, before any of it is used. Entries torchlab does not read are left alone."""
    try:
        _check_nesting(state)
        for name, (check, expected) in _PARTS.items():
            value = state.get(name, _MISSING)
            if value is _MISSING:
                raise _NotWritten(name, value, expected)
            check(value, name, expected)
        for name, (check, expected) in _OPTIONAL_PARTS.items():
            if name in state:
                check(state[name], name, expected)
    except _NotWritten as wrong:
        raise ConfigError(
            f"--resume {path}: not a checkpoint torchlab wrote: its {wrong.where} is {wrong.what}, where torchlab "
            f"writes {wrong.expected}. It is not trained from: resume from a checkpoint of a run of yours."
        ) from None


def check_model_fits(saved: Mapping[str, Any], model_state: Mapping[str, Any], trained_with: str) -> None:
    """A ConfigError naming the first parameters in which ``saved`` (a checkpoint's model) and ``model_state`` (the
    workload's) differ, by name or shape: the workload given for a checkpoint must be the model it holds."""
    differences = []
    for name, tensor in model_state.items():
        if name not in saved:
            differences.append(f"the model's {name} {_shape(tensor)} is not in the checkpoint")
        elif _shape(saved[name]) != _shape(tensor):
            differences.append(f"{name} is {_shape(saved[name])} in the checkpoint and {_shape(tensor)} in the model")
    differences += [f"the checkpoint's {_key(name)} {_shape(tensor)} is not in the model"
                    for name, tensor in saved.items() if name not in model_state]
    if not differences:
        return
    more = f"; and {len(differences) - 3} more" if len(differences) > 3 else ""
    raise ConfigError(
        f"--resume: the checkpoint does not fit this workload's model ({'; '.join(differences[:3])}{more}); the "
        f"checkpoint was trained with {spec_as_shown(trained_with)}: give that workload, or a checkpoint of this one."
    )


def _shape(value: Any) -> str:
    return "[" + ", ".join(map(str, value.shape)) + "]" if isinstance(value, torch.Tensor) else "(not a tensor)"


def _described(value: Any) -> str:
    """A value of a checkpoint as a message shows it: a tensor by its kind and shape, a container by its kind."""
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {shown(list(value.shape))}"
    if isinstance(value, Mapping):
        return "a dict"
    if isinstance(value, (list, tuple, set, frozenset)):
        return f"a {type(value).__name__}"
    return shown(value)


def _key(name: Any) -> str:
    """An entry's name in a message: as it is if it is a short printable name, else as ``shown`` cuts it."""
    return name if isinstance(name, str) and name.isprintable() and 0 < len(name) <= 80 else shown(name)


def _check_nesting(state: dict[str, Any]) -> None:
    for name, part in state.items():
        entries = part.items() if isinstance(part, Mapping) else [(None, part)]
        for key, value in entries:
            levels_above = 1 if key is None else 2  # the state's dict, and the part's
            if nests_deeper_than(value, MAX_NESTING - levels_above):
                where = _key(name) if key is None else f"{_key(name)}.{_key(key)}"
                raise _NotWritten(where, value, f"values nested at most {MAX_NESTING} levels deep",
                                  what=f"nested more than {MAX_NESTING} levels deep")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_figure(value: Any) -> bool:
    """A number as an optimizer holds it: a finite int or float, or a one-element tensor (``lr=torch.tensor(...)``)."""
    return _is_number(value) or (isinstance(value, torch.Tensor) and value.numel() == 1)


def _mapping(value: Any, where: str, expected: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise _NotWritten(where, value, expected)
    return value


def _count(value: Any, where: str, expected: str = "a whole number from 0") -> None:
    if not _is_int(value) or not 0 <= value < MAX_INT:
        raise _NotWritten(where, value, expected)


def _seconds(value: Any, where: str, expected: str) -> None:
    if not _is_number(value) or value < 0:
        raise _NotWritten(where, value, expected)


def _text(value: Any, where: str, expected: str) -> None:
    if not isinstance(value, str):
        raise _NotWritten(where, value, expected)


def _model(value: Any, where: str, expected: str) -> None:
    for name, tensor in _mapping(value, where, expected).items():
        if not isinstance(name, str):
            raise _NotWritten(f"{where} entry", name, "a parameter's name")
        if not isinstance(tensor, torch.Tensor) and not name.endswith("_extra_state"):
            raise _NotWritten(f"{where}.{_key(name)}", tensor, "a tensor")


def _optimizer(value: Any, where: str, expected: str) -> None:
    value = _mapping(value, where, expected)
    for index, state in _mapping(value.get("state", _MISSING), f"{where}.state", "each parameter's state by its index").items():
        if not _is_int(index):
            raise _NotWritten(f"{where}.state entry", index, "a parameter's index")
        _mapping(state, f"{where}.state[{index}]", "a parameter's state")
    groups = value.get("param_groups", _MISSING)
    if not isinstance(groups, list):
        raise _NotWritten(f"{where}.param_groups", groups, "a list of parameter groups")
    for number, group in enumerate(groups):
        here = f"{where}.param_groups[{number}]"
        group = _mapping(group, here, "a parameter group")
        params = group.get("params", _MISSING)
        if not isinstance(params, list) or not all(_is_int(index) for index in params):
            raise _NotWritten(f"{here}.params", params, "a list of parameter indices")
        for name in _GROUP_NUMBERS:
            if name in group and not _is_figure(group[name]):
                raise _NotWritten(f"{here}.{name}", group[name], "a number")
        betas = group.get("betas", (0.9, 0.999))
        if not isinstance(betas, (tuple, list)) or len(betas) != 2 or not all(_is_figure(beta) for beta in betas):
            raise _NotWritten(f"{here}.betas", betas, "two numbers")


def _scheduler(value: Any, where: str, expected: str) -> None:
    """An LR scheduler's ``state_dict``: its ``__dict__`` less the optimizer, which ``load_state_dict`` puts back
    into its ``__dict__`` as it is; the entries every scheduler reads as numbers are numbers."""
    value = _mapping(value, where, expected)
    if "optimizer" in value:
        raise _NotWritten(f"{where}.optimizer", value["optimizer"], "nothing (a scheduler's state leaves its optimizer out)")
    for name in ("last_epoch", "_step_count"):
        if name in value and not (_is_int(value[name]) and -1 <= value[name] < MAX_INT):
            raise _NotWritten(f"{where}.{name}", value[name], "a whole number from -1")
    for name in ("base_lrs", "_last_lr"):
        if name in value and not (isinstance(value[name], list) and all(_is_figure(lr) for lr in value[name])):
            raise _NotWritten(f"{where}.{name}", value[name], "a list of numbers")
    lambdas = value.get("lr_lambdas", [])
    if not isinstance(lambdas, list) or not all(item is None or isinstance(item, Mapping) for item in lambdas):
        raise _NotWritten(f"{where}.lr_lambdas", lambdas, "a list of nothing or dicts")


def _grad_scaler(value: Any, where: str, expected: str) -> None:
    if value is None:
        return
    value = _mapping(value, where, expected)
    for name in _GRAD_SCALER_ENTRIES:
        if not _is_number(value.get(name, _MISSING)):
            raise _NotWritten(f"{where}.{name}", value.get(name, _MISSING), "a number")


def _rng_states(value: Any, where: str, expected: str) -> None:
    if not isinstance(value, list):
        raise _NotWritten(where, value, expected)
    for rank, state in enumerate(value):
        _rng(state, f"{where}[{rank}]", "a random number generator state")


def _buffers_by_rank(value: Any, where: str, expected: str) -> None:
    if not isinstance(value, list):
        raise _NotWritten(where, value, expected)
    for rank, buffers in enumerate(value):
        _model(buffers, f"{where}[{rank}]", "a rank's buffers by name")


def _rng(value: Any, where: str, expected: str) -> None:
    """What ``capture_rng_state`` saves, each state tried on a generator of its own (the process's are untouched)."""
    value = _mapping(value, where, expected)
    python = value.get("python", _MISSING)
    try:
        random.Random().setstate(as_tuples(python))
    except (TypeError, ValueError, OverflowError):
        raise _NotWritten(f"{where}.python", python, "the state of Python's random module") from None
    _byte_state(value.get("torch", _MISSING), f"{where}.torch", "torch's CPU generator state")
    try:
        torch.Generator().set_state(value["torch"].cpu())
    except RuntimeError:
        raise _NotWritten(f"{where}.torch", value["torch"], "torch's CPU generator state") from None
    cuda = value.get("cuda", [])
    if not isinstance(cuda, (list, tuple)):
        raise _NotWritten(f"{where}.cuda", cuda, "a list of each CUDA generator's state")
    for number, state in enumerate(cuda):
        _byte_state(state, f"{where}.cuda[{number}]", "a CUDA generator's state")
    if "numpy" in value:
        _numpy_rng(value["numpy"], f"{where}.numpy")


def _byte_state(value: Any, where: str, expected: str) -> None:
    if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8 or value.dim() != 1:
        raise _NotWritten(where, value, f"{expected} (a 1-dimensional uint8 tensor)")


def _numpy_rng(value: Any, where: str) -> None:
    import numpy

    expected = "numpy's random state (kind, keys, position, has_gauss, cached_gaussian)"
    if not isinstance(value, (tuple, list)) or len(value) != 5 or not isinstance(value[1], torch.Tensor):
        raise _NotWritten(where, value, expected)
    kind, keys, position, has_gauss, cached = value
    try:
        numpy.random.RandomState().set_state((kind, keys.cpu().numpy().astype("uint32"), position, has_gauss, cached))
    except (TypeError, ValueError, OverflowError):
        raise _NotWritten(where, value, expected) from None


def _data(value: Any, where: str, expected: str) -> None:
    value = _mapping(value, where, expected)
    _count(value.get("epoch", _MISSING), f"{where}.epoch")
    _count(value.get("samples", _MISSING), f"{where}.samples")
    if "longest_batch" in value:  # the longest batch taken before it (measure/longest_batch.py)
        longest = _mapping(value["longest_batch"], f"{where}.longest_batch", "the longest batch's elements and shapes")
        _count(longest.get("elements", _MISSING), f"{where}.longest_batch.elements")
        shapes = longest.get("shapes", _MISSING)
        if not isinstance(shapes, list) or not all(
                isinstance(shape, list) and all(isinstance(size, int) and size >= 0 for size in shape) for shape in shapes):
            raise _NotWritten(f"{where}.longest_batch.shapes", shapes, "a list of shapes (lists of whole numbers)")


def _spike_guard(value: Any, where: str, expected: str) -> None:
    value = _mapping(value, where, expected)
    for measure in ("loss", "grad_norm"):
        values = value.get(measure, _MISSING)
        if not isinstance(values, list) or not all(_is_number(item) for item in values):
            raise _NotWritten(f"{where}.{measure}", values, "a list of finite numbers")
    in_a_row = value.get("in_a_row", _MISSING)
    if not isinstance(in_a_row, list) or not all(
            isinstance(pair, list) and len(pair) == 2 and _is_float(pair[0]) and (pair[1] is None or _is_float(pair[1]))
            for pair in in_a_row):
        raise _NotWritten(f"{where}.in_a_row", in_a_row, "a list of [loss, grad norm or None] pairs")
    loss_scale = value.get("loss_scale")  # None: written before it was kept, or not yet known
    if loss_scale is not None and not _is_number(loss_scale):
        raise _NotWritten(f"{where}.loss_scale", loss_scale, "None, or a finite number")
    last_rollback = value.get("last_rollback", _MISSING)
    if last_rollback is not None:
        _count(last_rollback, f"{where}.last_rollback", "a step, or None")
    cooldown = value.get("cooldown", _MISSING)
    if cooldown is not None:
        cooldown = _mapping(cooldown, f"{where}.cooldown", "None, or the cool-down's until, scale and restore")
        if set(cooldown) != {"until", "scale", "restore"}:
            raise _NotWritten(f"{where}.cooldown", cooldown, "None, or the cool-down's until, scale and restore")
        _count(cooldown["until"], f"{where}.cooldown.until", "a step")
        _seconds(cooldown["scale"], f"{where}.cooldown.scale", "a positive LR scale")
        _seconds(cooldown["restore"], f"{where}.cooldown.restore", "a positive LR scale")


def _is_float(value: Any) -> bool:
    """A loss or norm as the spike guard keeps one: any float (a spike's may be NaN or infinite) or int."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _options(value: Any, where: str, expected: str) -> None:
    for name, option_value in _mapping(value, where, expected).items():
        here = f"{where}.{_key(name)}"
        if not isinstance(name, str) or name not in OPTION_NAMES:
            raise _NotWritten(here, option_value, f"only the live options ({', '.join(OPTION_NAMES)})")
        try:
            parsed = parse_option_value(name, option_value)
        except OptionChangeError as refusal:
            raise _NotWritten(here, option_value, f"a value the option takes ({refusal})") from None
        if type(parsed) is not type(option_value) or parsed != option_value:
            raise _NotWritten(here, option_value, f"the option's value as it holds it ({shown(parsed)})")


#: Each entry the trainer's save writes (``TrainingState``'s fields, ``rng_by_rank`` aside): its check, and what it is.
_PARTS: dict[str, tuple[Callable[[Any, str, str], None], str]] = {
    "step": (_count, "a whole number from 0"),
    "model": (_model, "the model's tensors by parameter name"),
    "optimizer": (_optimizer, "the optimizer's state_dict (its state and param_groups)"),
    "scheduler": (_scheduler, "the LR scheduler's state_dict"),
    "grad_scaler": (_grad_scaler, "the GradScaler's state_dict, or nothing"),
    "rng": (_rng, "the random number generators' states (python, torch, numpy, cuda)"),
    "data": (_data, "the data position (epoch and samples) and the longest batch taken"),
    "options": (_options, "the live options by name"),
    "config": (_text, "the run's configuration as TOML text"),
    "scripted_through": (_count, "a whole number from 0"),
    "elapsed_s": (_seconds, "a number of seconds from 0"),
}


#: The entries a save writes only where they apply (``rng_by_rank``: with ranks; ``buffers_by_rank``: with a sharded
#: model) or that checkpoints written before them lack (``spike_guard``): checked where present.
_OPTIONAL_PARTS: dict[str, tuple[Callable[[Any, str, str], None], str]] = {
    "rng_by_rank": (_rng_states, "a list of the ranks' random number generator states"),
    "spike_guard": (_spike_guard, "the spike guard's window, spikes in a row, last rollback and cool-down"),
    "buffers_by_rank": (_buffers_by_rank, "a list of the ranks' buffers by name"),
}


def as_tuples(value: Any) -> Any:
    """``random.setstate`` wants tuples; a round trip through a checkpoint may give lists."""
    if isinstance(value, (list, tuple)):
        return tuple(as_tuples(item) for item in value)
    return value
