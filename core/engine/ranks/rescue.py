"""The OOM rescue with ranks, their supervisor's part (core/engine/ranks/supervisor.py): what rank 0 said of the run, and the
rung a rank's allocation failure takes.

No rank can retry a step alone: the others wait in its collectives. So the rank's OutOfMemoryError ends the step on
every rank, and the supervisor takes the next rung of the OOM rescue's one ladder (core/engine/guards/oom_rescue.py
``rung_after``) and starts the ranks again from the run's newest checkpoint, with the options in force at the
failure and the rung; the steps since that checkpoint train again, their rows moved aside as by any resume. For
that it follows rank 0's reports (``observe``): its welcome (the options, the global batch, whether the model has
blocks to checkpoint, its BatchNorm layers), each option applied, each checkpoint written; and its rows' memory by
kind (``observe_row``), by which the checkpointing rung takes the blocks that saved the most first, as in one
process, and the last paragraph says the memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchlab.core.engine.forecast.rung_choice import splits_from
from torchlab.core.engine.guards.oom_rescue import (
    blocks_saving, checkpointing_rungs, chosen_blocks_note, measured_memory, no_rung_left, rescued, rung_after, split_note,
)
from torchlab.core.wire.events import OomRescued, RunStarted
from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.options import OOM_RESCUE, SPLIT, LiveOption, LiveOptions
from torchlab.core.wire.payloads import MemoryBreakdown
from torchlab.core.wire.protocol import CheckpointSaved, Message, OptionApplied


@dataclass(frozen=True)
class Rescue:
    """An OOM rescue with ranks: the options they start again with, the checkpoint they start from (None: the
    start), and the event that says so."""

    options: LiveOptions
    resume: Path | None
    event: OomRescued


class RankRescue:
    """What the OOM rescue with ranks knows of the run, from rank 0's reports, and its decision on a failure."""

    def __init__(self, resume_from: Path | None,
                 rung_to_fit: Callable[[LiveOptions, LiveOption, list[Any], int], tuple[Any, str]] | None = None) -> None:
        """``rung_to_fit(options, option, values, world_size)``: of ``option``'s rungs ``values``, the first predicted to
        fit a rank (the run's forecaster: ``Forecaster.rung_to_fit``), and what was predicted; None: rung by rung."""
        self.rung_to_fit = rung_to_fit
        self._in_force: dict[str, Any] | None = None  # the options in force: the welcome's, then each change
        self._batch_size = 0  # the global batch
        self._blocks: list[str] = []  # the model's checkpoint blocks
        self._batch_norms = 0  # the model's BatchNorm layers: a split's note
        self._memory: MemoryBreakdown | None = None  # rank 0's last step measured by kind
        self._refused_split: int | None = None  # the split the ranks refused at their start: batches of the user's type
        #: the failure of the last rescue, and its rung's value, until the ranks it started report that they train
        self._last: tuple[int, str, int, int, LiveOptions] | None = None
        self._checkpoint: Path | None = resume_from  # the newest checkpoint to start again from
        self._checkpoint_step: int | None = None  # its step: the resumed one's is the welcome's
        self._rescued: set[tuple[int, str, Any]] = set()  # (step, option, value) of each rescue, which must hold

    def observe(self, event: Message) -> None:
        """Follow rank 0's report ``event``."""
        match event:
            case RunStarted():
                self._last = None  # the ranks started again train: a later failure is not their start's
                self._in_force = dict(event.options)
                self._batch_size = event.batch_size
                self._blocks = list(event.checkpoint_blocks)
                self._batch_norms = event.batch_norm_layers
                if self._checkpoint_step is None:
                    self._checkpoint_step = event.step  # resumed from: the checkpoint of its step
            case OptionApplied() if self._in_force is not None:
                self._in_force[event.option] = event.value
            case CheckpointSaved():
                self._checkpoint, self._checkpoint_step = Path(event.path), event.step

    def observe_row(self, row: MetricsRow) -> None:
        """Follow rank 0's metrics row: its memory by kind, where measured (what each block saves for backward)."""
        if row.memory is not None:
            self._memory = row.memory

    def _since(self, step: int) -> str:
        """Where the ranks start again for a rescue of ``step``: the start, or the last checkpoint and the steps that
        train again."""
        if self._checkpoint is None:
            return "the start"
        saved = self._checkpoint_step or 0
        again = {step - 1: "", step - 2: f" (step {step - 1} trains again)"}.get(saved, f" (steps {saved + 1}-{step - 1} train again)")
        return f"the checkpoint of step {saved}{again}"

    def rescue_from(self, rank: int, message: str, *, step: int, world_size: int) -> Rescue | str:
        """The rescue of rank ``rank``'s failure (``message``, as ``root_cause`` says it) in ``step`` of a run of
        ``world_size`` ranks, or what to add to the message where there is none: nothing where the failure is no
        allocation's or the rescue is off."""
        failure = message.partition(": ")[2]  # "rank 1 failed: OutOfMemoryError: CUDA out of memory..."
        kind, _, text = failure.partition(": ")
        if not (kind == "OutOfMemoryError" or (kind == "RuntimeError" and "can't allocate memory" in text)):
            return ""
        if self._in_force is None or not self._in_force.get(OOM_RESCUE.name):
            return ""
        options = LiveOptions(**self._in_force)
        first_line = (text.splitlines() or [kind])[0][:200]
        samples = self._batch_size // world_size if self._batch_size and self._refused_split is None else None
        saving = blocks_saving(self._blocks, self._memory)  # rank 0's: the ranks hold alike
        rung = rung_after(options, samples, self._blocks, saving)
        if rung is None:
            memory = f" {measured_memory(self._memory)}" if self._memory is not None else ""
            return f". {no_rung_left(step, first_line, options, samples)}{memory}"
        option, value = rung
        predicted = ""
        if self.rung_to_fit is not None:
            values = splits_from(value, samples) if option is SPLIT else checkpointing_rungs(options, samples, self._blocks, saving)
            value, predicted = self.rung_to_fit(options, option, values, world_size)
        if (step, option.name, value) in self._rescued:
            return (f". The OOM rescue started the ranks again from step {step} with {option.name} = "
                    f"{option.format(value)} before, and the step ran out of memory with {option.name} = "
                    f"{option.format(getattr(options, option.name))} again: something set it back (a scripted --at?)")
        if self._checkpoint is None and step > 1:
            return (". With ranks the OOM rescue starts them again from a checkpoint, and this run has none yet "
                    "(--checkpoint-every N keeps one every N steps)")
        self._rescued.add((step, option.name, value))
        note = (f"on rank {rank} of {world_size}: the ranks start again from {self._since(step)}, with the options in "
                f"force at step {step}")
        if option.name == "split" and (batch_norms := split_note(self._batch_norms)):
            note = f"{note}; {batch_norms}"
        if predicted:
            note = f"{note}; {predicted}"
        if self._refused_split is not None:
            note = (f"{note}; this run's batches cannot be split (the ranks refused split = {self._refused_split} at "
                    "their start)")
        if isinstance(value, str):  # blocks chosen by what they saved
            note = f"{note}; {chosen_blocks_note(value, self._blocks, saving, self._memory.step)}"
        after = options.with_value(option.name, value)
        self._last = (rank, message, step, world_size, after) if option.name == "split" else None
        return Rescue(after, self._checkpoint, rescued(step, first_line, option, options, after, note, samples))

    def split_refused(self) -> Rescue | None:
        """The ranks started again on a split rung and ended at their start with a usage error, before training: a
        split of the run's batches was refused (a batch of the user's own type, which the engine cannot cut; one
        process goes to checkpointing at once, having the batch). The same failure's rescue again, knowing that:
        the checkpointing rung, or None where there is no other (the refusal then ends the run, as it says)."""
        if self._last is None:
            return None
        rank, message, step, world_size, refused = self._last
        self._refused_split, self._last = refused.split, None
        again = self.rescue_from(rank, message, step=step, world_size=world_size)
        return again if isinstance(again, Rescue) else None
