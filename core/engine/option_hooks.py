"""Each live option's hook: what makes a value real on this run's parts, at a step boundary.

One hook per option of the registry (core/options.py), registered with ``@enacts``: called with the parsed
value before ``parts.options`` changes, it raises OptionChangeError for what this run cannot do, having changed
nothing. It returns None, a sentence that says what the change did (said with its acknowledgement: "compiled in
21.3 s"), or False where the change is not in force yet (a world size takes a relaunch). A live option added to
the registry without its hook is a TypeError at import, not at its first use.

``apply_change`` is a ``set`` command at a boundary (acknowledged or refused, with the step it took effect at);
``enact_initial`` the options a run starts with, where a refusal is the ConfigError of the flag;
``OptionsInForce`` the options as a part of the training state, which a trial changes and puts back.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch

from torchlab.core.engine.batch_split import check_split, split_batch
from torchlab.core.engine.compiling import compile_model, compile_on_batch, failure_reason, forget_compiled
from torchlab.core.engine.parallel.distributed import check_world_size
from torchlab.core.engine.parallel.sharding import refuse_shared_across_blocks
from torchlab.core.engine.host_copy import check_rollback_fits
from torchlab.core.engine.optimization import group_names
from torchlab.core.engine.outcome import Relaunch
from torchlab.core.engine.parts import TrainingParts
from torchlab.core.engine.precision import Precision
from torchlab.core.errors import ConfigError
from torchlab.core.wire import protocol as p
from torchlab.core.wire.events import CompileStarted
from torchlab.core.options import (
    ACCUM, AMP, CHECKPOINTING, CLIP, COMPILE, DYNAMIC, LIVE_OPTIONS, LR_SCALE, OOM_RESCUE, PARALLEL, PIN_MEMORY, RESUMED, SPIKE_GUARD,
    SPLIT, STEPS, WORKERS, WORLD_SIZE, LiveOption, LiveOptions, OptionChangeError, live_option,
)

#: Each live option's hook, by option name: filled by ``@enacts`` below.
_ENACT_HOOKS: dict[str, Callable[[TrainingParts, Any], bool | str | None]] = {}


def enacts(option: LiveOption) -> Callable[[Callable], Callable]:
    """Register the decorated function as the hook that makes ``option``'s values real."""

    def register(hook: Callable) -> Callable:
        _ENACT_HOOKS[option.name] = hook
        return hook

    return register


def enact(parts: TrainingParts, option: LiveOption, value: Any) -> bool | str | None:
    """Make ``option=value`` real on this run with the option's hook, or raise OptionChangeError without changing
    anything (see the module docstring for what it returns)."""
    return _ENACT_HOOKS[option.name](parts, value)


def for_this_device(parts: TrainingParts, option: LiveOption, value: Any) -> Any:
    """``value``, or for pin_memory's ``auto`` (None) what it is on this run's device: on with CUDA, off
    elsewhere, as the DataLoader always had it before it was a live option."""
    if option is PIN_MEMORY and value is None:
        return parts.device.type == "cuda"
    return value


def apply_change(parts: TrainingParts, command: p.SetCommand, step: int) -> Relaunch | None:
    """A ``set`` command at the boundary before ``step``: enacted and acknowledged, or refused with the reason
    (the run goes on unchanged). A new world size, or another way for the ranks to hold the model, takes new
    processes: it is returned, for the trainer to checkpoint and end with ``relaunch`` after this boundary; the
    supervisor acknowledges it once the new ranks train."""
    try:
        option = live_option(command.option)
        value = for_this_device(parts, option, option.parse(command.value))
        previous = value if command.source == RESUMED else getattr(parts.options, option.name)
        outcome = enact(parts, option, value)
    except OptionChangeError as refusal:
        parts.reporter.emit(p.OptionRefused(
            step=step, option=command.option, value=jsonable(command.value), reason=str(refusal), source=command.source,
        ))
        return None
    parts.options = parts.options.with_value(option.name, value)
    if outcome is False:
        world_size = value if option is WORLD_SIZE else parts.world.size
        return Relaunch(option.name, value, previous, step, command.source, world_size)
    if parts.device.type == "cuda":  # each option segment reports its own peak memory
        torch.cuda.reset_peak_memory_stats(parts.device)
        parts.data.lengths.peak_reset_at = parts.data.lengths.taken
    parts.reporter.emit(p.OptionApplied(
        step=step, option=option.name, value=value, previous=previous, display=option.format(value), source=command.source,
        detail=outcome if isinstance(outcome, str) else "",
    ))
    return None


def enact_initial(parts: TrainingParts, options: LiveOptions) -> None:
    """The options the run starts with, each enacted; one this run cannot take is the ConfigError of its flag."""
    if options.world_size != parts.world.size:
        raise ConfigError(
            f"world_size (--world-size) {options.world_size}: this process trains as one of {parts.world.size}; "
            f"ranks are started by torchlab-tui's supervisor or by torchrun."
        )
    options = options.with_value(PIN_MEMORY.name, for_this_device(parts, PIN_MEMORY, options.pin_memory))
    for option, value in options.items():
        try:
            outcome = enact(parts, option, value)
        except OptionChangeError as refusal:
            raise ConfigError(f"{option.name} ({option.flag}) {option.format(value)}: {refusal}.") from None
        if option is PARALLEL and isinstance(outcome, str):  # fsdp in one process: taken, and nothing sharded yet
            parts.reporter.emit(p.Log(level=p.LogLevel.INFO, text=f"{option.name}={option.format(value)}: {outcome}",
                                     step=parts.progress.step))
    parts.options = options


class OptionsInForce:
    """The live options as a part of the training state: ``state_dict`` is their values by name (what checkpoints
    hold under ``"options"``); ``load_state_dict`` enacts each value that differs from the one in force, then holds
    them all, or raises OptionChangeError having changed nothing where the first it enacts is refused (a trial's arm
    changes an option with it, and its snapshot puts the options back with it)."""

    def __init__(self, parts: TrainingParts) -> None:
        self.parts = parts

    def state_dict(self) -> dict[str, Any]:
        return self.parts.options.as_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        options = LiveOptions(**state)
        for option, value in options.items():
            if value != getattr(self.parts.options, option.name) and enact(self.parts, option, value) is False:
                raise OptionChangeError(f"changing {option.name} here takes new ranks (a relaunch); "
                                    f"{option.key} changes it for good")  # amp on a sharded model: before any change
        self.parts.options = options


def jsonable(value: Any) -> Any:
    """A value a command carried, as an event repeats it."""
    return value if isinstance(value, (str, int, float, bool)) or value is None else repr(value)


# ---------------------------------------------------------------------- each live option's hook

@enacts(AMP)
def _enact_amp(parts: TrainingParts, mode: str) -> bool | str | None:
    """Autocast, changed in place; on a sharded model, FSDP2's mixed precision policy, which is fixed where the ranks
    shard it: a change relaunches them, as ``parallel`` does."""
    precision = parts.precisions.make(mode)
    if parts.model.sharded is not None:
        if mode == parts.precisions.current.name:
            return None
        _can_relaunch(parts, f"amp={mode}", f"--amp {mode}")
        return False
    compiled = None
    if parts.model.compiled is not None and mode != parts.precisions.current.name:
        # Autocast is part of what a compiled graph assumes: compile for the new precision now, not in a step.
        compiled = compile_now(parts, parts.model.compiled, precision, f"with amp={mode}")
    parts.precisions.current = precision
    return compiled


@enacts(CHECKPOINTING)
def _enact_checkpointing(parts: TrainingParts, value: bool | str) -> str | None:
    """On: every block; off: none; names: those blocks alone."""
    checkpointing, names = parts.model.checkpointing, CHECKPOINTING.names(value)
    if value and checkpointing.cannot:
        raise OptionChangeError(checkpointing.cannot)
    if value and not checkpointing.blocks:
        raise OptionChangeError(
            "this model has no checkpoint blocks (no ModuleList/Sequential with several children); "
            "name them in Workload.checkpoint_blocks"
        )
    if names and (unknown := [name for name in names if name not in checkpointing.blocks]):
        blocks = list(checkpointing.blocks)
        named = ", ".join(blocks[:4]) + (f" and {len(blocks) - 4} more" if len(blocks) > 4 else "")
        raise OptionChangeError(f"{', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not among this model's "
                            f"checkpoint blocks ({named})")
    was = checkpointing.wrapped_names()
    checkpointing.enable(names)
    if parts.model.compiled is None or checkpointing.wrapped_names() == was:
        return None
    try:  # the blocks' forward changed under the compiled graph: compile the model with it now, not in a step
        return compile_now(parts, parts.model.compiled, parts.precisions.current,
                           f"with checkpointing={CHECKPOINTING.brief(value)}")
    except OptionChangeError:
        checkpointing.enable(was)
        raise


@enacts(COMPILE)
def _enact_compile(parts: TrainingParts, on: bool) -> str | None:
    """The model the steps run: torch.compile's (of the DDP wrapper with ranks, as PyTorch advises, so that its
    graphs break at DDP's gradient buckets), or the model itself (core/engine/compiling.py)."""
    if not on:
        parts.model.set_compiled(None)
        return None
    if parts.model.compiled is not None:
        return None
    return _compile_afresh(parts, parts.options.dynamic, "")


@enacts(DYNAMIC)
def _enact_dynamic(parts: TrainingParts, mode: str) -> str | None:
    """torch.compile's shapes: the model compiled again under them now, while compile is on; kept for its next compile
    where it is off."""
    if parts.model.compiled is None or mode == parts.model.compiled_dynamic:
        return None
    return _compile_afresh(parts, mode, f"with dynamic={mode}")


def _compile_afresh(parts: TrainingParts, dynamic: str, what: str) -> str:
    """The model compiled under ``dynamic``'s shapes at this boundary, the graphs of other shapes forgotten first (torch
    would run them again: its caches are by code). Refused, the graphs of before compile again as the steps meet them,
    under their own shapes."""
    previous = parts.model.compiled_dynamic
    watch = parts.model.watch_compile()
    if previous not in (None, dynamic):
        forget_compiled()
        watch.forget_recompiles()
    parts.model.compiled_dynamic = watch.dynamic = dynamic
    compiled = compile_model(parts.model.eager, dynamic)
    try:
        said = compile_now(parts, compiled, parts.precisions.current, what)
    except OptionChangeError:
        if parts.model.compiled is not None:
            parts.model.compiled_dynamic = watch.dynamic = previous
        raise
    parts.model.set_compiled(compiled)
    return said


@enacts(WORKERS)
def _enact_workers(parts: TrainingParts, workers: int) -> str | None:
    if workers == parts.data.workers:
        return None
    parts.data.configure(workers=workers)
    return _loader_restarts(parts)


@enacts(PIN_MEMORY)
def _enact_pin_memory(parts: TrainingParts, pinned: bool) -> str | None:
    if pinned and parts.device.type != "cuda":
        raise OptionChangeError(
            f"pinned memory speeds up copies of batches from the host to a CUDA device; this run trains on "
            f"{parts.device.type}, where batches are not copied"
        )
    if pinned == parts.data.pin_memory:
        return None
    parts.data.configure(pin_memory=pinned)
    return _loader_restarts(parts)


@enacts(CLIP)
def _enact_clip(parts: TrainingParts, max_norm: float | None) -> None:
    """Read at each step (``Trainer.train_step``): nothing to change here."""


@enacts(ACCUM)
def _enact_accum(parts: TrainingParts, micro_steps: int) -> None:
    """Read at each step (``Trainer.train_step``): nothing to change here."""


@enacts(SPLIT)
def _enact_split(parts: TrainingParts, pieces: int) -> None:
    """Read at each step (``Trainer.train_step``); refused here where the run's batches cannot be cut that fine,
    judged by the last batch (before the first step, the next one: fetched now, it is the one the step takes, and
    no checkpoint lies between)."""
    if pieces > 1:
        check_split(_a_batch(parts), pieces)


def _a_batch(parts: TrainingParts) -> Any:
    """A batch of this run to judge a change by: the last step's, or before the first step the next one (fetched now,
    it is the one the step takes, and no checkpoint lies between)."""
    data = parts.data
    return data.last_batch if data.last_batch is not None else data.peek_batch()


@enacts(OOM_RESCUE)
def _enact_oom_rescue(parts: TrainingParts, on: bool) -> None:
    """Read when a step runs out of memory (``Trainer.train_step``): nothing to change here."""


@enacts(SPIKE_GUARD)
def _enact_spike_guard(parts: TrainingParts, mode: str) -> None:
    """Read by the spike guard each step (core/engine/guards/spike_guard.py); rollback's host copies must fit."""
    if mode == "rollback" and parts.options.spike_guard != "rollback":
        check_rollback_fits(parts)


@enacts(LR_SCALE)
def _enact_lr_scale(parts: TrainingParts, scale: float) -> None:
    parts.optimization.scale_lr(scale)


@enacts(STEPS)
def _enact_steps(parts: TrainingParts, total: int) -> str | None:
    """Train to step ``total``: the loop, the final evaluation and checkpoint follow ``parts.config.steps``; the
    schedule re-plans from here as a resume with ``--steps`` does (core/engine/schedule.py). A workload's own
    scheduler, built again for the new total, may set another LR here: that is said, not left to be found in
    the chart."""
    config, step, optimization = parts.config, parts.progress.step, parts.optimization
    if total == config.steps:
        return None
    if total < step:
        raise OptionChangeError(f"the run is at step {step} already: train to step {step} or later")
    extensions = config.schedule_extensions
    if not extensions or extensions[-1][0] != step:  # a second change at one boundary keeps the first's
        extensions = (*extensions, (step, config.steps))
    try:
        replanned = dataclasses.replace(config, steps=total, schedule_extensions=extensions,
                                        warmup_steps=config.resolved_warmup_steps)  # the warm-up stays where it is
    except ConfigError as error:
        raise OptionChangeError(str(error).rstrip(".")) from None
    before = optimization.lrs.scheduled[0] * optimization.lr_scale
    optimization.replan(replanned, parts.workload, step)
    parts.config = replanned
    after = optimization.lrs.scheduled[0] * optimization.lr_scale
    if parts.workload.scheduler is None or math.isclose(before, after, rel_tol=1e-3):
        return None
    groups = group_names(optimization.optimizer)
    group = f" (group {groups[0]})" if len(groups) > 1 else ""
    return f"the workload's scheduler, built for {total:,} steps, moves the LR{group} {before:.1e} → {after:.1e}"


@enacts(WORLD_SIZE)
def _enact_world_size(parts: TrainingParts, size: int) -> bool:
    world = parts.world
    if size == world.size:
        return True
    check_world_size(size, device=parts.device, batch_size=parts.batch_size)
    if parts.options.split > 1:  # else the new ranks would refuse the split at their start, and the run end there
        share = split_batch(_a_batch(parts), size)[0][0]  # one rank's part of the batch
        try:
            check_split(share, parts.options.split)
        except OptionChangeError as refusal:
            raise OptionChangeError(f"{size} ranks would each take {parts.batch_size // size} samples a batch, and "
                                f"{refusal}: lower split first") from None
    _can_relaunch(parts, f"{size} ranks", f"--nproc-per-node {size}")
    return False


@enacts(PARALLEL)
def _enact_parallel(parts: TrainingParts, mode: str) -> bool | str | None:
    """At the start, held for ``wrap_for_ranks``; later, a relaunch, as a new world size is. One process (world
    size 1, not under torchrun) holds the whole model either way: the value waits for a larger world size."""
    world, model = parts.world, parts.model
    if world.ranks is None:
        if mode == "fsdp":
            return "one process holds the whole model: nothing is sharded until the world size is 2 or more"
        return None
    held_as = "fsdp" if model.sharded is not None else "ddp" if model.ddp is not None else None
    if held_as is None or held_as == mode:  # the ranks start (wrap_for_ranks reads it), or nothing changes
        return None
    if mode == "fsdp":
        try:
            refuse_shared_across_blocks(list(model.checkpointing.blocks.values()), model.model)
        except ConfigError as error:
            raise OptionChangeError(str(error).removeprefix("parallel (--parallel) fsdp: ")) from None
    _can_relaunch(parts, f"parallel={mode}", f"--parallel {mode}")
    return False


def _can_relaunch(parts: TrainingParts, wanted: str, restart_with: str) -> None:
    """OptionChangeError where the ranks cannot be relaunched for ``wanted`` (a change that takes new ranks: a world
    size, ``parallel``, ``amp`` under FSDP2), saying what to start the run again with (``restart_with``)."""
    world = parts.world
    if world.ranks is not None and not world.ranks.supervised:
        raise OptionChangeError(
            f"the ranks were started by torchrun, which fixes their number and cannot relaunch them; to train with "
            f"{wanted}, stop the run and start it again with {restart_with} and --resume"
        )
    if not world.can_relaunch:
        raise OptionChangeError("this trainer has no supervisor to relaunch its ranks (or no checkpoint directory to "
                            "relaunch from)")


def _loader_restarts(parts: TrainingParts) -> str:
    position = parts.data.reopens_at()
    return f"the data loader starts again at sample {position.samples:,} of epoch {position.epoch}"


def compile_now(parts: TrainingParts, compiled: torch.nn.Module, precision: Precision, what: str) -> str:
    """Compile ``compiled``'s forward and backward at this boundary on a batch (the last step's, or the next one,
    left for the step) cut as the step cuts it (its first piece under ``split``: the whole batch would need the
    memory the split is there to save), changing nothing else (core/engine/compiling.py); say how long it took, or
    raise OptionChangeError with torch.compile's reason."""
    batch = split_batch(_a_batch(parts), parts.options.split)[0][0]
    parts.reporter.emit(CompileStarted(step=parts.progress.step + 1, detail=what))  # seconds to minutes: say why training waits

    def forward_and_backward() -> None:
        with precision.autocast():
            loss = parts.loss.alone(compiled, batch)
        loss.backward()

    watch = parts.model.watch_compile()
    try:
        seconds = compile_on_batch(parts.model.model, forward_and_backward)
    except Exception as error:  # whatever stops the compiled model from training: the change is refused
        if parts.model.compiled is None:  # compile stays off: nothing more to watch
            watch.detach()
        raise OptionChangeError(f"torch.compile could not compile this model{' ' + what if what else ''}: "
                            f"{failure_reason(error)}; it trains on as it was") from None
    watch.compile_s += seconds
    parts.reporter.emit(watch.report(parts.progress.step + 1))
    return f"compiled{' ' + what if what else ''} in {seconds:.1f} s, outside the step times"


_WITHOUT_HOOK = [option.name for option in LIVE_OPTIONS if option.name not in _ENACT_HOOKS]
if _WITHOUT_HOOK:  # a live option added to the registry without its hook: say so at import, not at its first use
    raise TypeError(f"live option(s) without an enact hook (core/engine/option_hooks.py, @enacts): {', '.join(_WITHOUT_HOOK)}")
