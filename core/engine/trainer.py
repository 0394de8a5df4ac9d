"""The trainer: one loop over parts that own their state, which applies option changes at step boundaries.

The loop (``train_steps``) is a step boundary (core/engine/commands.py: queued commands apply there, never
inside a step), one optimizer step (``train_step``, read top to bottom like nanoGPT's), its report, and what
follows a step (a periodic checkpoint, the profiler's mark). The parts it trains with, each with its own
``state_dict`` and ``load_state_dict``, are in core/engine/parts.py; the checkpoint is what they return,
gathered and written by core/engine/checkpointer.py. A controlled trial (core/engine/trials.py) runs the same
step. What a step measures besides training (probes, memory by kind, its time) is core/engine/instruments.py's.

Numbering: optimizer steps count from 1. A change "applied at step S" is in force for step S and after.
Each step moves exactly one small tensor to the host (loss, norms, flags packed together): that is the
only synchronisation point per step.

Data parallel (``ranks`` given: world size > 1, or any size under torchrun): every rank runs this loop on its
share of each global batch, with the model in DistributedDataParallel. Rank 0 alone takes commands and reports;
at each step boundary it broadcasts the commands it took, so all ranks apply them at the same step
(core/engine/parallel/distributed.py). A change of world size cannot happen inside a process: the trainer checkpoints
and ends with the outcome ``relaunch``, and its supervisor (core/engine/ranks/supervisor.py) starts the new ranks from
that checkpoint.
"""

from __future__ import annotations

import dataclasses
import math
import time
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from torchlab.core.engine.activation_checkpointing import recomputed_otherwise
from torchlab.core.engine.batch_split import split_batch
from torchlab.core.engine.checkpointer import Checkpointer
from torchlab.core.engine.commands import StepBoundary
from torchlab.core.engine.data import BatchStream
from torchlab.core.engine.parallel.distributed import RankContext, seed_rank
from torchlab.core.engine.instruments import Instruments, StepPlan, StepWatch
from torchlab.core.engine.adapters.loading import placed_error
from torchlab.core.engine.loss_output import mean_of_micro_batches
from torchlab.core.engine.measure.memory import out_of_memory
from torchlab.core.engine.guards.nonfinite import again_after_nonfinite, resume_after_nonfinite, stop_on_nonfinite
from torchlab.core.engine.guards.oom_rescue import (
    StepGenerators, batch_norm_layers, free_failed_step, next_rung, without_checkpointing,
)
from torchlab.core.engine.option_hooks import enact_initial
from torchlab.core.engine.outcome import RunOutcome
from torchlab.core.engine.parts import Reporter, TrainingParts
from torchlab.core.engine.measure.probes import clip_by_total_norm, clipped
from torchlab.core.engine.measure.profiler import Profiling
from torchlab.core.engine.guards.spike_guard import SpikeGuard
from torchlab.core.engine.measure.step_report import StepReport, metrics_row
from torchlab.core.engine.measure.telemetry import TelemetrySampler
from torchlab.core.engine.trials import Trials, TrialStopped
from torchlab.core.engine.adapters.workload_settings import changed_since_the_start, starting_configuration
from torchlab.core.errors import ConfigError, NonFiniteError, StorageError, WorkloadError
from torchlab.core.records.config import TrainConfig
from torchlab.core.wire import protocol as p
from torchlab.core.wire.events import HELD_BACK, RunEnded, RunStarted, StepSkipped
from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.wire.observer import TrainerObserver
from torchlab.core.wire.options import COMPILE, RESUMED, LiveOptions, OptionRefused, format_option_value
from torchlab.core.wire.protocol import SetCommand, TrainerCommand
from torchlab.core.wire.run_status import RunStatus
from torchlab.core.workload import Workload

#: fp16 skips are routine; this many in a row means the model itself makes NaN/Inf.
MAX_CONSECUTIVE_FP16_SKIPS = 25


class Trainer:
    """Trains ``workload`` under ``config``; call ``run()`` once. Thread-safe: ``submit``, ``request_stop``."""

    def __init__(
        self,
        config: TrainConfig,
        workload: Workload,
        *,
        observers: Iterable[TrainerObserver] = (),
        checkpoint_dir: Path | None = None,
        profiles_dir: Path | None = None,
        resume_from: Path | None = None,
        explicit: Iterable[str] = (),
        ranks: RankContext | None = None,
        can_relaunch: bool = False,
        samples_telemetry: bool = True,
    ) -> None:
        """``ranks``: this process's place among data-parallel ranks (None: a single process).
        ``can_relaunch``: a supervisor will act on the ``relaunch`` outcome, so world-size changes are possible.
        ``samples_telemetry``: False where the supervisor samples for the whole process tree (rank 0 of its ranks).
        ``explicit``: the names of the settings and live options the user gave (flags, ``--config``): a resume takes
        these options from ``config``, not the checkpoint; a new run takes the workload's own starting values
        (``Workload.settings``) for the others."""
        self.reporter = Reporter(list(observers) if ranks is None or ranks.reports else [])
        explicit = set(explicit)
        #: the workload's own starting values this run took (a new run's; a resumed one keeps its configuration's)
        self.workload_settings: dict[str, Any] = {}
        if resume_from is None:
            config, self.workload_settings = starting_configuration(config, workload, explicit)
        self.parts = parts = TrainingParts.build(config, workload, ranks, can_relaunch and checkpoint_dir is not None,
                                                 self.reporter)
        if self.workload_settings:
            taken = ", ".join(f"{name} {format_option_value(name, value)}" for name, value in self.workload_settings.items())
            self.reporter.emit(p.Log(level="info", text=f"the workload's own starting values: {taken}", step=0))
        self.samples_telemetry = samples_telemetry
        self.profiling = Profiling(parts.device, profiles_dir, self.reporter.emit)
        self.guard = SpikeGuard(parts)
        self.checkpoints = Checkpointer(parts, checkpoint_dir, self.guard, self._rows_before_checkpoint)
        self._consecutive_skips = 0
        self._held_row: MetricsRow | None = None  # a measured step's row, waiting for its update figures
        initial = config.options
        if resume_from is not None:
            initial = self.checkpoints.resume(resume_from, explicit)
            changed = changed_since_the_start(parts.config, initial, workload, explicit)
            if changed is not None:
                self.reporter.emit(p.Log(level="warning", text=changed, step=parts.progress.step))
        elif parts.world.rank > 0:
            seed_rank(config.seed, 0, parts.world.rank)  # same model and data as rank 0; its own dropout
        # Compiling runs a batch through the model (with DDP, the wrapper made last) and takes seconds to minutes: it
        # happens at the first step boundary, where a failure is a refusal and training goes on uncompiled, as for a
        # change asked for later. Rank 0 takes it to every rank, as any command.
        enact_initial(parts, initial.with_value(COMPILE.name, False))
        if parts.world.ranks is not None:  # last: DDP wraps (FSDP2 shards) the model as the options left it
            try:
                parts.model.wrap_for_ranks(parts.device, parts.options.parallel, parts.optimization.optimizer,
                                           config.reshard_after_forward, parts.precisions)
            except OptionRefused as refusal:  # amp=fp16 with parallel=fsdp
                raise ConfigError(f"parallel (--parallel) fsdp with amp={parts.options.amp}: {refusal}.") from None
        # After the sharding: the probes hold the parameters FSDP2 put in place of the model's own.
        self.instruments = Instruments(parts, self.profiling)
        self.trials = Trials(parts, self.train_step, self.checkpoints, self.profiling)
        self.boundary = StepBoundary(parts, self.instruments, self.checkpoints, self.trials, self.profiling)
        if initial.compile and parts.world.reports:
            # where the checkpoint had it on, this process compiles again what the run had: no change (RESUMED)
            again = resume_from is not None and self.checkpoints.stored_options.get(COMPILE.name) is True
            self.submit(SetCommand(COMPILE.name, COMPILE.format(True), source=RESUMED if again else "start"))
        self.rank_hosts = parts.world.collectives.describe_ranks() if parts.world.collectives is not None else None

    # ----------------------------------------------------------------- what the launchers and tests read
    @property
    def step(self) -> int:
        return self.parts.progress.step

    @property
    def config(self) -> TrainConfig:
        return self.parts.config

    @property
    def options(self) -> LiveOptions:
        return self.parts.options

    @property
    def device(self) -> torch.device:
        return self.parts.device

    @property
    def model(self) -> torch.nn.Module:
        return self.parts.model.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.parts.optimization.optimizer

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LRScheduler:
        return self.parts.optimization.scheduler

    @property
    def data(self) -> BatchStream:
        return self.parts.data

    @property
    def observers(self) -> list[TrainerObserver]:
        return self.reporter.observers

    # ----------------------------------------------------------------- control API (any thread)
    def submit(self, command: TrainerCommand) -> None:
        """Queue a command; it is applied at the next optimizer-step boundary."""
        self.boundary.submit(command)

    def request_stop(self, reason: str) -> None:
        """Stop at the next boundary; safe in a signal handler."""
        self.boundary.request_stop(reason)

    def pending_commands(self) -> list[TrainerCommand]:
        """Commands still queued (after the run ended): a supervisor hands them to the next trainer."""
        return self.boundary.pending()

    # ----------------------------------------------------------------- the run
    def run(self) -> RunOutcome:
        """Train to the configuration's last step, or until stopped; report, and say how the run ended."""
        if self.checkpoints.resumed is not None:
            self.reporter.emit(self.checkpoints.resumed)
        self.reporter.emit(self._run_started())
        self.parts.progress.start_clock()
        sampler = None
        if self.parts.config.telemetry_interval > 0 and self.parts.world.reports and self.samples_telemetry:
            sampler = TelemetrySampler(self.parts.device, self.reporter.telemetry, lambda: self.parts.progress.step,
                                       self.parts.config.telemetry_interval)
            sampler.start()
        try:
            return self._run_loop()
        finally:
            self.parts.data.close()
            if sampler is not None:
                sampler.stop()
            self.profiling.abandon()
            self.profiling.wait_for_builds()

    def _run_started(self) -> RunStarted:
        parts, probe = self.parts, self.instruments.grad_probe
        return RunStarted(
            step=parts.progress.step,
            device=str(parts.device),
            batch_size=parts.batch_size,
            steps=parts.config.steps,
            options=parts.options.as_dict(),
            modules=probe.module_names,
            module_params=probe.param_counts,
            module_tied=probe.tied_names,
            checkpoint_blocks=list(parts.model.checkpointing.blocks),
            from_workload=parts.from_workload.as_dict() if parts.from_workload else None,
            workload_settings=self.workload_settings or None,
            batch_norm_layers=batch_norm_layers(parts.model.model),
            world_size=parts.world.size,
            ranks=self.rank_hosts,
        )

    def _run_loop(self) -> RunOutcome:
        progress = self.parts.progress
        try:
            try:
                while progress.step < self.parts.config.steps and self.train_steps(1):
                    pass
            finally:  # a checkpoint that failed did so before what ended the loop: its StorageError wins
                try:
                    self._release_held_row()
                    self.guard.say_held_notice()  # the guard off: the last spike's notice held back, with its count
                finally:
                    self.checkpoints.finish()
        except NonFiniteError as error:
            message = f"{error}. {self._kept_for_a_resume(error.report.get('phase'))}"  # its checkpoint reported first
            self.reporter.emit(p.NonFinite(message=message, **error.report))
            return RunOutcome(RunStatus.NONFINITE, progress.step, message)
        except WorkloadError as error:
            self.reporter.emit(p.Error(step=progress.step + 1, message=str(error), traceback=traceback.format_exc()))
            raise
        except Exception as error:
            if self.parts.world.supervised:
                raise  # the supervisor reports it with the rank it happened on (and stops the other ranks)
            return self._failed(error)
        # A profile still being built holds its files (a trace of a few MB): on a disk near full, the last
        # checkpoint is written once the build is done, and a build that failed has removed what it wrote.
        self.profiling.wait_for_builds()
        return self._end()

    def _end(self) -> RunOutcome:
        """The last checkpoint, and the outcome: relaunched for a new world size, stopped, or finished."""
        step, boundary = self.parts.progress.step, self.boundary
        try:
            if boundary.relaunch is not None:
                self.checkpoints.save(reason=boundary.relaunch.option)  # always: the options changed since any earlier one
                return RunOutcome(RunStatus.RELAUNCH, step, relaunch=boundary.relaunch)
            if self.checkpoints.last_step != step and step > 0:
                self.checkpoints.save(reason="final")
        except StorageError as error:  # the last checkpoint could not be written: the run failed, said as such
            if self.parts.world.supervised:
                raise
            return self._failed(error)
        status = RunStatus.STOPPED if boundary.stop is not None else RunStatus.FINISHED
        self.reporter.emit(RunEnded(step=step, status=status))
        return RunOutcome(status, step, boundary.stop.reason if boundary.stop else "")

    def _kept_for_a_resume(self, phase: str | None) -> str:
        """After a non-finite stop: the last completed step checkpointed, where it is not yet (the stop came before the
        optimizer step: the weights and optimizer are that step's, finite), and where it is and how to resume it with a
        lower LR. Not with ranks: a checkpoint takes every rank, and the last one written stays what to resume from.
        A forward that went non-finite on the first step of a process that resumed from those weights says they give
        it again: a lower LR acts only after a forward, so it cannot mend them."""
        step, checkpoints, progress = self.parts.progress.step, self.checkpoints, self.parts.progress
        if phase == "forward" and step > 0 and progress.first_step_of_process == step + 1 and checkpoints.last_step == step:
            return again_after_nonfinite(checkpoints.last_path, step, self.parts.options.lr_scale)
        if step > 0 and checkpoints.last_step != step and self.parts.world.ranks is None:
            try:
                checkpoints.save(reason="nonfinite")
            except StorageError as error:
                return f"The checkpoint of step {step} could not be written: {error}"
        return resume_after_nonfinite(checkpoints.last_path, checkpoints.last_step, self.parts.options.lr_scale)

    def _failed(self, error: Exception) -> RunOutcome:
        """Report an error that ended the run, and keep the last completed step if it is not saved yet."""
        step = self.parts.progress.step
        message = str(error) if isinstance(error, StorageError) else placed_error(error)
        trace = "" if isinstance(error, StorageError) else traceback.format_exc()  # a full disk: the message is all
        try:
            self.reporter.emit(p.Error(step=step + 1, message=message, traceback=trace))
            if step > 0 and self.checkpoints.last_step != step and self.parts.world.ranks is None:
                # The last completed step is intact. Not with ranks: the others may be gone, and a
                # checkpoint takes every rank (their RNG states); the last one written stays as it was.
                self.checkpoints.save(reason="error")
        except StorageError as storage:  # the disk that failed may fail again; the app still got the error
            if str(storage) != message:
                message = f"{message} (then: {storage})"
        return RunOutcome(RunStatus.FAILED, step, message, error=type(error))

    # ----------------------------------------------------------------- the loop
    def train_steps(self, count: int) -> bool:
        """Apply queued commands and train up to ``count`` optimizer steps; False once a stop was requested.

        ``run()`` is this in a loop with error handling and reporting around it; benchmarks call it
        directly to interleave the engine with other code. Errors propagate as they are.
        """
        for _ in range(count):
            self.boundary.apply()
            if self.boundary.ends_run:
                return False
            step = self.parts.progress.step + 1
            plan = self.instruments.plan(step)
            report = self.train_step(plan)
            self.parts.progress.step = step
            self._count_skip(report)
            if plan.report:
                self._report(report)
            self._after_step(step)
        return True

    def train_step(self, plan: StepPlan) -> StepReport:
        """One optimizer step, read top to bottom: training's, and each step of a trial's arm. ``plan`` says what
        it measures besides; its one host transfer is its only synchronisation point."""
        parts, step = self.parts, self.parts.progress.step + 1
        precision, optimizer, data = parts.precisions.current, parts.optimization.optimizer, parts.data
        clip = parts.options.clip
        watch = self.instruments.watch(plan, step)  # the step's clock; activation hooks on a sampled step
        taken: list = []  # the step's batches: a retry after running out of memory runs the same ones
        generators: list[StepGenerators] = []  # as the step's first forward found them, for a retry
        while True:
            try:
                losses, metrics = self._forward_backward(plan, step, watch, taken, generators)
                break
            except Exception as error:
                recompute = recomputed_otherwise(error) and bool(parts.options.checkpointing) and self._retries(plan)
                if not (recompute or out_of_memory(error) and parts.options.oom_rescue and self._retries(plan)):
                    raise
                failure = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
            free_failed_step(parts)  # out of the except: the failed attempt's frames, and what they held, are gone
            if generators:
                generators[0].restore()
            if recompute:  # a block that cannot be checkpointed: the step again without it
                self.reporter.emit(without_checkpointing(parts, step, failure))
            else:
                self.reporter.emit(next_rung(parts, step, failure, taken[0] if taken else data.peek_batch(),
                                             self.instruments.memory_at_failure, self.instruments.last_memory))
            watch.options = parts.options  # the step's row says what it trained with: the rung's value
        if step < parts.config.steps:
            data.fetch_ahead()  # CUDA: the next step's batch, while the device runs the backward
        precision.unscale_(optimizer)  # fp16: true-scale gradients, before they are measured or clipped
        loss, mean_metrics = mean_of_micro_batches(losses, metrics)
        if parts.world.collectives is not None:  # every rank then sees the same loss and stops on the same NaN
            loss, mean_metrics = parts.world.collectives.mean_loss(loss, mean_metrics)
        # measured when the probe is due, or clipping or the spike guard needs them
        norms = watch.gradients(clipping=clip is not None or self.guard.on)
        host = watch.to_host(loss, norms, mean_metrics)  # like nanoGPT's loss.item(): on CUDA, a sync
        if not plan.trial:  # the measured step before: its update figures came with this transfer, before our update
            watch.outside_the_step(self._release_held_row)
        loss_value, total_norm = host.scalar("loss"), host.scalar("grad_norm_total")
        lrs_used = [group["lr"] for group in optimizer.param_groups]  # before the schedule moves them on
        spike = None if plan.trial else self.guard.judge(step, loss_value, total_norm)  # None: an ordinary step
        if spike is not None and spike.action in HELD_BACK:  # its update not applied: skipped, or rolled back
            optimizer.zero_grad(set_to_none=True)
            spike = self.guard.hold_back(spike)
            return watch.finish(host, loss_value, total_norm, clipped(total_norm, clip), False, lrs_used, spike.action)
        if not precision.tolerates_nonfinite and not _finite(loss_value, total_norm):  # fp16 skips the step instead
            self._stop_on_nonfinite(plan, step, loss_value, total_norm)  # before the optimizer step: weights stay good
        if clip is not None and norms is not None:  # decided from the total the host holds: below the limit, nothing
            clip_by_total_norm(norms, clip, total_norm)
        self.guard.before_update()  # CUDA: the update waits for the host copy taken at the boundary, if on its way
        before = watch.before_update()  # a measured step: the weights its update is measured against
        stepped = precision.step(optimizer)  # fp16: scaler.step(optimizer) and scaler.update(); False: skipped
        watch.after_update(before if stepped else None)  # its figures, with the next transfer; none of no update
        optimizer.zero_grad(set_to_none=True)
        optimization = parts.optimization  # the next LR, times the live scale (an epoch schedule's at an epoch's end)
        optimization.step_schedule(optimization.per_epoch and parts.data.finished_epoch())
        if spike is not None:  # let through: the guard is off (a notice), or a new level
            self.guard.report(spike)
        return watch.finish(host, loss_value, total_norm, clipped(total_norm, clip), stepped, lrs_used,
                            spike.action if spike is not None else None)

    def _forward_backward(self, plan: StepPlan, step: int, watch: StepWatch, taken: list,
                          generators: list[StepGenerators]) -> tuple[list, list]:
        """The step's forward and backward passes, ``accum`` micro-batches of ``split`` pieces each (the batches in
        ``taken`` first, then new ones, added to it): the micro-batches' losses and metrics, on the device. Where the
        step may be retried, ``generators`` gets torch's random generators as its first forward finds them."""
        parts, precision, data = self.parts, self.parts.precisions.current, self.parts.data
        accum, split = parts.options.accum, parts.options.split
        model = parts.model.for_step(eager=plan.activations)  # hooks added to a compiled model would not fire
        losses, metrics = [], []
        before_step = parts.workload.before_step
        weights = None  # each piece's weight: its share of the samples, or of the items (Workload.loss_items)
        cut: list = []  # the step's batches cut in pieces (each the batch itself, weighted 1, unless split)
        if parts.workload.loss_items is not None:  # the step's batches first: the items of all of them are counted
            while len(taken) < accum:
                taken.append(data.next_batch())
            cut = [split_batch(batch, split) for batch in taken]
            weights = parts.loss.item_weights([[piece for piece, _ in pieces] for pieces in cut], parts.world.collectives)
        for micro in range(accum):
            if micro == len(taken):
                taken.append(data.next_batch())
            if micro == 0 and before_step is not None:  # where the run is, for a loss that depends on it
                before_step(step, data.epoch_of_taken(len(taken)))  # the epoch of the step's first batch
            if micro == 0 and not generators and self._retries(plan):
                generators.append(StepGenerators.capture(parts.device))
            pieces = cut[micro] if cut else split_batch(taken[micro], split)
            for index, (piece, share) in enumerate(pieces):
                weight = weights[micro][index] if weights is not None else share
                whole = weights is None and share == 1  # the batch itself: its loss as it is
                last = micro == accum - 1 and index == len(pieces) - 1
                with parts.model.gradient_sync(last):  # DDP: averaged on the step's last backward
                    with watch.forward(), precision.autocast():  # a memory step counts the first forward's saved tensors
                        loss, metric_values = parts.loss(model, piece, step)
                    # each piece's weight over the micro-batches: the gradients add up to the mean's
                    precision.backward(loss if whole and accum == 1 else loss * (weight / accum))  # fp16: scaled
                weighted = loss.detach() if whole else loss.detach().float() * weight
                weighted_metrics = metric_values if whole or metric_values is None else metric_values * weight
                if index == 0:
                    losses.append(weighted)
                    metrics.append(weighted_metrics)
                else:  # the micro-batch's loss and metrics: its pieces' weighted by their shares
                    losses[-1] = losses[-1] + weighted
                    metrics[-1] = metrics[-1] + weighted_metrics if metric_values is not None else None
        return losses, metrics

    def _retries(self, plan: StepPlan) -> bool:
        """Whether a failed step can be retried (core/engine/guards/oom_rescue.py): in training (a trial's arm reports its
        failure) and in one process (other ranks would wait in its collectives)."""
        return not plan.trial and self.parts.world.collectives is None

    def _stop_on_nonfinite(self, plan: StepPlan, step: int, loss_value: float, total_norm: float | None) -> None:
        """NaN/Inf stops the run before the optimizer step, so the weights and the last checkpoint stay good (under
        fp16 it is routine overflow, and the precision skips the step instead). In a trial's arm a NaN loss ends the
        arm, and training goes on."""
        if plan.trial:
            if not math.isfinite(loss_value):
                raise TrialStopped(loss_value)
            return
        self._raise_nonfinite(step, loss_value, total_norm)

    def _raise_nonfinite(self, step: int, loss_value: float, total_norm: float | None) -> None:
        parts = self.parts
        precision, batch = parts.precisions.current, parts.data.last_batch

        def replay() -> torch.Tensor:
            with precision.autocast():
                return parts.loss.alone(parts.model.model, batch)

        stop_on_nonfinite(step, loss_value, total_norm, model=parts.model.model, optimizer=parts.optimization.optimizer,
                          run_loss=replay, batch=batch)

    def _count_skip(self, report: StepReport) -> None:
        """An optimizer step the precision skipped (fp16 overflow) is said; too many in a row stop the run. One the
        spike guard held back was said by it."""
        if report.spike in HELD_BACK:
            return
        if report.stepped:
            self._consecutive_skips = 0
            return
        self._consecutive_skips += 1
        self.reporter.emit(StepSkipped(step=report.step, **self.parts.precisions.current.skipped_step()))
        if self._consecutive_skips >= MAX_CONSECUTIVE_FP16_SKIPS:
            self._raise_nonfinite(report.step, math.nan, None)

    def _report(self, report: StepReport) -> None:
        """A report step: each rank's figures when due (a collective: every rank takes part), then rank 0 writes
        the metrics row and sends it to the observers, once the checkpoint before it is safe."""
        parts, instruments = self.parts, self.instruments
        rank_figures = None
        if parts.world.collectives is not None and instruments.next_step.figures:
            rank_figures = parts.world.collectives.gather_figures(report.step_time_s, report.data_wait_s)
            instruments.figures_gathered_at = time.monotonic()
        evaluation = None
        if self._is_eval_step(report.step) and (parts.world.reports or parts.model.sharded is not None):
            evaluation = self._evaluate()  # sharded: every rank's forward takes part in gathering each block
        if not parts.world.reports:
            return
        row = metrics_row(report, elapsed_s=parts.progress.elapsed(), epoch=parts.data.epoch,
                          batch_size=parts.batch_size, rank_figures=rank_figures,
                          evaluate=(lambda: evaluation) if evaluation is not None else None)
        self.checkpoints.finish()  # the step's row comes after the checkpoint before it is safe, or not at all
        if instruments.awaits_update_figures(report.step):
            self._held_row = row  # sent with them, after the next step's transfer (core/engine/measure/update_probe.py)
            return
        self.reporter.metrics(row)

    def _release_held_row(self) -> None:
        """Send the row held for its update figures, with them: read by the next step's transfer (and sent before its
        update, so that a row that cannot be written fails the run at the step it belongs to, whose checkpoint the
        error's is), or now, where the run ends before another step (with nothing to read where the device failed)."""
        row, self._held_row = self._held_row, None
        if row is None:
            return
        try:
            figures = self.instruments.update_figures(row.step)
        except Exception:  # the error that ends the run is the one to report; the row goes without its figures
            figures = {}
        self.reporter.metrics(dataclasses.replace(row, **figures) if figures else row)

    def _rows_before_checkpoint(self, step: int) -> None:
        self._release_held_row()
        self.reporter.before_checkpoint(step)

    def _after_step(self, step: int) -> None:
        self.checkpoints.finish()  # started after the step before (when no metrics row waited for it)
        self.profiling.after_step(step)
        self.guard.after_step(step)  # rollback's host copy, when due
        parts = self.parts
        due = self.instruments.next_step.checkpoint if parts.world.collectives is not None else self.checkpoints.cadence.due(step)
        if due and step < parts.config.steps:
            self.checkpoints.save(reason="periodic")

    def _is_eval_step(self, step: int) -> bool:
        config = self.parts.config
        every = config.eval_every
        return self.parts.workload.val_dataset is not None and every > 0 and (step % every == 0 or step == config.steps)

    def _evaluate(self) -> tuple[float, dict[str, float] | None]:
        """Rank 0 alone, on the model without its DDP wrapper; sharded, every rank, on the same batches (FSDP2 gathers
        each block's parameters from all of them)."""
        parts = self.parts
        return parts.loss.evaluate(parts.model.model, batch_size=parts.batch_size, limit=parts.config.eval_batches,
                                   autocast=parts.precisions.current.autocast, step=parts.progress.step)


def _finite(loss_value: float, total_norm: float | None) -> bool:
    return math.isfinite(loss_value) and (total_norm is None or math.isfinite(total_norm))
