"""The trainer: one loop over parts that own their state, which applies option changes at step boundaries.

The loop (``train_steps``) is a step boundary (core/engine/commands.py: queued commands apply there, never
inside a step), one optimizer step (``train_step``: core/engine/step.py, read top to bottom like nanoGPT's), its
report, and what follows a step (a periodic checkpoint, the profiler's mark). The parts it trains with, each with its own
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

from torchlab.core.analysis.stragglers import StragglerWatch
from torchlab.core.engine.checkpointer import Checkpointer
from torchlab.core.engine.commands import StepBoundary
from torchlab.core.engine.data import BatchStream
from torchlab.core.engine.parallel.distributed import RankContext, seed_rank
from torchlab.core.engine.parallel.hang_watch import HangWatch
from torchlab.core.engine.instruments import Instruments
from torchlab.core.engine.adapters.loading import placed_error
from torchlab.core.engine.guards.nonfinite import again_after_nonfinite, resume_after_nonfinite
from torchlab.core.engine.guards.oom_rescue import batch_norm_layers
from torchlab.core.engine.option_hooks import enact_initial
from torchlab.core.engine.outcome import RunOutcome
from torchlab.core.engine.parts import Reporter, TrainingParts
from torchlab.core.engine.measure.profiler import Profiling
from torchlab.core.engine.guards.spike_guard import SpikeGuard
from torchlab.core.engine.measure.step_report import StepReport, metrics_row
from torchlab.core.engine.measure.telemetry import TelemetrySampler
from torchlab.core.engine.step import OptimizerStep
from torchlab.core.engine.trials import Trials
from torchlab.core.errors import EXIT_FAILED, ConfigError, NonFiniteError, StorageError, WorkloadError
from torchlab.core.leave import leave_without_teardown
from torchlab.core.records.config import TrainConfig
from torchlab.core.records.starting_values import changed_since_the_start, starting_configuration
from torchlab.core.wire import protocol as p
from torchlab.core.wire.events import HELD_BACK, LongestBatch, RunEnded, RunStarted, StepSkipped
from torchlab.core.wire.hang import Hang
from torchlab.core.wire.straggler import Straggler
from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.wire.payloads import RankFigures, rank_place
from torchlab.core.wire.observer import TrainerObserver
from torchlab.core.options import COMPILE, RESUMED, LiveOptions, OptionChangeError, format_option_value
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
        """``ranks``: this process's place among data-parallel ranks (None: a single process). ``can_relaunch``: a
        supervisor will act on the ``relaunch`` outcome, so world-size changes are possible. ``samples_telemetry``: False
        where the supervisor samples for the whole process tree (rank 0 of its ranks). ``explicit``: the names of the
        settings and live options the user gave (flags, ``--config``): a resume takes these options from ``config``,
        not the checkpoint; a new run takes the workload's own starting values (``Workload.settings``) for the others."""
        self.reporter = Reporter(list(observers) if ranks is None or ranks.reports else [])
        explicit = set(explicit)
        #: the workload's own starting values this run took (a new run's; a resumed one keeps its configuration's)
        self.workload_settings: dict[str, Any] = {}
        if resume_from is None:
            config, self.workload_settings = starting_configuration(config, workload.settings, explicit)
        self.parts = parts = TrainingParts.build(config, workload, ranks, can_relaunch and checkpoint_dir is not None,
                                                 self.reporter)
        self._say_starting_values()
        self.samples_telemetry = samples_telemetry
        self.profiling = Profiling(parts.device, profiles_dir, self.reporter.emit)
        self.guard = SpikeGuard(parts)
        self.checkpoints = Checkpointer(parts, checkpoint_dir, self.guard, self._rows_before_checkpoint)
        self._consecutive_skips = 0
        self._held_row: MetricsRow | None = None  # a measured step's row, waiting for its update figures
        self._announced_elements = 0  # the longest batch said so far (``longest_batch``), by its elements
        initial = self._initial_options(config, workload, resume_from, explicit)
        enact_initial(parts, initial.with_value(COMPILE.name, False))  # compile: at the first boundary
        if parts.world.ranks is not None:
            self._wrap_for_ranks()
            self.checkpoints.put_back_own_buffers()
        # After the sharding: the probes hold the parameters FSDP2 put in place of the model's own.
        self.instruments = Instruments(parts, self.profiling)
        #: one optimizer step, training's and each of a trial arm's steps (core/engine/step.py)
        self.train_step = OptimizerStep(parts, self.instruments, self.guard, self._release_held_row)
        self.trials = Trials(parts, self.train_step, self.checkpoints, self.profiling)
        self.boundary = StepBoundary(parts, self.instruments, self.checkpoints, self.trials, self.profiling)
        if initial.compile and parts.world.reports:
            self._compile_at_the_first_boundary(resumed=resume_from is not None)
        self._watch_ranks(checkpoint_dir)

    def _say_starting_values(self) -> None:
        if self.workload_settings:
            taken = ", ".join(f"{name} {format_option_value(name, value)}" for name, value in self.workload_settings.items())
            self.reporter.emit(p.Log(level=p.LogLevel.INFO, text=f"the workload's own starting values: {taken}", step=0))

    def _initial_options(self, config: TrainConfig, workload: Workload, resume_from: Path | None,
                         explicit: set[str]) -> LiveOptions:
        """The options the run starts with: a resume's from its checkpoint (those in ``explicit`` from ``config``), said
        where the workload's own starting values changed since; a new run's from ``config``. A new run's rank other
        than 0 reseeds: the same model and data as rank 0, its own dropout."""
        parts = self.parts
        if resume_from is None:
            if parts.world.rank > 0:
                seed_rank(config.seed, 0, parts.world.rank)
            return config.options
        initial = self.checkpoints.resume(resume_from, explicit)
        changed = changed_since_the_start(parts.config, initial, workload.settings, explicit)
        if changed is not None:
            self.reporter.emit(p.Log(level=p.LogLevel.WARNING, text=changed, step=parts.progress.step))
        return initial

    def _compile_at_the_first_boundary(self, *, resumed: bool) -> None:
        """torch.compile asked for at the start, as a command. Compiling runs a batch through the model (with DDP, the
        wrapper made last) and takes seconds to minutes: it happens at the first step boundary, where a failure is a
        refusal and training goes on uncompiled, as for a change asked for later; rank 0 takes it to every rank, as
        any command. Where the checkpoint had it on, this process compiles again what the run had: no change
        (``RESUMED``)."""
        again = resumed and self.checkpoints.stored_options.get(COMPILE.name) is True
        self.submit(SetCommand(COMPILE.name, COMPILE.format(True), source=RESUMED if again else "start"))

    def _wrap_for_ranks(self) -> None:
        """Last of the model's set-up: DDP wraps (FSDP2 shards) the model as the options left it."""
        parts = self.parts
        try:
            parts.model.wrap_for_ranks(parts.device, parts.options.parallel, parts.optimization.optimizer,
                                       parts.config.reshard_after_forward, parts.precisions)
        except OptionChangeError as refusal:  # amp=fp16 with parallel=fsdp
            raise ConfigError(f"parallel (--parallel) fsdp with amp={parts.options.amp}: {refusal}.") from None

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

    def request_stop(self, reason: str, signal_number: int = 0) -> None:
        """Stop at the next boundary (``signal_number``: the signal that asked, core/engine/parallel/preemption.py); safe in
        a signal handler."""
        self.boundary.request_stop(reason, signal_number)

    def pending_commands(self) -> list[TrainerCommand]:
        """Commands still queued (after the run ended): a supervisor hands them to the next trainer."""
        return self.boundary.pending()

    # ----------------------------------------------------------------- the run
    def run(self) -> RunOutcome:
        """Train to the configuration's last step, or until stopped; report, and say how the run ended."""
        if self.checkpoints.resumed is not None:
            self.reporter.emit(self.checkpoints.resumed)
        self.reporter.emit(self._run_started())
        self._announce_longest_batch(self.parts.progress.step)  # a resumed run's, as its checkpoint knew it
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
        return RunOutcome(status, step, boundary.stop.reason if boundary.stop else "", stopped_by=boundary.stopped_by)

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
            if self.hang_watch is not None:
                self.hang_watch.step_started(step)
            report = self.train_step(plan)
            if self.hang_watch is not None:
                self.hang_watch.step_ended(report.step_time_s)
            self.parts.progress.step = step
            self._count_skip(report)
            if plan.report:
                self._report(report)
            self._after_step(step)
        return True

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
            self.train_step.raise_nonfinite(report.step, math.nan, None)

    def _report(self, report: StepReport) -> None:
        """A report step: each rank's figures when due (a collective: every rank takes part), then rank 0 writes
        the metrics row and sends it to the observers, once the checkpoint before it is safe."""
        parts, instruments = self.parts, self.instruments
        rank_figures = None
        if parts.world.collectives is not None and instruments.next_step.figures:
            phases = instruments.phase_totals.since_gathered() if instruments.phase_totals is not None else None
            rank_figures = parts.world.collectives.gather_figures(report.step_time_s, report.data_wait_s, phases)
            instruments.figures_gathered_at = time.monotonic()
            if parts.world.reports:
                self._judge_stragglers(report.step, rank_figures)
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

    def _watch_ranks(self, checkpoint_dir: Path | None) -> None:
        """With ranks: where each runs (for run_started), rank 0's straggler verdict (core/analysis/stragglers.py) and
        each rank's hang watch."""
        collectives = self.parts.world.collectives
        self.rank_hosts = collectives.describe_ranks() if collectives is not None else None
        self.stragglers = StragglerWatch()
        self.hang_watch = self._hang_watch(checkpoint_dir)

    def _hang_watch(self, checkpoint_dir: Path | None) -> HangWatch | None:
        """With ranks and a run directory, each rank's watch of its steps (core/engine/parallel/hang_watch.py)."""
        world, factor = self.parts.world, self.parts.config.hang_after
        if world.collectives is None or checkpoint_dir is None or not factor:
            return None

        def said(step: int, waited: float, explanation: str, folder: Path) -> None:
            last = self.checkpoints.last_path
            self.reporter.emit(Hang(step=step, waited_s=round(waited, 1), explanation=explanation, folder=str(folder),
                                    checkpoint=str(last) if last is not None else "",
                                    checkpoint_step=self.checkpoints.last_step if last is not None else None,
                                    ends=self.parts.config.on_hang == "end"))

        watch = HangWatch(world.rank, world.size, checkpoint_dir.parent, factor, said, stop_asked=self.boundary.stop_asked,
                          end=self._end_at_hang, ends_at_once=self.parts.config.on_hang == "end")
        world.collectives.hang_watch = watch
        return watch

    def _end_at_hang(self, step: int, reason: str) -> None:
        """Rank 0 ends the run at its hung ``step``, for the stop asked (``reason``), on the hang watch's thread: the
        error and the run's end to the observers (the journal, the app, the supervisor), then the process leaves; its
        launcher ends the other ranks, stuck in a collective that will never complete."""
        last = self.checkpoints.last_path
        resume = (f"its last checkpoint is step {self.checkpoints.last_step}'s ({last}), what --resume starts from"
                  if last is not None else "it has no checkpoint yet to resume from")
        message = f"step {step} hung; ended as asked ({reason}), with no final checkpoint (its ranks are stuck); {resume}"
        try:
            self.reporter.emit(p.Error(step=step, message=message, traceback=""))
        except StorageError:
            pass  # a full disk: the run's end still reaches the app, and the process leaves
        self.reporter.leaving(RunStatus.FAILED, step, message)
        leave_without_teardown(EXIT_FAILED)

    def _judge_stragglers(self, step: int, figures: list[RankFigures]) -> None:
        """A rank that has held the others back for the verdict's window, or no longer does, said (a ``straggler``)."""
        described = self.rank_hosts or []
        nodes = len({rank.get("node", 0) for rank in described})
        hosts = {rank["rank"]: rank_place(rank["host"], rank.get("node", 0), nodes) for rank in described}
        for verdict in self.stragglers.add(step, figures):
            self.reporter.emit(Straggler(step=step, rank=verdict.rank, host=hosts.get(verdict.rank, ""),
                                         excess_s=verdict.excess_s, step_share=verdict.step_share,
                                         since_step=verdict.since_step, part=verdict.part, cleared=verdict.cleared))

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
        self._announce_longest_batch(step)
        watch = self.parts.model.compile_watch
        if watch is not None and watch.news:  # a step that compiled again: a recompile, a break met again
            self.reporter.emit(watch.report(step))
        self.profiling.after_step(step)
        self.guard.after_step(step)  # rollback's host copy, when due
        parts = self.parts
        due = self.instruments.next_step.checkpoint if parts.world.collectives is not None else self.checkpoints.cadence.due(step)
        if due and step < parts.config.steps:
            self.checkpoints.save(reason="periodic")

    def _announce_longest_batch(self, step: int) -> None:
        """``longest_batch``, where the run has taken a batch longer than any said before: what its forecaster
        predicts with (core/engine/measure/longest_batch.py). A comparison a step; a few events a run."""
        longest = self.parts.data.lengths.longest
        if longest is not None and longest.elements > self._announced_elements:
            self.reporter.emit(LongestBatch(step=step, shapes=[list(shape) for shape in longest.shapes],
                                            elements=longest.elements, previous_elements=self._announced_elements))
            self._announced_elements = longest.elements

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

