"""The trainer's parts, each owning its state: what the loop trains with (``TrainingParts``).

As in torchtitan's trainer, every part that has state has ``state_dict`` and ``load_state_dict``: the model
(``ModelForms``: the model and the forms the steps run it in), the optimizer and schedule
(core/engine/optimization.py ``Optimization``), the precision with its GradScaler (core/engine/precision.py
``Precisions``), the data position (core/engine/data.py ``BatchStream``), the random number generators
(``RandomStates``) and how far the run is (``Progress``). The live options in force are a value here
(``TrainingParts.options``); their part, whose ``load_state_dict`` enacts them, is core/engine/option_hooks.py's.
core/engine/checkpointer.py gathers the parts by name, as torchtitan's ``CheckpointManager(states={...})``: a
checkpoint is what they return, and a trial's snapshot is the same calls, in memory.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any, ContextManager, Protocol

import torch

from torchlab.core.engine.activation_checkpointing import ActivationCheckpointing
from torchlab.core.engine.state.checkpoint import capture_rng_state, restore_rng_state
from torchlab.core.engine.data import BatchStream
from torchlab.core.engine.parallel.distributed import (
    Collectives, RankContext, check_world_size, open_process_group, rank_device, wrap_model,
)
from torchlab.core.engine.loss_output import LossFunction
from torchlab.core.engine.optimization import Optimization, build_optimizer, build_scheduler, group_names, own_training
from torchlab.core.engine.precision import Precisions
from torchlab.core.engine.parallel.sharding import shard
from torchlab.core.errors import ConfigError, StorageError
from torchlab.core.records.config import FromWorkload, TrainConfig
from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.wire.observer import TrainerObserver
from torchlab.core.options import LiveOptions, OptionChangeError
from torchlab.core.wire.payloads import TelemetrySample
from torchlab.core.wire.protocol import Message
from torchlab.core.workload import Workload

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

    from torchlab.core.engine.compile_watch import CompileWatch

DEFAULT_BATCH_SIZE = 32
_NOTHING = contextlib.nullcontext()


class Stateful(Protocol):
    """What every part with state has (``torch.distributed.checkpoint.stateful.Stateful``'s two methods)."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device (--device) {name}: this machine has no usable CUDA device; use cpu or auto.")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"device (--device) {name}: only {torch.cuda.device_count()} CUDA device(s) here.")
    return device


class World:
    """This process's place among data-parallel ranks: ``ranks`` None for a single process, ``collectives``
    the few per step that keep the ranks in lock-step. ``can_relaunch``: a supervisor acts on the ``relaunch``
    outcome, so a change of world size is possible. Rank 0 (or the single process) ``reports``: it takes
    commands and reports; the other ranks only train. ``supervised``: ranks that torchlab's supervisor started
    (not torchrun), which reports the one that fails."""

    def __init__(self, ranks: RankContext | None, collectives: Collectives | None, can_relaunch: bool) -> None:
        self.ranks, self.collectives, self.can_relaunch = ranks, collectives, can_relaunch
        # Plain attributes, not properties: the loop reads them every step.
        self.size = ranks.world_size if ranks is not None else 1
        self.rank = ranks.rank if ranks is not None else 0
        self.reports = ranks is None or ranks.reports
        self.supervised = ranks is not None and ranks.supervised


class ModelForms:
    """The model, and the forms the steps run it in: with ranks the DDP wrapper (which averages the gradients) or,
    with ``parallel=fsdp``, the model itself sharded in place by FSDP2 (core/engine/parallel/sharding.py); while compile is
    on, torch.compile's (of the wrapper with ranks, as PyTorch advises). ``model`` itself is never replaced: its
    ``state_dict`` is what checkpoints hold (gathered whole when sharded), and evaluation and the non-finite guard
    use it as it is."""

    def __init__(self, model: torch.nn.Module, checkpointing: ActivationCheckpointing) -> None:
        self.model = model
        self.checkpointing = checkpointing  # its blocks wrapped in place: the same model, another forward
        self.ddp: torch.nn.Module | None = None
        self.sharded: FSDPModule | None = None  # the model, once FSDP2 sharded it (parallel=fsdp with ranks)
        self.compiled: torch.nn.Module | None = None  # the model as torch.compile runs it, while compile is on
        self.running: torch.nn.Module = model  # what a step's loss function gets
        #: what torch.compile did (core/engine/compile_watch.py): made with the first compile, following it while on
        self.compile_watch: CompileWatch | None = None
        #: the ``dynamic`` setting the graphs torch.compile holds in this process were compiled under (None: none yet)
        self.compiled_dynamic: str | None = None

    def wrap_for_ranks(self, device: torch.device, parallel: str, optimizer: torch.optim.Optimizer,
                       reshard_after_forward: bool, precisions: Precisions) -> None:
        """Last, once the model resumed and took its options: DDP registers its hooks on the parameters the optimizer
        already holds, and broadcasts rank 0's weights; FSDP2 shards the blocks the activation checkpointing knows,
        then the root, and moves the optimizer onto the shards (every rank holds the same weights: rank 0's seed,
        or the checkpoint)."""
        if parallel == "fsdp":  # amp becomes FSDP2's mixed precision policy, fixed while the ranks live
            precisions.shard()
            self.sharded = shard(self.model, list(self.checkpointing.blocks.values()), optimizer, reshard_after_forward,
                                 precisions.current.param_dtype)
        else:
            self.ddp = wrap_model(self.model, device)
        self.running = self.compiled if self.compiled is not None else self.eager

    @property
    def eager(self) -> torch.nn.Module:
        """What the loss function gets when nothing is compiled: the DDP wrapper with ranks, else the model."""
        return self.ddp if self.ddp is not None else self.model

    def set_compiled(self, compiled: torch.nn.Module | None) -> None:
        self.compiled = compiled
        self.running = compiled if compiled is not None else self.eager
        if compiled is None and self.compile_watch is not None:
            self.compile_watch.detach()

    def watch_compile(self) -> CompileWatch:
        """The watch of torch.compile, following it from now (imported with the first compile, not before)."""
        from torchlab.core.engine.compile_watch import CompileWatch

        if self.compile_watch is None:
            self.compile_watch = CompileWatch()
        self.compile_watch.attach()
        return self.compile_watch

    def for_step(self, eager: bool) -> torch.nn.Module:
        """The model a step runs: uncompiled where it must see hooks a compiled graph would not fire."""
        return self.eager if eager else self.running

    def gradient_sync(self, last_micro_batch: bool) -> ContextManager:
        """With ranks, gradients are averaged once per optimizer step: on the last micro-batch's backward."""
        if self.sharded is not None:  # FSDP2 has a setter, not a context: set before every backward
            self.sharded.set_requires_gradient_sync(last_micro_batch)
            return _NOTHING
        return _NOTHING if self.ddp is None or last_micro_batch else self.ddp.no_sync()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state)  # copied into the same tensors: the optimizer's still hold them


class RandomStates:
    """The random number generators (Python's, NumPy's, torch's CPU and CUDA ones) of this process, as they were
    before the batch at ``data``'s position was drawn: a batch drawn ahead (``BatchStream.fetch_ahead``) is drawn
    again after a restore, with the same random numbers."""

    def __init__(self, data: BatchStream) -> None:
        self.data = data

    def state_dict(self) -> dict[str, Any]:
        drawn_ahead = self.data.rng_before_peek
        return drawn_ahead if drawn_ahead is not None else capture_rng_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        restore_rng_state(state)


class Progress:
    """How far the run is (torchtitan's ``TrainState``): ``step``, the last optimizer step taken (they count from
    1); ``scripted_through``, the last step whose ``--at``, ``--trial`` and ``--profile-at`` entries were queued;
    and the training time of the whole run, this process's and that of the processes it resumed from."""

    def __init__(self) -> None:
        self.step = 0
        self.scripted_through = 0
        self.first_step_of_process = 1
        self._elapsed_before = 0.0
        self._started = time.monotonic()

    def start_clock(self) -> None:
        self._started = time.monotonic()

    def elapsed(self) -> float:
        return self._elapsed_before + time.monotonic() - self._started

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "scripted_through": self.scripted_through, "elapsed_s": self.elapsed()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = state["step"]
        self.scripted_through = state["scripted_through"]
        self._elapsed_before = float(state["elapsed_s"])
        self.first_step_of_process = self.step + 1


class Reporter:
    """The trainer's observers (rank 0's; none on the other ranks), and what goes to them."""

    def __init__(self, observers: list[TrainerObserver]) -> None:
        self.observers = observers

    def emit(self, event: Message) -> None:
        """To every observer, even when one cannot write (a full disk must not keep the app uninformed)."""
        failure: StorageError | None = None
        for observer in self.observers:
            try:
                observer.on_event(event)
            except StorageError as error:
                failure = failure or error
        if failure is not None:
            raise failure

    def metrics(self, row: MetricsRow) -> None:
        for observer in self.observers:
            observer.on_metrics(row)

    def telemetry(self, sample: TelemetrySample) -> None:
        for observer in self.observers:
            observer.on_telemetry(sample)

    def before_checkpoint(self, step: int) -> None:
        for observer in self.observers:
            observer.before_checkpoint(step)

    def leaving(self, status: str, step: int, message: str) -> None:
        """Every observer told the process leaves (``TrainerObserver.leaving``), even where one fails."""
        for observer in self.observers:
            try:
                observer.leaving(status, step, message)
            except Exception:  # the others still get theirs: the process leaves either way
                pass


class TrainingParts:
    """What the loop trains with: the parts that own the training state, and what they are built from."""

    def __init__(self, config: TrainConfig, workload: Workload, world: World, device: torch.device, batch_size: int,
                 reporter: Reporter) -> None:
        self.config, self.workload, self.world, self.device, self.batch_size = config, workload, world, device, batch_size
        self.reporter = reporter
        model = workload.model.to(device)
        model.train()
        optimizer = build_optimizer(model, config, workload)
        scheduler = build_scheduler(optimizer, config, workload)  # a LightningModule's sets its interval as it is made
        self.optimization = Optimization(optimizer, scheduler, per_epoch=workload.scheduler_interval == "epoch")
        #: what the workload's own optimizer and scheduler are, recorded in place of the settings they replace
        self.from_workload: FromWorkload | None = own_training(optimizer, self.optimization.scheduler, workload)
        #: each group's name, where the workload's optimizer has several: each group's LR is then reported
        self.lr_groups = group_names(optimizer) if workload.optimizer is not None and len(optimizer.param_groups) > 1 else None
        self.data = BatchStream(  # its workers and pinned memory are live options, enacted with the others
            workload.dataset, batch_size=batch_size, collate_fn=workload.collate_fn, seed=config.seed, device=device,
            rank=world.rank, world_size=world.size,
        )
        self.model = ModelForms(model, ActivationCheckpointing(model, workload.checkpoint_blocks))
        self.precisions = Precisions(device)  # the mode in force, and the fp16 GradScaler across modes and checkpoints
        self.rngs = RandomStates(self.data)
        self.progress = Progress()
        self.loss = LossFunction(workload, device, first_step=lambda: self.progress.first_step_of_process)
        self.options = LiveOptions()  # the options in force; commands change them only between steps

    @classmethod
    def build(cls, config: TrainConfig, workload: Workload, ranks: RankContext | None, can_relaunch: bool,
              reporter: Reporter) -> TrainingParts:
        """The parts for ``config``; with ranks (world size > 1, or any size under torchrun), this rank's, in its
        process group. A supervised world size of 1 trains in-process; under torchrun even one rank is a real rank
        (process group and DDP, so ``torchrun --nproc-per-node 1`` exercises the data-parallel path)."""
        ranks = ranks if ranks is not None and (ranks.world_size > 1 or not ranks.supervised) else None
        device = resolve_device(rank_device(config.device, ranks) if ranks else config.device)
        batch_size = config.batch_size or workload.batch_size or DEFAULT_BATCH_SIZE
        collectives = None
        if ranks is not None:
            try:
                check_world_size(ranks.world_size, device=device, batch_size=batch_size)
            except OptionChangeError as refusal:
                raise ConfigError(f"world_size (--world-size) {ranks.world_size}: {refusal}.") from None
            open_process_group(ranks, device)
            collectives = Collectives(ranks, device)
        world = World(ranks, collectives, can_relaunch and (ranks is None or ranks.supervised))
        return cls(config, workload, world, device, batch_size, reporter)
