"""The run's checkpoints, saved and resumed from: what the parts return, gathered in one place.

As torchtitan's ``CheckpointManager(states={...})``, the checkpointer holds the parts by the name of their entry
(``states``) and knows nothing of their insides: ``state_dict`` gathers what each returns into the typed record
of core/engine/state/checkpoint_contents.py (``TrainingState``), which a save writes as the file core/engine/state/checkpoint.py
writes; a resume reads that record back into the parts, each with its own ``load_state_dict``. A trial's
``snapshot`` is the same calls on the parts a step (or the trial) changes, copied in memory, and ``restore``
their ``load_state_dict``. Every rank calls ``save`` at the same step (each rank's RNG state is part of the
checkpoint); rank 0 writes.

A periodic checkpoint is written at once and made durable (fsyncs, renames: waiting on the disk) on a thread
while the next step trains; that step waits for it before its metrics row (``finish``), so a checkpoint that
fails stops the run before another row is written, as one written at once does. The others (final, requested,
relaunch, trial, error) are made durable before ``save`` returns.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from torchlab.core.engine.state.checkpoint import CheckpointCadence, WrittenCheckpoint, load_training_state, write_checkpoint
from torchlab.core.engine.state.checkpoint_contents import TrainingState, check_model_fits
from torchlab.core.engine.nested_state import map_state
from torchlab.core.engine.parallel.distributed import seed_rank
from torchlab.core.engine.option_hooks import OptionsInForce
from torchlab.core.engine.parts import Stateful, TrainingParts
from torchlab.core.engine.parallel.sharding import gathered_whole
from torchlab.core.errors import ConfigError, StorageError
from torchlab.core.records.config import config_from_toml
from torchlab.core.wire import protocol as p
from torchlab.core.wire.events import ResumedFromCheckpoint
from torchlab.core.options import OPTION_NAMES, RELAUNCHED_BY, STEPS, LiveOptions

#: The parts a trial's snapshot copies: what a step changes, and the options the trial changes. Not the progress:
#: a trial takes no step, and its time is the run's.
TRIAL_STATES = ("model", "optimization", "grad_scaler", "rng", "data", "options")


class Checkpointer:
    """Saves the parts' state to ``directory`` (None: the run keeps no checkpoints) and resumes them from one."""

    def __init__(self, parts: TrainingParts, directory: Path | None, spike_guard: Stateful,
                 rows_first: Callable[[int], None]) -> None:
        self.parts, self.directory = parts, directory
        #: Sends and writes the rows of the steps up to a checkpoint's before it is written (rank 0): a resume from
        #: it trains only the steps after, so a row still held then would be lost for good by a kill.
        self.rows_first = rows_first
        #: Each part with state, by the name of its entry in a checkpoint ("optimization": "optimizer" and
        #: "scheduler"; "progress": "step", "scripted_through" and "elapsed_s").
        self.states: dict[str, Stateful] = {
            "model": parts.model, "optimization": parts.optimization, "grad_scaler": parts.precisions,
            "rng": parts.rngs, "data": parts.data, "options": OptionsInForce(parts), "progress": parts.progress,
            "spike_guard": spike_guard,
        }
        self.cadence = CheckpointCadence(parts.config.checkpoint_every)
        self.last_step: int | None = None  # the step of the last checkpoint written (or resumed from)
        self.last_path: Path | None = None  # its file, once durable
        self.resumed: ResumedFromCheckpoint | None = None  # reported when the run starts, once nothing more can fail
        self.stored_options: dict[str, Any] = {}  # the live options the checkpoint resumed from held
        self._publishing: WrittenCheckpoint | None = None  # a periodic checkpoint made durable on its thread
        self._own_buffers: dict[str, torch.Tensor] | None = None  # a resumed rank's, until the ranks' wrapping is done

    def state_dict(self) -> TrainingState:
        """The training state as each part gives it: what a checkpoint holds (``rng_by_rank`` is ``save``'s)."""
        states = self.states
        optimization, progress = states["optimization"].state_dict(), states["progress"].state_dict()
        return TrainingState(
            step=progress["step"],
            model=states["model"].state_dict(),
            optimizer=optimization["optimizer"],
            scheduler=optimization["scheduler"],
            grad_scaler=states["grad_scaler"].state_dict(),
            rng=states["rng"].state_dict(),
            data=states["data"].state_dict(),
            options=states["options"].state_dict(),
            config=self.parts.config.to_toml(from_workload=self.parts.from_workload),
            scripted_through=progress["scripted_through"],
            elapsed_s=progress["elapsed_s"],
            spike_guard=states["spike_guard"].state_dict(),
        )

    def snapshot(self) -> dict[str, Any]:
        """A copy in memory of what a trial changes (``TRIAL_STATES``, each part's ``state_dict``), for ``restore``."""
        return {name: copy_of_state(self.states[name].state_dict()) for name in TRIAL_STATES}

    def restore(self, snapshot: dict[str, Any], last_use: bool = False) -> None:
        """Put back what ``snapshot`` copied, as often as needed: each part loads a copy of its state (a loaded
        optimizer state may share the tensors it was given, which the next steps change in place). ``last_use``:
        the snapshot is not put back again, so its tensors are loaded as they are, without the copy (half the cost
        of a trial's switch between its arms)."""
        for name, state in snapshot.items():
            self.states[name].load_state_dict(state if last_use else copy_of_state(state))

    def save(self, reason: str) -> None:
        """A checkpoint of this step, for ``reason`` (``periodic``, ``final``, ``requested``, ``trial``, ``error``,
        ``nonfinite``, or the option of a relaunch: ``world_size``, ``parallel``); see the module docstring."""
        self.finish()  # one at a time, in step order
        if self.directory is None:
            return
        parts = self.parts
        started = time.perf_counter()
        collectives = parts.world.collectives
        rng_by_rank = collectives.gather_objects(parts.rngs.state_dict()) if collectives is not None else None
        step = self.last_step = parts.progress.step
        sharded = parts.model.sharded is not None
        buffers_by_rank = None
        if sharded and collectives is not None:
            buffers_by_rank = collectives.gather_objects(saved_buffers(parts.model.model))
        if not parts.world.reports and not sharded:
            return
        state = self.state_dict()
        if sharded:  # every rank takes part in gathering each tensor whole; rank 0 keeps them (core/engine/parallel/sharding.py)
            state.model = gathered_whole(state.model, parts.world.reports)
            state.optimizer = gathered_whole(state.optimizer, parts.world.reports)
            if not parts.world.reports:
                return
        state.rng_by_rank, state.buffers_by_rank = rng_by_rank, buffers_by_rank
        if reason not in (*RELAUNCHED_BY, "trial"):
            # A checkpoint for a relaunch is taken after its boundary's commands and scripted changes were
            # queued; the relaunched run must not queue those scripted changes again. Nor must a run resumed
            # from the one taken before a trial queue that trial again: it stopped the run the first time.
            state.scripted_through = step
        self.rows_first(step)
        written = write_checkpoint(self.directory, step, state.contents(), keep=parts.config.keep_checkpoints)
        self.cadence.record(time.perf_counter() - started)
        if reason == "periodic":
            written.publish_in_background()
            self._publishing = written
            return
        self.last_path = written.publish()
        parts.reporter.emit(p.CheckpointSaved(step=step, path=str(self.last_path), reason=reason))

    def finish(self) -> None:
        """Wait for the periodic checkpoint being made durable on its thread, and report it; or raise the
        StorageError that says why it failed."""
        written, self._publishing = self._publishing, None
        if written is None:
            return
        try:
            path = written.wait()
        except StorageError:
            # As when a checkpoint fails at once: no other is written on that disk, so the message's
            # "the previous checkpoint is intact" stays what to resume from.
            self.last_step = self.parts.progress.step
            raise
        self.last_path = path
        self.parts.reporter.emit(p.CheckpointSaved(step=written.step, path=str(path), reason="periodic"))

    def resume(self, path: Path, explicit: Iterable[str]) -> LiveOptions:
        """Load the checkpoint ``path`` names into the parts; return the options to run with: the checkpoint's,
        but those given explicitly, and the configuration's total of steps (the checkpoint's, or ``--steps``).

        The configuration may differ from the checkpoint's (an override given with ``--resume``): the model must
        be the checkpoint's, and the optimizer and schedule follow their own rules (``Optimization.load_resumed``).
        A checkpoint from before an option was live has no value for it: the configuration's (workers was a
        setting of the configuration, which still reads it), else the default."""
        parts, config = self.parts, self.parts.config
        state = load_training_state(path, map_location=parts.device)
        stored = config_from_toml(state.config, "the checkpoint's configuration")
        check_model_fits(state.model, parts.model.state_dict(), stored.workload)
        try:
            parts.model.load_state_dict(state.model)
        except (RuntimeError, ValueError, KeyError) as error:
            raise ConfigError(f"--resume: the checkpoint does not fit this workload's model and optimizer: {error}") from None
        parts.optimization.load_resumed({"optimizer": state.optimizer, "scheduler": state.scheduler}, stored, config,
                                        parts.workload, state.step)
        parts.precisions.load_state_dict(state.grad_scaler)
        self._resume_random_states(state)
        self._resume_rank_buffers(state)
        parts.data.load_state_dict(state.data)
        if state.spike_guard is not None:  # a checkpoint from before the guard kept its state: a fresh window
            self.states["spike_guard"].load_state_dict(state.spike_guard)
        parts.progress.load_state_dict({"step": state.step, "scripted_through": state.scripted_through,
                                        "elapsed_s": state.elapsed_s})
        self.last_step, self.last_path = state.step, path
        self.stored_options = dict(state.options)
        options = LiveOptions(**{**config.options.as_dict(), **state.options})
        for name in set(explicit) & set(OPTION_NAMES):  # the live options among the names given
            options = options.with_value(name, getattr(config.options, name))
        options = options.with_value(STEPS.name, config.steps)  # the checkpoint's total, or a resume's --steps
        self.resumed = ResumedFromCheckpoint(step=state.step, options=options.as_dict())
        return options

    def _resume_random_states(self, state: TrainingState) -> None:
        """Rank 0 (or the single process) continues the saved stream; rank r continues its own if the
        checkpoint has one for this world size, else starts a fresh stream derived from (seed, step, r)."""
        world = self.parts.world
        if world.rank == 0:
            self.parts.rngs.load_state_dict(state.rng)
        elif state.rng_by_rank is not None and len(state.rng_by_rank) == world.size:
            self.parts.rngs.load_state_dict(state.rng_by_rank[world.rank])
        else:
            seed_rank(self.parts.config.seed, state.step, world.rank)


    def _resume_rank_buffers(self, state: TrainingState) -> None:
        """Rank r > 0 keeps its own buffers for ``put_back_own_buffers``, where the checkpoint has each rank's for this
        world size (a sharded run's; rank 0's are the model's), checked against the model's now."""
        world, saved = self.parts.world, state.buffers_by_rank
        if world.rank == 0 or saved is None or len(saved) != world.size:
            return
        own = saved[world.rank]
        for name, buffer in self.parts.model.model.named_buffers():
            if name in own and own[name].shape != buffer.shape:
                raise ConfigError(f"--resume: the checkpoint does not fit this workload's model: rank {world.rank}'s "
                                  f"buffer {name} is {tuple(own[name].shape)}, the model's {tuple(buffer.shape)}")
        self._own_buffers = own

    def put_back_own_buffers(self) -> None:
        """Once the model is wrapped for the ranks (whose wrapping made every rank's tensors rank 0's), this rank's own
        buffers as the checkpoint kept them. Under DDP the ranks hold rank 0's again at their first forward."""
        own, self._own_buffers = self._own_buffers, None
        if own is None:
            return
        with torch.no_grad():
            for name, buffer in self.parts.model.model.named_buffers():
                if name in own:
                    buffer.copy_(own[name])


def saved_buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The buffers of ``model`` that its state dict holds (BatchNorm's running statistics, a layer's own), on the host.
    FSDP2 does not broadcast buffers as DDP does: each rank's follow the batches it trained on, and a checkpoint keeps
    every rank's, or a resumed rank would train on with rank 0's (found by the combination matrix: a model whose
    buffer scales its forward resumed a step's loss 0.6522 where the run had trained 0.6513)."""
    held = model.state_dict(keep_vars=True).keys()
    return {name: buffer.detach().cpu() for name, buffer in model.named_buffers() if name in held}


#: Values a copy of a state may share with the state itself: nothing can change them in place.
_IMMUTABLE = (int, float, complex, bool, str, bytes, type(None))


def copy_of_state(value: Any) -> Any:
    """A ``state_dict`` copied so that training cannot change the copy: dicts, lists and tuples new (a module's
    ``_metadata`` kept: ``load_state_dict`` reads its versions), tensors cloned, numbers and strings shared,
    anything else deep-copied. What ``copy.deepcopy`` gives, less its memo (two entries that share a tensor get a
    clone each: loaded back, both land in the same tensor), at a fifth of its cost on an optimizer's state
    (tiny_gpt: 0.8 against 5.2 ms), which a trial pays at every change of arm."""
    return map_state(value, lambda item: isinstance(item, (torch.Tensor, *_IMMUTABLE)),
                     lambda item: item.clone() if isinstance(item, torch.Tensor) else item)
