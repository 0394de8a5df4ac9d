"""OOM rescue (live option ``oom_rescue``, on by default; issue 30): a step that runs out of memory is put back and
retried one rung down a ladder, instead of ending the run.

The step's forward or backward raised an allocation failure (CUDA's ``torch.OutOfMemoryError``, or the CPU
allocator's). Nothing was applied yet: the optimizer steps after every backward. The trainer drops what the failed
attempt held (the gradients, set to None; its autograd graph and activations, with the exception's frames; on CUDA
the allocator's cached blocks), puts torch's random generators back where the step's first forward found them
(``StepGenerators``: the retry draws the dropout masks the step would have drawn at the rung's value from the start),
and retries the same step on the batches it had already taken, one rung down:

1. ``split`` doubled (core/engine/batch_split.py): the same samples and the same gradient per step, half the
   activations alive at once, down to pieces of one sample; in one process, as far down as the first split the
   memory forecast predicts to fit (core/engine/guards/rescue_forecast.py), said in the rung's note;
2. then activation checkpointing of the model's blocks, where it has blocks: those that saved the most activations
   at the last step measured by kind first, a quarter of them, then half, then all (all at once without a
   measurement);
3. then it stops, with one paragraph: what failed, what each rung tried, what to change, and the memory by kind
   (core/engine/instruments.py ``memory_at_failure``).

Each rung is a live option's value and stays in force, as a change typed in the app would: journalled as
``oom_rescued``, shown in the event log and the impact table, undone by the option's key, kept by ``--resume``.
With ranks no rank can retry a step alone (the others wait in its collectives): the rank's error ends the step on
every rank, and their supervisor (core/engine/ranks/supervisor.py) takes the next rung of the same ladder (``rung_after``) and
starts them again from the run's newest checkpoint. Not in a trial's arm, where running out of memory is the arm's
result.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch.utils.checkpoint import CheckpointError

from torchlab.core.engine.activation_checkpointing import saved_by_block
from torchlab.core.engine.batch_split import batch_samples
from torchlab.core.engine.forecast.rung_choice import splits_from
from torchlab.core.engine.guards.rescue_forecast import rung_predicted_to_fit
from torchlab.core.engine.measure.memory import out_of_memory
from torchlab.core.engine.option_hooks import enact
from torchlab.core.engine.parts import TrainingParts
from torchlab.core.errors import TorchlabError
from torchlab.core.wire import protocol as p
from torchlab.core.wire.events import OomRescued
from torchlab.core.options import CHECKPOINTING, SPLIT, LiveOption, LiveOptions, OptionChangeError
from torchlab.core.wire.payloads import MemoryBreakdown
from torchlab.core.units import format_bytes


T = TypeVar("T")


class OutOfMemoryStop(TorchlabError):
    """A step ran out of memory with every rung of the rescue tried (with the rescue off, or in a trial's arm, the
    allocation's own error ends the run)."""


@dataclass(frozen=True)
class StepGenerators:
    """torch's random generators (the CPU one, and the run's GPU's) as a step's first forward found them: a retry
    restores them, so the dropout masks and any other random numbers its forwards and backwards draw are those of
    the step run at the rung's value from the start, not what the failed attempt left. Taken on every step of a run
    with the rescue on: a copy of the CPU generator's 5 KB and the GPU's seed and offset, about a microsecond, no
    device sync. Python's and NumPy's generators are not taken (55 µs a step): they are drawn by a dataset in the
    training process, when a batch is taken, and the retry keeps the batches taken; so is a batch of a later
    micro-batch drawn from torch's, where such a dataset augments with it (a retry draws nothing for it again)."""

    cpu: torch.Tensor
    device: torch.device
    cuda: torch.Tensor | None

    @classmethod
    def capture(cls, device: torch.device) -> StepGenerators:
        return cls(torch.get_rng_state(), device, torch.cuda.get_rng_state(device) if device.type == "cuda" else None)

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)


class StepAttempts:
    """What a step that may run again after a failure (``retries``) keeps across its attempts: the batches it took,
    which a retry trains on again, and torch's generators as its first forward found them (``StepGenerators``)."""

    def __init__(self, retries: bool) -> None:
        self.retries = retries
        self.batches: list = []
        self._generators: StepGenerators | None = None

    def first_forward(self, device: torch.device) -> None:
        """Before the step's first forward: where the step may run again, torch's generators as they are now."""
        if self.retries and self._generators is None:
            self._generators = StepGenerators.capture(device)

    def restore(self) -> None:
        if self._generators is not None:
            self._generators.restore()


def with_rescue(parts: TrainingParts, step: int, attempts: StepAttempts, forward_backward: Callable[[], T],
                memory: Callable[[], str], measured: MemoryBreakdown | None) -> T:
    """``forward_backward()``, run again where it failed and the step ``retries``: out of memory with ``oom_rescue``
    on (one rung down, ``next_rung``), or a checkpointed block that recomputed otherwise with ``checkpointing`` on
    (checkpointing off, ``without_checkpointing``). Between attempts what the failed one held is freed and torch's
    generators are put back; each retry is said as the change it made. ``memory`` and ``measured``: ``next_rung``'s."""
    while True:
        try:
            return forward_backward()
        except Exception as error:
            # torch.utils.checkpoint's check: the recomputation saved other tensors than the forward did
            recomputed_otherwise = isinstance(error, CheckpointError) and bool(parts.options.checkpointing)
            if not attempts.retries or not (recomputed_otherwise or out_of_memory(error) and parts.options.oom_rescue):
                raise
            failure = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        free_failed_step(parts)  # out of the except: the failed attempt's frames, and what they held, are gone
        attempts.restore()
        if recomputed_otherwise:
            parts.reporter.emit(without_checkpointing(parts, step, failure))
        else:
            batch = attempts.batches[0] if attempts.batches else parts.data.peek_batch()
            parts.reporter.emit(next_rung(parts, step, failure, batch, memory, measured))


def free_failed_step(parts: TrainingParts) -> None:
    """What a failed attempt held: its gradients, then whatever its frames kept alive, then CUDA's cached blocks.
    Called once the exception (and its traceback's frames) is gone."""
    parts.optimization.optimizer.zero_grad(set_to_none=True)
    gc.collect()
    if parts.device.type == "cuda":
        torch.cuda.empty_cache()


def without_checkpointing(parts: TrainingParts, step: int, failure: str) -> p.OptionApplied:
    """Checkpointing turned off for ``step``, whose attempt failed because a checkpointed block's recomputation saved
    other tensors than its forward (``failure``: torch's CheckpointError, its first line): the block's forward depends
    on a state it changes, so checkpointing cannot hold its numbers. The step is retried as the OOM rescue retries
    one; turning checkpointing on again is refused with the reason (``ActivationCheckpointing.cannot``), and the
    rescue's checkpointing rung with it."""
    checkpointing, previous = parts.model.checkpointing, parts.options.checkpointing
    enact(parts, CHECKPOINTING, False)
    parts.options = parts.options.with_value(CHECKPOINTING.name, False)
    checkpointing.cannot = (f"checkpointing failed at step {step}: a block's recomputation saved other tensors than "
                            f"its forward ({failure}), so its forward depends on a state it changes (a counter, a "
                            f"cache it fills); it stays off for this model")
    return p.OptionApplied(option=CHECKPOINTING.name, value=False, previous=previous, step=step,
                           source="recompute check", display=CHECKPOINTING.format(False),
                           detail=f"{checkpointing.cannot.removeprefix(f'checkpointing failed at step {step}: ')}; "
                                  f"the step was retried without it")


def rung_after(options: LiveOptions, samples: int | None, blocks: Sequence[str],
               saved: Mapping[str, int] | None) -> tuple[LiveOption, object] | None:
    """The ladder, one rung below ``options``: split doubled while a piece holds more than one of a batch's
    ``samples`` (None: the batches cannot be split), then activation checkpointing of the model's ``blocks``. Where
    a measurement said what each block saves for backward (``saved``, bytes by block), the blocks that save the most
    go first: a quarter of them, then half, then all; without one, all at once. None where no rung is left. The one
    definition of the ladder, in one process (``next_rung``) and with ranks (their supervisor, by rank 0's last
    measurement: core/engine/ranks/rescue.py)."""
    if samples is not None and options.split < samples:
        return SPLIT, min(2 * options.split, samples)
    wrapped = CHECKPOINTING.names(options.checkpointing)
    if not blocks or wrapped is None:  # none to wrap, or all wrapped
        return None
    if saved:
        for share in (4, 2):
            target = -(-len(blocks) // share)  # rounded up
            if len(wrapped) < target < len(blocks):
                rest = sorted((name for name in blocks if name not in wrapped), key=lambda name: -saved.get(name, 0))
                return CHECKPOINTING, ",".join(wrapped + rest[:target - len(wrapped)])
    return CHECKPOINTING, True


def checkpointing_rungs(options: LiveOptions, samples: int | None, blocks: Sequence[str],
                        saved: Mapping[str, int] | None) -> list[bool | str]:
    """The ladder's checkpointing rungs from ``options`` on (its splits done), in order: ``rung_after`` taken again
    and again, to checkpointing of every block."""
    values: list[bool | str] = []
    while (rung := rung_after(options, samples, blocks, saved)) is not None and rung[0] is CHECKPOINTING:
        values.append(rung[1])
        options = options.with_value(CHECKPOINTING.name, rung[1])
    return values


def no_rung_left(step: int, failure: str, options: LiveOptions, samples: int | None) -> str:
    """The paragraph a run stops with when a step ran out of memory with every rung tried."""
    tried = [f"split = {options.split}" + (f" (pieces of one sample: the batch has {samples})" if samples else
                                           " (this run's batches cannot be split)")]
    tried.append("checkpointing = on" if options.checkpointing else "no checkpointing (the model names no blocks)")
    return (f"Step {step} ran out of memory ({failure}) with {' and '.join(tried)}: the OOM rescue has no rung left. "
            f"Lower the batch size (--batch-size) or the model's size, turn on amp=bf16, or train on a device with "
            f"more memory; the last checkpoint holds the run up to the step before.")


def next_rung(parts: TrainingParts, step: int, failure: str, batch, memory: Callable[[], str],
              measured: MemoryBreakdown | None) -> OomRescued:
    """Enact the next rung for ``step``, whose attempt failed with ``failure`` on ``batch`` (its first), and say what
    it changed; OutOfMemoryStop where no rung is left, its paragraph ending with ``memory()``, the memory by kind.
    ``measured``: training's last step measured by kind, which says what each block saves for backward."""
    options, checkpointing = parts.options, parts.model.checkpointing
    samples = _samples(batch)
    blocks = list(checkpointing.blocks)
    saved = blocks_saving(blocks, measured)
    rung = rung_after(options, samples, blocks, saved)
    if rung is not None and rung[0] is SPLIT:
        value, predicted = rung_predicted_to_fit(parts, batch, samples, SPLIT, splits_from(rung[1], samples))
        notes = [note for note in (split_note(batch_norm_layers(parts.model.model)), predicted) if note]
        return _enact(parts, step, failure, SPLIT, value, "; ".join(notes), samples)
    if rung is not None:
        value, predicted = rung_predicted_to_fit(parts, batch, samples, CHECKPOINTING,
                                                 checkpointing_rungs(options, samples, blocks, saved))
        notes = [] if samples is not None else ["this run's batches cannot be split (no first dimension their tensors share)"]
        if isinstance(value, str):
            notes.append(chosen_blocks_note(value, blocks, saved, measured.step))
        notes.append(predicted)
        try:
            return _enact(parts, step, failure, CHECKPOINTING, value, "; ".join(notes), samples)
        except OptionChangeError:
            pass
    raise OutOfMemoryStop(f"{no_rung_left(step, failure, options, samples)} {memory()}")


def blocks_saving(blocks: list[str], measured: MemoryBreakdown | None) -> dict[str, int] | None:
    """What each block saved for backward at the step ``measured`` (None: none was)."""
    if measured is None:
        return None
    return saved_by_block(blocks, ((part.module, part.bytes) for part in measured.by_module))


def chosen_blocks_note(value: str, blocks: list[str], saved: Mapping[str, int], step: int) -> str:
    """Why a checkpointing rung took the blocks ``value`` names: they saved the most at ``step``."""
    chosen = CHECKPOINTING.names(value)
    which = ", ".join(f"{name} {format_bytes(saved[name])}" for name in chosen)
    return f"the {len(chosen)} of {len(blocks)} blocks that saved the most activations at step {step} ({which})"


def measured_memory(measured: MemoryBreakdown) -> str:
    """Memory by kind as a step measured it: the ranks' stop paragraph, whose supervisor holds no tensor."""
    return (f"Memory by kind at step {measured.step} (the last measured, rank 0): parameters "
            f"{format_bytes(measured.parameters_bytes)}, gradients {format_bytes(measured.gradients_bytes)}, optimizer "
            f"state {format_bytes(measured.optimizer_bytes)}, activations saved for backward "
            f"{format_bytes(measured.activations_bytes)}.")


def _samples(batch) -> int | None:
    try:
        return batch_samples(batch)
    except OptionChangeError:
        return None


def batch_norm_layers(model: torch.nn.Module) -> int:
    """The model's BatchNorm layers (1d, 2d, 3d, lazy and synchronised): what a split changes besides memory."""
    return sum(isinstance(module, torch.nn.modules.batchnorm._NormBase) and not isinstance(
        module, torch.nn.modules.instancenorm._InstanceNorm) for module in model.modules())


def split_note(batch_norms: int) -> str:
    """What a split rung says of a model with ``batch_norms`` BatchNorm layers (empty without)."""
    if not batch_norms:
        return ""
    return (f"{batch_norms} BatchNorm layer{'s' if batch_norms != 1 else ''} now see{'s' if batch_norms == 1 else ''} "
            "each piece's statistics, not the batch's")


def _enact(parts: TrainingParts, step: int, failure: str, option: LiveOption, value, note: str,
           samples: int | None) -> OomRescued:
    before = parts.options
    enact(parts, option, value)
    parts.options = before.with_value(option.name, value)
    return rescued(step, failure, option, before, parts.options, note, samples)


def rescued(step: int, failure: str, option: LiveOption, before: LiveOptions, after: LiveOptions, note: str,
            samples: int | None) -> OomRescued:
    """The journal's record of a rung: ``option`` moved ``before`` → ``after``, for batches of ``samples`` (a rank's;
    None: not counted), in one process and with ranks alike."""
    return OomRescued(step=step, option=option.name, value=getattr(after, option.name),
                      previous=getattr(before, option.name), error=failure, note=note,
                      samples_before=_forward_samples(samples, before.split),
                      samples_after=_forward_samples(samples, after.split))


def _forward_samples(samples: int | None, split: int) -> int | None:
    """The most samples one forward takes of a micro-batch of ``samples`` cut in ``split`` pieces (tensor_split's:
    the first pieces one larger)."""
    return None if samples is None else -(-samples // split)
