"""The trainer: one loop that owns the model, and applies option changes at optimizer-step boundaries.

Anything may *request* a change at any time, from any thread (``submit``); the loop applies queued
requests only between optimizer steps, after a full accumulation cycle, and acknowledges each with the
step it took effect at (``option_applied``) or refuses it with a reason (``option_refused``). Scripted
changes (``--at``) enter through the same queue, so they exercise the same path as the app's keys.

Numbering: optimizer steps count from 1. A change "applied at step S" is in force for step S and after.
Each step moves exactly one small tensor to the host (loss, norms, flags packed together): that is the
only synchronisation point per step.

Data parallel (``ranks`` given: world size > 1, or any size under torchrun): every rank runs this loop
on its share of each global batch, with the model in DistributedDataParallel. Rank 0 alone takes commands and reports; at each step
boundary it broadcasts the commands it took, so all ranks apply them at the same step (core/engine/distributed.py).
A change of world size cannot happen inside a process: the trainer checkpoints and ends with the outcome
``relaunch``, and its supervisor (core/engine/ranks.py) starts the new ranks from that checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from torchlab.core.engine.activation_checkpointing import ActivationCheckpointing
from torchlab.core.engine.compiling import compile_model, compile_on_batch, compiled_graphs, failure_reason
from torchlab.core.engine.checkpoint_contents import check_model_fits
from torchlab.core.engine.checkpoint import (
    CheckpointCadence,
    WrittenCheckpoint,
    capture_rng_state,
    load_training_state,
    restore_rng_state,
    write_checkpoint,
)
from torchlab.core.wire.config import MAX_PROFILE_STEPS, MAX_TRIAL_STEPS, TrainConfig, config_from_toml
from torchlab.core.engine.data import BatchStream, DataPosition, evaluation_batches
from torchlab.core.engine.distributed import (
    PACKET_BYTES,
    Collectives,
    RankContext,
    check_world_size,
    encode_packet,
    open_process_group,
    rank_device,
    seed_rank,
    wrap_model,
)
from torchlab.core.wire.errors import ConfigError, NonFiniteError, StorageError, WorkloadError, shown
from torchlab.core.engine.loading import describe_code, user_frame
from torchlab.core.engine.nonfinite import localise_nonfinite
from torchlab.core.wire.observer import TrainerObserver
from torchlab.core.engine.outcome import RunOutcome, WorldSizeChange
from torchlab.core.wire.run_status import RunStatus
from torchlab.core.wire.options import (
    ACCUM, AMP, CHECKPOINTING, CLIP, COMPILE, LIVE_OPTIONS, LR_SCALE, PIN_MEMORY, STEPS, WORKERS, WORLD_SIZE, LiveOption,
    LiveOptions, OptionRefused, live_option,
)
from torchlab.core.wire.events import (
    CompileStarted, Paused, ProfileStarted, Resumed, ResumedFromCheckpoint, RunEnded, RunStarted, StepSkipped, TrialStarted,
)
from torchlab.core.wire import protocol as p
from torchlab.core.wire.protocol import (
    PauseCommand, ProfileCommand, ResumeCommand, SaveCheckpointCommand, SetCommand, StopCommand, TrainerCommand, TrialCommand,
    TrialProgress, trainer_command,
)
from torchlab.core.engine.precision import Precision, Precisions
from torchlab.core.engine.profiler import ProfilerSnapshot
from torchlab.core.engine.probes import ActivationStatsProbe, GradNormProbe, GradNorms, ProbeCadence, clip_by_total_norm
from torchlab.core.engine.memory import MemoryCadence, MemoryProbe, SavedTensorCount, out_of_memory
from torchlab.core.engine.trials import MEMORY_STEP, ArmRecord, TrainingSnapshot, TrialOutOfMemory, TrialStopped
from torchlab.core.wire.trials import AS_IT_IS, NOT_TRIED
from torchlab.core.engine.loss_output import MetricNames, read_loss_output
from torchlab.core.engine.optimization import (
    LearningRates, build_optimizer, build_scheduler, group_names, own_training, replan_schedule, step_to,
)
from torchlab.core.engine.step_report import HostTransfer, StepReport, stats_by_module
from torchlab.core.engine.telemetry import OthersCpuMeter, TelemetrySampler
from torchlab.core.wire.payloads import TelemetrySample
from torchlab.core.workload import Workload

DEFAULT_BATCH_SIZE = 32
#: With ranks, the per-rank figures (step time, data wait, memory, RSS) are gathered at most this often.
RANK_FIGURES_INTERVAL_S = 1.0
#: A running trial says how far it is at most this often (and at each arm's start).
TRIAL_PROGRESS_INTERVAL_S = 0.25
#: fp16 skips are routine; this many in a row means the model itself makes NaN/Inf.
MAX_CONSECUTIVE_FP16_SKIPS = 25


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


#: Each live option's enact hook (a Trainer method), by option name: filled by ``@enacts`` below.
_ENACT_HOOKS: dict[str, Callable[[Trainer, Any], bool | str | None]] = {}


def enacts(option: LiveOption) -> Callable[[Callable], Callable]:
    """Register the decorated Trainer method as the hook that makes ``option``'s values real."""

    def register(hook: Callable) -> Callable:
        _ENACT_HOOKS[option.name] = hook
        return hook

    return register


class Trainer:
    """Trains ``workload`` under ``config``; call ``run()`` once. Thread-safe: ``submit``."""

    def __init__(
        self,
        config: TrainConfig,
        workload: Workload,
        *,
        observers: Iterable[TrainerObserver] = (),
        checkpoint_dir: Path | None = None,
        profiles_dir: Path | None = None,
        resume_from: Path | None = None,
        explicit_options: Iterable[str] = (),
        ranks: RankContext | None = None,
        can_relaunch: bool = False,
        samples_telemetry: bool = True,
    ) -> None:
        """``ranks``: this process's place among data-parallel ranks (None: a single process).
        ``can_relaunch``: a supervisor will act on the ``relaunch`` outcome, so world-size changes are possible.
        ``samples_telemetry``: False where the supervisor samples for the whole process tree (rank 0 of its ranks)."""
        self.config = config
        self.workload = workload
        # A supervised world size of 1 trains in-process; under torchrun even one rank is a real rank
        # (process group and DDP, so `torchrun --nproc-per-node 1` exercises the data-parallel path).
        self.ranks = ranks if ranks is not None and (ranks.world_size > 1 or not ranks.supervised) else None
        self.world_size = self.ranks.world_size if self.ranks else 1
        self.reports = self.ranks is None or self.ranks.reports
        self.observers = list(observers) if self.reports else []
        self.checkpoint_dir = checkpoint_dir
        self.profiles_dir = profiles_dir
        self.can_relaunch = can_relaunch and checkpoint_dir is not None and (self.ranks is None or self.ranks.supervised)
        self.samples_telemetry = samples_telemetry
        self._profiling: ProfilerSnapshot | None = None
        self._profile_builds: list[threading.Thread] = []
        self.device = resolve_device(rank_device(config.device, self.ranks) if self.ranks else config.device)
        self.batch_size = config.batch_size or workload.batch_size or DEFAULT_BATCH_SIZE
        self.collectives: Collectives | None = None
        if self.ranks is not None:
            try:
                check_world_size(self.world_size, device=self.device, batch_size=self.batch_size)
            except OptionRefused as refusal:
                raise ConfigError(f"world_size (--world-size) {self.world_size}: {refusal}.") from None
            open_process_group(self.ranks, self.device)
            self.collectives = Collectives(self.ranks, self.device)

        self.model = workload.model.to(self.device)
        self.model.train()
        self.optimizer = build_optimizer(self.model, config, workload)
        self.scheduler = build_scheduler(self.optimizer, config, workload)
        self.from_workload = own_training(self.optimizer, self.scheduler, workload)  # recorded in place of the settings
        self.lrs = LearningRates(self.optimizer, self.scheduler)
        self.metric_names = MetricNames()  # the workload's own metrics, named by its first step
        #: each group's name, where the workload's optimizer has several: each group's LR is then reported
        self.lr_groups = group_names(self.optimizer) if workload.optimizer is not None and len(self.optimizer.param_groups) > 1 else None
        self.data = BatchStream(  # its workers and pinned memory are live options, set with the others below
            workload.dataset,
            batch_size=self.batch_size,
            collate_fn=workload.collate_fn,
            seed=config.seed,
            device=self.device,
            rank=self.ranks.rank if self.ranks else 0,
            world_size=self.world_size,
        )
        self.checkpointing = ActivationCheckpointing(self.model, workload.checkpoint_blocks)
        self.grad_probe = GradNormProbe(self.model)
        self.cadence = ProbeCadence(config.probe_every)
        self.checkpoint_cadence = CheckpointCadence(config.checkpoint_every)
        self.activation_probe = ActivationStatsProbe(self.model, self.grad_probe.module_names)
        self.memory_probe = MemoryProbe(self.model, self.checkpointing.wrapped_blocks)
        self.memory_cadence = MemoryCadence(config.memory_every)
        self.precisions = Precisions(self.device)  # keeps the fp16 GradScaler across modes and checkpoints
        self.precision: Precision = self.precisions.make("off")
        self.options = LiveOptions()
        self._compiled: torch.nn.Module | None = None  # the model as torch.compile runs it, while compile is on

        self.step = 0
        self.first_step_of_process = 1
        self._commands: queue.Queue[TrainerCommand] = queue.Queue()
        self._paused = False
        self._stop: StopCommand | None = None
        self._signalled_stop: StopCommand | None = None
        self._relaunch: WorldSizeChange | None = None
        self._scripted_through = 0  # the last step whose --at and --profile-at entries were queued
        self._probe_next = False  # rank 0's probe decision for the next step, shared with every rank
        self._figures_next = False  # likewise: whether the next report gathers the per-rank figures
        self._checkpoint_next = False  # likewise: whether a periodic checkpoint follows the next step
        self._figures_gathered_at = -math.inf
        self._trial_progress_at = -math.inf
        self._consecutive_skips = 0
        self._last_checkpoint_step: int | None = None
        self._publishing: WrittenCheckpoint | None = None  # a periodic checkpoint made durable on its thread
        self._started = time.monotonic()
        self._elapsed_before = 0.0  # training time of earlier processes of this run (resumed, relaunched)
        self._last_batch: Any = None
        self._resumed: ResumedFromCheckpoint | None = None  # reported when the run starts, once nothing more can fail

        initial = config.options
        if resume_from is not None:
            initial = self._restore(load_training_state(resume_from, map_location=self.device), config, explicit_options)
        elif self.ranks is not None and self.ranks.rank > 0:
            seed_rank(config.seed, 0, self.ranks.rank)  # same model and data as rank 0; its own dropout
        if initial.compile:
            # Compiling runs a batch through the model (with DDP, the wrapper made below) and takes seconds to
            # minutes: it happens at the first step boundary, where a failure is a refusal and training goes on
            # uncompiled, as for a change asked for later. Rank 0 takes it to every rank, as any command.
            initial = initial.with_value(COMPILE.name, False)
            if self.reports:
                self.submit(SetCommand(COMPILE.name, COMPILE.format(True), source="start"))
        self._enact_initial_options(initial)
        # DDP last: it registers its hooks on the parameters the optimizer already holds, and broadcasts
        # rank 0's weights. The loss function gets the wrapper (that is what averages the gradients).
        self.ddp = wrap_model(self.model, self.device) if self.ranks is not None else None
        self.forward_model: torch.nn.Module = self.ddp if self.ddp is not None else self.model
        self.rank_hosts = self.collectives.describe_ranks() if self.collectives is not None else None

    # ----------------------------------------------------------------- control API (any thread)
    def submit(self, command: TrainerCommand) -> None:
        """Queue a command; it is applied at the next optimizer-step boundary."""
        self._commands.put(command)

    def request_stop(self, reason: str) -> None:
        """Stop at the next boundary. Safe in a signal handler: one attribute store, no lock taken
        (``submit`` takes the queue's lock, which the interrupted main thread may hold)."""
        self._signalled_stop = StopCommand(reason)

    # ----------------------------------------------------------------- the loop
    def run(self) -> RunOutcome:
        if self._resumed is not None:
            self._emit(self._resumed)
        self._emit(RunStarted(
            step=self.step,
            device=str(self.device),
            batch_size=self.batch_size,
            steps=self.config.steps,
            options=self.options.as_dict(),
            modules=self.grad_probe.module_names,
            module_params=self.grad_probe.param_counts,
            module_tied=self.grad_probe.tied_names,
            checkpoint_blocks=list(self.checkpointing.blocks),
            from_workload=self.from_workload.as_dict() if self.from_workload else None,
            world_size=self.world_size,
            ranks=self.rank_hosts,
        ))
        self._started = time.monotonic()
        sampler = None
        if self.config.telemetry_interval > 0 and self.reports and self.samples_telemetry:
            sampler = TelemetrySampler(self.device, self._emit_telemetry, lambda: self.step, self.config.telemetry_interval)
            sampler.start()
        try:
            return self._run_loop()
        finally:
            if sampler is not None:
                sampler.stop()
            if self._profiling is not None:  # the run ended mid-recording: nothing complete to report
                self._profiling.abandon()
                self._profiling = None
            self._wait_for_profile_builds()  # a snapshot the user asked for is worth the wait

    def _wait_for_profile_builds(self) -> None:
        for builder in self._profile_builds:
            builder.join()
        self._profile_builds.clear()

    def _run_loop(self) -> RunOutcome:
        try:
            try:
                while self.step < self.config.steps and self.train_steps(1):
                    pass
            finally:  # a checkpoint that failed did so before what ended the loop: its StorageError wins
                self._finish_checkpoint()
        except NonFiniteError as error:
            self._emit(p.NonFinite(message=str(error), **error.report))
            return RunOutcome(RunStatus.NONFINITE, self.step, str(error))
        except WorkloadError as error:
            self._emit(p.Error(step=self.step + 1, message=str(error), traceback=traceback.format_exc()))
            raise
        except Exception as error:
            if self.ranks is not None and self.ranks.supervised:
                raise  # the supervisor reports it with the rank it happened on (and stops the other ranks)
            return self._failed(error)
        # A profile still being built holds its files (a trace of a few MB): on a disk near full, the last
        # checkpoint is written once the build is done, and a build that failed has removed what it wrote.
        self._wait_for_profile_builds()
        try:
            if self._relaunch is not None:
                self._save_checkpoint(reason="world_size")  # always: the options changed since any earlier one
                return RunOutcome(RunStatus.RELAUNCH, self.step, relaunch=self._relaunch)
            if self._last_checkpoint_step != self.step and self.step > 0:
                self._save_checkpoint(reason="final")
        except StorageError as error:  # the last checkpoint could not be written: the run failed, said as such
            if self.ranks is not None and self.ranks.supervised:
                raise
            return self._failed(error)
        status = RunStatus.STOPPED if self._stop is not None else RunStatus.FINISHED
        self._emit(RunEnded(step=self.step, status=status))
        return RunOutcome(status, self.step, self._stop.reason if self._stop else "")

    def _failed(self, error: Exception) -> RunOutcome:
        """Report an error that ended the run, and keep the last completed step if it is not saved yet."""
        message = str(error) if isinstance(error, StorageError) else f"{type(error).__name__}: {error}"
        trace = "" if isinstance(error, StorageError) else traceback.format_exc()  # a full disk: the message is all
        try:
            self._emit(p.Error(step=self.step + 1, message=message, traceback=trace))
            if self.step > 0 and self._last_checkpoint_step != self.step and self.ranks is None:
                # The last completed step is intact. Not with ranks: the others may be gone, and a
                # checkpoint takes every rank (their RNG states); the last one written stays as it was.
                self._save_checkpoint(reason="error")
        except StorageError as storage:  # the disk that failed may fail again; the app still got the error
            if str(storage) != message:
                message = f"{message} (then: {storage})"
        return RunOutcome(RunStatus.FAILED, self.step, message, error=type(error))

    def train_steps(self, count: int) -> bool:
        """Apply queued commands and train up to ``count`` optimizer steps; False once a stop was requested.

        ``run()`` is this in a loop with error handling and reporting around it; benchmarks call it
        directly to interleave the engine with other code. Errors propagate as they are.
        """
        for _ in range(count):
            self._at_step_boundary()
            if self._stop is not None or self._relaunch is not None:
                return False
            self._train_one_step()
            self._after_step()
        return True

    def _train_one_step(self) -> None:
        """One optimizer step, read top to bottom; its one host transfer is its only synchronisation point."""
        step = self.step + 1
        options = self.options  # commands change them only between steps: fixed for this one
        started = time.perf_counter()
        is_report = self._is_report_step(step)
        sample_activations = is_report and self.config.act_stats_every > 0 and step % self.config.act_stats_every == 0
        # Rank 0 reports memory (every rank holds alike); never under the profiler, whose trace would show the hooks,
        # nor on a compiled run's step that runs uncompiled (its activations are not the compiled model's).
        measure_memory = (is_report and self.reports and self._profiling is None and not self._runs_eagerly(sample_activations)
                          and self.memory_cadence.due(step))
        graphs = compiled_graphs() if self._compiled is not None else None

        loss, metrics, data_wait, activations, saved = self._forward_backward(step, options.accum, sample_activations, measure_memory)
        gradients_bytes = self.memory_probe.gradients_bytes() if saved is not None else 0
        self.precision.unscale_(self.optimizer)  # fp16: true-scale gradients before they are measured or clipped
        if self.collectives is not None:  # every rank then sees the same loss and stops on the same NaN
            loss, metrics = self.collectives.mean_loss(loss, metrics)
        # With ranks, rank 0's cadence decides for all (shared at the boundary), so a non-finite gradient
        # is seen by every rank at the same step.
        probe_due = is_report and (self._probe_next if self.collectives is not None else self.cadence.should_probe(step))
        norms, clipped = self._measure_and_clip(step, probe_due, options.clip)

        # One host transfer for everything this step reports. On CUDA this is the step's sync point.
        transfer = HostTransfer()
        transfer.add("loss", loss)
        transfer.add("grad_norm_total", norms.total if norms is not None else None)
        transfer.add("clipped", clipped)
        transfer.add("grad_norms", norms.per_module if probe_due and norms is not None else None)
        transfer.add("act_stats", activations)
        transfer.add("metrics", metrics)
        host = transfer.to_host()
        loss, total_norm = host.scalar("loss"), host.scalar("grad_norm_total")

        # NaN/Inf stops the run before the optimizer step, so the weights and the last checkpoint stay
        # good; under fp16 it is routine overflow, and the precision skips the step instead.
        finite = math.isfinite(loss) and (total_norm is None or math.isfinite(total_norm))
        if not finite and not self.precision.tolerates_nonfinite:
            self._raise_nonfinite(step, loss, total_norm)

        lrs_used = [group["lr"] for group in self.optimizer.param_groups]  # before the schedule moves them on
        stepped = self._optimizer_step(step)
        step_time = time.perf_counter() - started  # the step's own time: reporting it is not part of it
        self.cadence.record_step(step_time)
        if not is_report:
            return
        # torch.compile compiled again in this step (a guard failed): its time is compile time, not training's.
        compiling = graphs is not None and compiled_graphs() != graphs
        memory = None
        if saved is not None:
            memory = self.memory_probe.breakdown(step, saved, gradients_bytes, self.optimizer, self.device)
            self.memory_cadence.measured()

        grad_norms, act_stats, metric_values = host.vector("grad_norms"), host.vector("act_stats"), host.vector("metrics")
        self._report(StepReport(
            step=step,
            options=options,
            loss=loss,
            lr=lrs_used[0],
            stepped=stepped,
            grad_norm_total=total_norm,
            clipped=host.flag("clipped"),
            grad_norms=dict(zip(self.grad_probe.module_names, grad_norms)) if grad_norms is not None else None,
            act_stats=stats_by_module(self.activation_probe.module_names, act_stats) if act_stats is not None else None,
            step_time_s=step_time,
            data_wait_s=data_wait,
            memory=memory,
            metrics=dict(zip(self.metric_names.names, metric_values)) if metric_values is not None else None,
            lrs=dict(zip(self.lr_groups, lrs_used)) if self.lr_groups is not None else None,
            compiling=compiling,
            ran_eagerly=self._runs_eagerly(sample_activations),
        ))

    def _forward_backward(
        self, step: int, accum: int, sample_activations: bool, measure_memory: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None, float, torch.Tensor | None, SavedTensorCount | None]:
        """Forward and backward over ``accum`` micro-batches, each loss divided by ``accum`` so that the
        gradients are those of the mean. Returns the mean loss (fp32, on the device: no sync), the mean of the
        workload's own metrics (a vector in ``metric_names`` order, on the device; None without any), the seconds
        spent waiting for data, the activation statistics (on the device) when this step samples them, and
        what the first micro-batch's forward saved for backward when this step measures memory.

        With one micro-batch (the common case) nothing is divided or summed: each such op is an autograd
        node or a kernel, ~20 us of a 10 ms step on a CPU."""
        if sample_activations:
            self.activation_probe.attach()  # hooks only on sampled steps: on every step they cost ~35 %
        model = self._eager_model() if self._runs_eagerly(sample_activations) else self.forward_model
        losses, metrics = [], []
        data_wait = 0.0
        saved = None
        for micro in range(accum):
            waited = time.perf_counter()
            batch = self.data.next_batch()
            data_wait += time.perf_counter() - waited
            self._last_batch = batch  # the non-finite guard replays it
            # With ranks, gradients are averaged once per optimizer step: on the last micro-batch's backward.
            syncing = self.ddp is None or micro == accum - 1
            with contextlib.nullcontext() if syncing else self.ddp.no_sync():
                if measure_memory and micro == 0:
                    with self.memory_probe.counting_saved_tensors() as saved:
                        loss, named = self._compute_loss(batch, step, model)
                else:
                    loss, named = self._compute_loss(batch, step, model)
                self.precision.backward(loss / accum if accum > 1 else loss)
            losses.append(loss.detach())
            metrics.append(self.metric_names.stack(named, describe_code(self.workload.loss_fn), step))
        mean_loss = losses[0].float() if accum == 1 else torch.stack(losses).float().mean()
        mean_metrics = None
        if metrics[0] is not None:
            mean_metrics = metrics[0] if accum == 1 else torch.stack(metrics).mean(dim=0)
        activations = self.activation_probe.detach() if sample_activations else None
        return mean_loss, mean_metrics, data_wait, activations, saved

    def _runs_eagerly(self, sample_activations: bool) -> bool:
        """Whether this step runs the model uncompiled although compile is on: a step that samples activation
        statistics does, because hooks added to a compiled model do not fire (torch.compile traced the modules
        without them). Its time is left out of the impact medians."""
        return sample_activations and self._compiled is not None

    def _measure_and_clip(self, step: int, probe_due: bool, clip: float | None) -> tuple[GradNorms | None, torch.Tensor | None]:
        """Gradient norms on the device: measured when the probe is due, and always when clipping needs
        them (then the probe costs nothing more); clipping reuses them rather than read the gradients again.
        Returns the norms (None: not measured, or no gradient) and whether clipping fired (a device bool)."""
        if not probe_due and clip is None:
            return None, None
        probe_started = time.perf_counter()
        norms = self.grad_probe.measure()
        if probe_due and norms is not None:
            self.cadence.record_probe(step, time.perf_counter() - probe_started)  # the cadence follows its cost
        clipped = clip_by_total_norm(norms, clip) if clip is not None and norms is not None else None
        return norms, clipped

    def _optimizer_step(self, step: int) -> bool:
        """The optimizer step (which the precision may skip: fp16 overflow), then the LR schedule's; from
        here ``self.step`` is ``step``. Returns whether the optimizer stepped."""
        stepped = self._step_optimizer_and_schedule()
        self.step = step
        if not stepped:
            self._count_skip(step)
        else:
            self._consecutive_skips = 0
        return stepped

    def _step_optimizer_and_schedule(self) -> bool:
        """What a training step and a trial's step both end with; False where the precision skipped the step."""
        stepped = self.precision.step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        self.lrs.step(self.options.lr_scale)  # the live scale multiplies whatever the schedule set
        return stepped

    def _report(self, report: StepReport) -> None:
        """A report step: the per-rank figures when due (a collective: every rank takes part), then rank 0
        writes the metrics record and sends it to the observers."""
        rank_figures = None
        if self.collectives is not None and self._figures_next:
            rank_figures = self.collectives.gather_figures(report.step_time_s, report.data_wait_s)
            self._figures_gathered_at = time.monotonic()
        if not self.reports:
            return
        record: dict[str, Any] = {
            "step": report.step,
            "time": time.time(),
            "elapsed_s": round(self._elapsed(), 3),
            "epoch": self.data.position.epoch,
            "loss": report.loss,
            "lr": report.lr,
            # The global batch, all ranks together.
            "samples_per_s": self.batch_size * report.options.accum / report.step_time_s,
            "step_time_s": report.step_time_s,
            "grad_norm_total": report.grad_norm_total,
            "clipped": report.clipped,
            "grad_norms": report.grad_norms,
            "skipped": not report.stepped,
            "data_wait_s": report.data_wait_s,
            **report.options.as_dict(),
        }
        if report.lrs is not None:
            record["lrs"] = report.lrs
        if report.metrics is not None:
            record["metrics"] = report.metrics
        if report.compiling:
            record["compiling"] = True
        if report.ran_eagerly:
            record["eager"] = True
        if report.act_stats is not None:
            record["act_stats"] = report.act_stats
        if report.memory is not None:
            record["memory"] = report.memory
        if rank_figures is not None:
            record["ranks"] = rank_figures
        if self._is_eval_step(report.step):
            record["val_loss"], val_metrics = self._evaluate()  # rank 0 alone, on the model without its DDP wrapper
            if val_metrics is not None:
                record["val_metrics"] = val_metrics
        self._emit_metrics(record)

    def _compute_loss(self, batch: Any, step: int, model: torch.nn.Module | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The workload's loss for one micro-batch (through ``model``, by default the one steps run), and its own
        metrics (core/engine/loss_output.py); on the first step, failures name the user's code."""
        try:
            with self.precision.autocast():
                output = self.workload.loss_fn(model if model is not None else self.forward_model, batch)
        except Exception as error:
            # Out of memory is a resource problem, not a model that cannot eat its batch: say it as is.
            if step != self.first_step_of_process or out_of_memory(error):
                raise
            frame = user_frame(error.__traceback__)
            where = f"{frame.filename}:{frame.lineno} in {frame.name}()" if frame else describe_code(self.workload.loss_fn)
            raise WorkloadError(
                f"{where}: the first training step failed: {type(error).__name__}: {error}. "
                f"The model cannot train on the batches its dataset gives (batch: {_describe_batch(batch)})."
            ) from error
        loss, metrics = read_loss_output(output, describe_code(self.workload.loss_fn), self.device)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
            got = f"a tensor of shape {list(loss.shape)} and dtype {loss.dtype}" if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise WorkloadError(
                f"{describe_code(self.workload.loss_fn)}: loss_fn must return a scalar floating-point tensor, "
                f"got {got} (reduce it, e.g. with .mean())."
            )
        if not loss.requires_grad:
            raise WorkloadError(
                f"{describe_code(self.workload.loss_fn)}: the loss does not require grad, so nothing can train "
                f"(was it computed under torch.no_grad(), or detached?)."
            )
        return loss, metrics

    def _loss_alone(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        """The loss ``loss_fn`` gives on ``batch``, its metrics (if it returns a mapping) left out: for the
        passes that only backpropagate it, the compile at a boundary and the non-finite guard's replay."""
        loss, _ = read_loss_output(self.workload.loss_fn(model, batch), describe_code(self.workload.loss_fn), self.device)
        return loss

    def _raise_nonfinite(self, step: int, loss_value: float, total_norm: float | None) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        batch = self._last_batch

        def replay() -> torch.Tensor:
            with self.precision.autocast():
                return self._loss_alone(self.model, batch)

        report = localise_nonfinite(self.model, replay, batch)
        self.optimizer.zero_grad(set_to_none=True)
        report.update(step=step, loss=loss_value, grad_norm_total=total_norm)
        where = f" in {report['module']}" if report["module"] else ""
        raise NonFiniteError(
            f"step {step}: non-finite {'loss' if not math.isfinite(loss_value) else 'gradient'} "
            f"({report['phase']}{where}): {report['detail']}",
            report,
        )

    def _count_skip(self, step: int) -> None:
        self._consecutive_skips += 1
        self._emit(StepSkipped(step=step, **self.precision.skipped_step()))
        if self._consecutive_skips >= MAX_CONSECUTIVE_FP16_SKIPS:
            self._raise_nonfinite(step, math.nan, None)

    def _after_step(self) -> None:
        self._finish_checkpoint()  # started after the step before (when no metrics row waited for it)
        if self._profiling is not None and self._profiling.after_step(self.step):
            self._profile_builds.append(self._profiling.builder)
            self._profiling = None
        due = self._checkpoint_next if self.collectives is not None else self.checkpoint_cadence.due(self.step)
        if due and self.step < self.config.steps:
            self._save_checkpoint(reason="periodic")

    def _is_report_step(self, step: int) -> bool:
        return step % self.config.log_every == 0 or step == self.config.steps

    def _is_eval_step(self, step: int) -> bool:
        every = self.config.eval_every
        return self.workload.val_dataset is not None and every > 0 and (step % every == 0 or step == self.config.steps)

    def _evaluate(self) -> tuple[float, dict[str, float] | None]:
        """The mean loss over the validation batches, and the workload's own metrics over them; one host
        transfer for both."""
        self.model.eval()
        where = describe_code(self.workload.loss_fn)
        total, count = torch.zeros((), device=self.device), 0
        metric_totals: torch.Tensor | None = None
        try:
            with torch.inference_mode(), self.precision.autocast():
                for batch in evaluation_batches(
                    self.workload.val_dataset,
                    batch_size=self.batch_size,
                    collate_fn=self.workload.collate_fn,
                    limit=self.config.eval_batches,
                    device=self.device,
                ):
                    loss, named = read_loss_output(self.workload.loss_fn(self.model, batch), where, self.device)
                    total += loss.float()
                    metrics = self.metric_names.stack(named, where, self.step)
                    if metrics is not None:
                        metric_totals = metrics if metric_totals is None else metric_totals + metrics
                    count += 1
        finally:
            self.model.train()
        if metric_totals is None:
            return total.item() / max(count, 1), None
        values = torch.cat([total.reshape(1), metric_totals]).tolist()
        return values[0] / max(count, 1), {name: value / max(count, 1) for name, value in zip(self.metric_names.names, values[1:])}

    # ----------------------------------------------------------------- options and commands
    def _at_step_boundary(self) -> None:
        next_step = self.step + 1
        # A relaunched run has already queued the scripted entries of the boundary it was relaunched at.
        if self.reports and next_step > self._scripted_through:
            for change in self.config.at:
                if change.step == next_step:
                    self.submit(SetCommand(change.option, change.value, source="--at"))
            for trial in self.config.trials:  # after the changes of this boundary: tried from where they leave it
                if trial.step == next_step:
                    self.submit(TrialCommand(trial.option, trial.value, self.config.trial_steps, source="--trial"))
            if next_step in self.config.profile_at:
                self.submit(ProfileCommand(self.config.profile_steps, source="--profile-at"))
        self._scripted_through = max(self._scripted_through, next_step)
        unsent: list[TrainerCommand] = []
        while True:
            commands = self._take_commands() if self.reports else []
            more = False
            if self.collectives is not None:
                commands, more = self._share_commands(unsent + commands, unsent)
            for command in commands:
                # The checkpoint of the step before is reported before what the command does (paused at
                # step 46 comes after step 46's checkpoint), and never left waiting for a pause to end.
                self._finish_checkpoint()
                self._handle(command)
            waiting = self._paused and self._stop is None and self._relaunch is None
            if not waiting and not more:
                return

    def _take_commands(self) -> list[TrainerCommand]:
        """What is queued; while paused, wait up to 0.25 s for the first. A signalled stop goes last."""
        commands: list[TrainerCommand] = []
        if self._signalled_stop is None:
            waiting = self._paused and self._stop is None and self._relaunch is None
            try:
                commands.append(self._commands.get(block=waiting, timeout=0.25))
                while True:
                    commands.append(self._commands.get_nowait())
            except queue.Empty:
                pass
        if self._signalled_stop is not None:
            commands.append(self._signalled_stop)
        return commands

    def _share_commands(self, commands: list[TrainerCommand], unsent: list[TrainerCommand]) -> tuple[list[TrainerCommand], bool]:
        """Rank 0's commands (as many as fit one packet; ``unsent`` keeps the rest) to every rank, with
        rank 0's decisions whether the next step measures gradient norms and is followed by a periodic
        checkpoint (every rank takes part in one). Returns the commands and whether more packets follow
        at this boundary."""
        payload = None
        if self.reports:
            # Per-rank figures are for a live table (latest wins): gathered on report steps, at most
            # every RANK_FIGURES_INTERVAL_S, not at the price of one more collective on every step.
            next_step = self.step + 1
            figures = self._is_report_step(next_step) and time.monotonic() - self._figures_gathered_at >= RANK_FIGURES_INTERVAL_S
            payload = {"probe": self.cadence.should_probe(next_step), "figures": figures,
                       "checkpoint": self.checkpoint_cadence.due(next_step), "commands": []}
            unsent.clear()
            for index, command in enumerate(commands):
                payload["commands"].append(command.json_text())  # the protocol's own line
                if len(encode_packet({**payload, "more": True})) > PACKET_BYTES:
                    payload["commands"].pop()
                    unsent.extend(commands[index:])
                    break
            payload["more"] = bool(unsent)
        packet = self.collectives.share(payload)
        self._probe_next = bool(packet["probe"])
        self._figures_next = bool(packet["figures"])
        self._checkpoint_next = bool(packet["checkpoint"])
        return [trainer_command(line) for line in packet["commands"]], bool(packet["more"])

    def pending_commands(self) -> list[TrainerCommand]:
        """Commands still queued (after the run ended): a supervisor hands them to the next trainer."""
        commands: list[TrainerCommand] = []
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands

    def _handle(self, command: TrainerCommand) -> None:
        next_step = self.step + 1
        match command:
            case SetCommand():
                self._set_option(command, next_step)
            case PauseCommand() if not self._paused:
                self._paused = True
                self._emit(Paused(step=self.step))
            case ResumeCommand() if self._paused:
                self._paused = False
                self._emit(Resumed(step=next_step))
            case StopCommand():
                self._stop = command
                self._paused = False
                if self._relaunch is not None:  # a stop wins over a relaunch asked for at the same boundary
                    change, self._relaunch = self._relaunch, None
                    self.options = self.options.with_value("world_size", self.world_size)
                    self._emit(p.OptionRefused(step=next_step, option=WORLD_SIZE.name, value=change.value,
                                             reason="the run stops at this step", source=change.source))
            case SaveCheckpointCommand() if self.step > 0:
                self._save_checkpoint(reason="requested")
            case ProfileCommand() if self.reports:  # one profile per run: rank 0's
                self._start_profile(command, next_step)
            case TrialCommand():
                self._run_trial(command, next_step)  # every rank: their steps' collectives pair up

    # ----------------------------------------------------------------- controlled trials
    def _run_trial(self, command: TrialCommand, step: int) -> None:
        """Two arms of ``command.steps`` steps from this boundary's state on the same batches, the option changed
        and as it is; then the state as it was (core/engine/trials.py). Answered by one TrialResult."""

        def answer(arms: list, error: str | None = None) -> None:
            self._emit(p.TrialResult(step=step, option=command.option, value=_jsonable(command.value), steps=command.steps,
                                     arms=arms, error=error, source=command.source))

        try:
            option = live_option(command.option)
            value = self._for_this_device(option, option.parse(command.value))
        except OptionRefused as refusal:
            return answer([], str(refusal))
        if option.name in NOT_TRIED:
            return answer([], NOT_TRIED[option.name])
        if not 1 <= command.steps <= MAX_TRIAL_STEPS:
            return answer([], f"a trial runs 1 to {MAX_TRIAL_STEPS} steps an arm, got {shown(command.steps)}")
        if self._profiling is not None:
            return answer([], "a profile is recording; try again once it is ready")
        if self.collectives is not None and self.step > 0 and self._last_checkpoint_step != self.step:
            # With ranks an arm that runs out of memory on one rank stops the run (TrialOutOfMemory): saved
            # here, it resumes from this step, as if the trial had not run.
            self._save_checkpoint(reason="trial")
        before = self.options
        snapshot = TrainingSnapshot.take(self.model, self.optimizer, self.scheduler, self.precisions.state_dict(), self.data.position)

        def put_back() -> None:
            self.options = before
            self._enact(option, getattr(before, option.name))
            snapshot.restore(self.model, self.optimizer, self.scheduler)
            self.lrs.read_schedule()
            self.precisions.restore(snapshot.grad_scaler)
            self.data.restore(snapshot.data)
            self._apply_lr_scale()

        try:
            self._enact(option, value)
        except OptionRefused as refusal:
            put_back()
            return answer([], f"{option.name}={option.format(value)} cannot run here: {refusal}")
        self._emit(TrialStarted(step=step, option=option.name, value=_jsonable(value), steps=command.steps, source=command.source))
        arms, changed = [], f"{option.name}={option.format(value)}"
        for arm, label in enumerate((changed, AS_IT_IS), start=1):
            record = ArmRecord(label)
            self._report_trial_progress(TrialProgress(step=step, label=changed, arm=arm, done=0, steps=command.steps), now=True)
            neighbours = OthersCpuMeter()
            neighbours.start()
            try:
                if label != AS_IT_IS:
                    self.options = before.with_value(option.name, value)
                    self._apply_lr_scale()
                for index in range(command.steps):
                    self._trial_step(record, index)
                    self._report_trial_progress(TrialProgress(step=step, label=changed, arm=arm, done=index + 1, steps=command.steps))
            except TrialStopped as stopped:
                record.error = str(stopped)
            except Exception as error:
                if not out_of_memory(error):
                    raise
                if self.collectives is not None:  # the other ranks wait inside this step's collectives
                    saved = None if self.checkpoint_dir is None else step - 1
                    raise TrialOutOfMemory(label, len(record.losses) + 1, command.steps, self.world_size, saved, error) from error
                record.error = f"out of memory: {str(error).splitlines()[0]}"
            finally:
                record.others_cpu_percent = neighbours.stop()
                put_back()
            arms.append(record.result())
        answer(arms)

    def _report_trial_progress(self, progress: TrialProgress, now: bool = False) -> None:
        """At most every ``TRIAL_PROGRESS_INTERVAL_S`` (an arm's start at once): the app's header and the bar
        say how far a trial is, which no step report does while one runs. Rank 0 reports for every rank."""
        if not self.reports:
            return
        clock = time.monotonic()
        if now or clock - self._trial_progress_at >= TRIAL_PROGRESS_INTERVAL_S:
            self._trial_progress_at = clock
            self._emit(progress)

    def _trial_step(self, record: ArmRecord, index: int) -> None:
        """One optimizer step of a trial's arm: ``_train_one_step`` without its report (nothing is written,
        the step counter stays), timed, its loss read, memory measured on its ``MEMORY_STEP``."""
        step, options = self.step + 1, self.options
        measure_memory = index == MEMORY_STEP and self.reports
        started = time.perf_counter()
        loss, _, _, _, saved = self._forward_backward(step, options.accum, False, measure_memory)
        gradients_bytes = self.memory_probe.gradients_bytes() if saved is not None else 0
        self.precision.unscale_(self.optimizer)
        if self.collectives is not None:
            loss, _ = self.collectives.mean_loss(loss, None)
        self._measure_and_clip(step, False, options.clip)  # clips where clipping is on; no probe
        value = loss.item()  # a trial reports every loss: one transfer a step, as training's own
        if not math.isfinite(value) and not self.precision.tolerates_nonfinite:
            raise TrialStopped(f"the loss became {value} at its step {index + 1}")
        self._step_optimizer_and_schedule()
        elapsed = time.perf_counter() - started
        record.losses.append(value)
        if index not in (0, MEMORY_STEP):  # the first pays the change's one-off costs, the other the memory hooks
            record.step_times.append(elapsed)
        if saved is not None:
            record.memory = self.memory_probe.breakdown(step, saved, gradients_bytes, self.optimizer, self.device)

    def _start_profile(self, command: ProfileCommand, step: int) -> None:
        reason = None
        if self._profiling is not None:
            reason = f"a profile is already recording (from step {self._profiling.first_step})"
        elif self.profiles_dir is None:
            reason = "this run has no directory to write profiles to"
        elif not 1 <= command.steps <= MAX_PROFILE_STEPS:
            reason = f"profile steps must be from 1 to {MAX_PROFILE_STEPS}, got {shown(command.steps)}"
        if reason is not None:
            self._emit(p.OptionRefused(step=step, option="profile", value=command.steps, reason=reason, source=command.source))
            return
        self._profiling = ProfilerSnapshot(
            self.device, self.profiles_dir / f"{step:07d}", step, command.steps, on_ready=self._profile_ready,
        )
        self._emit(ProfileStarted(step=step, steps=command.steps, warmup=1, source=command.source))

    def _profile_ready(self, report: dict[str, Any]) -> None:
        """Called on the profiler's background thread once the tables are written."""
        self._emit(p.ProfileReady(**report))

    def _set_option(self, command: SetCommand, step: int) -> None:
        try:
            option = live_option(command.option)
            value = self._for_this_device(option, option.parse(command.value))
            previous = getattr(self.options, option.name)
            outcome = self._enact(option, value)
        except OptionRefused as refusal:
            self._emit(p.OptionRefused(
                step=step, option=command.option, value=_jsonable(command.value), reason=str(refusal), source=command.source,
            ))
            return
        self.options = self.options.with_value(option.name, value)
        if outcome is False:
            # A new world size takes new processes: checkpoint and end with "relaunch" after this boundary;
            # the supervisor acknowledges the change once the new ranks train.
            self._relaunch = WorldSizeChange(value, self.world_size, step, command.source)
            return
        if self.device.type == "cuda":  # each option segment reports its own peak memory
            torch.cuda.reset_peak_memory_stats(self.device)
        self._emit(p.OptionApplied(
            step=step, option=option.name, value=value, previous=previous, display=option.format(value), source=command.source,
            detail=outcome if isinstance(outcome, str) else "",
        ))

    def _enact(self, option: LiveOption, value: Any) -> bool | str | None:
        """Make ``option=value`` real on this run with the option's hook, or raise OptionRefused without
        changing anything. False: the change is not in force yet (it takes a relaunch); a string: what the
        change did, said with its acknowledgement ("compiled in 21.3 s")."""
        return _ENACT_HOOKS[option.name](self, value)

    def _for_this_device(self, option: LiveOption, value: Any) -> Any:
        """``value``, or for pin_memory's ``auto`` (None) what it is on this run's device: on with CUDA, off
        elsewhere, as the DataLoader always had it before it was a live option."""
        if option is PIN_MEMORY and value is None:
            return self.device.type == "cuda"
        return value

    def _enact_initial_options(self, options: LiveOptions) -> None:
        if options.world_size != self.world_size:
            raise ConfigError(
                f"world_size (--world-size) {options.world_size}: this process trains as one of {self.world_size}; "
                f"ranks are started by torchlab-tui's supervisor or by torchrun."
            )
        options = options.with_value(PIN_MEMORY.name, self._for_this_device(PIN_MEMORY, options.pin_memory))
        for option, value in options.items():
            try:
                self._enact(option, value)
            except OptionRefused as refusal:
                raise ConfigError(f"{option.name} ({option.flag}) {option.format(value)}: {refusal}.") from None
        self.options = options

    # ----------------------------------------------------------------- each live option's hook
    # One per option of the registry (core/wire/options.py), called at a step boundary with the parsed
    # value before ``self.options`` changes; it raises OptionRefused for what this run cannot do, having
    # changed nothing. Returning False: not in force yet (the world size, after a relaunch).

    @enacts(AMP)
    def _enact_amp(self, mode: str) -> str | None:
        precision = self.precisions.make(mode)
        compiled = None
        if self._compiled is not None and mode != self.precision.name:
            # Autocast is part of what a compiled graph assumes: compile for the new precision now, not in a step.
            compiled = self._compile_now(self._compiled, precision, f"with amp={mode}")
        self.precision = precision
        return compiled

    @enacts(CHECKPOINTING)
    def _enact_checkpointing(self, on: bool) -> str | None:
        if on and not self.checkpointing.blocks:
            raise OptionRefused(
                "this model has no checkpoint blocks (no ModuleList/Sequential with several children); "
                "name them in Workload.checkpoint_blocks"
            )
        was_on = bool(self.checkpointing.wrapped_blocks())
        self.checkpointing.enable() if on else self.checkpointing.disable()
        if self._compiled is None or on == was_on:
            return None
        try:  # the blocks' forward changed under the compiled graph: compile the model with it now, not in a step
            return self._compile_now(self._compiled, self.precision, f"with checkpointing={CHECKPOINTING.format(on)}")
        except OptionRefused:
            self.checkpointing.disable() if on else self.checkpointing.enable()
            raise

    @enacts(COMPILE)
    def _enact_compile(self, on: bool) -> str | None:
        """The model the steps run: torch.compile's (of the DDP wrapper with ranks, as PyTorch advises, so that
        its graphs break at DDP's gradient buckets), or the model itself. ``self.model`` is never replaced:
        checkpoints, evaluation and the non-finite guard use it as it is (core/engine/compiling.py)."""
        if not on:
            if self._compiled is not None:
                self._compiled, self.forward_model = None, self._eager_model()
            return None
        if self._compiled is not None:
            return None
        compiled = compile_model(self._eager_model())
        said = self._compile_now(compiled, self.precision, "")
        self._compiled, self.forward_model = compiled, compiled
        return said

    @enacts(WORKERS)
    def _enact_workers(self, workers: int) -> str | None:
        if workers == self.data.workers:
            return None
        self.data.configure(workers=workers)
        return self._loader_restarts()

    @enacts(PIN_MEMORY)
    def _enact_pin_memory(self, pinned: bool) -> str | None:
        if pinned and self.device.type != "cuda":
            raise OptionRefused(
                f"pinned memory speeds up copies of batches from the host to a CUDA device; this run trains on "
                f"{self.device.type}, where batches are not copied"
            )
        if pinned == self.data.pin_memory:
            return None
        self.data.configure(pin_memory=pinned)
        return self._loader_restarts()

    def _eager_model(self) -> torch.nn.Module:
        """What the loss function gets when nothing is compiled: the DDP wrapper with ranks, else the model."""
        return self.ddp if self.ddp is not None else self.model

    def _loader_restarts(self) -> str:
        position = self.data.position
        return f"the data loader starts again at sample {position.samples:,} of epoch {position.epoch}"

    def _compile_now(self, compiled: torch.nn.Module, precision: Precision, what: str) -> str:
        """Compile ``compiled``'s forward and backward at this boundary on a batch (the last step's, or the
        next one, left for the step), changing nothing else (core/engine/compiling.py); say how long it took,
        or raise OptionRefused with torch.compile's reason."""
        batch = self._last_batch if self._last_batch is not None else self.data.peek_batch()
        self._emit(CompileStarted(step=self.step + 1, detail=what))  # seconds to minutes: say why training waits

        def forward_and_backward() -> None:
            with precision.autocast():
                loss = self._loss_alone(compiled, batch)
            loss.backward()

        try:
            seconds = compile_on_batch(self.model, forward_and_backward)
        except Exception as error:  # whatever stops the compiled model from training: the change is refused
            raise OptionRefused(f"torch.compile could not compile this model{' ' + what if what else ''}: "
                                f"{failure_reason(error)}; it trains on as it was") from None
        return f"compiled{' ' + what if what else ''} in {seconds:.1f} s, outside the step times"

    @enacts(CLIP)
    def _enact_clip(self, max_norm: float | None) -> None:
        """Read at each step (``_train_one_step``): nothing to change here."""

    @enacts(ACCUM)
    def _enact_accum(self, micro_steps: int) -> None:
        """Read at each step (``_train_one_step``): nothing to change here."""

    @enacts(LR_SCALE)
    def _enact_lr_scale(self, scale: float) -> None:
        self._apply_lr_scale(scale)

    @enacts(STEPS)
    def _enact_steps(self, total: int) -> str | None:
        """Train to step ``total``: the loop, the final evaluation and checkpoint follow ``self.config.steps``;
        the schedule re-plans from here as a resume with ``--steps`` does (core/engine/schedule.py). A workload's
        own scheduler, built again for the new total, may set another LR here: that is said, not left to be
        found in the chart."""
        if total == self.config.steps:
            return None
        if total < self.step:
            raise OptionRefused(f"the run is at step {self.step} already: train to step {self.step} or later")
        extensions = self.config.schedule_extensions
        if not extensions or extensions[-1][0] != self.step:  # a second change at one boundary keeps the first's
            extensions = (*extensions, (self.step, self.config.steps))
        try:
            config = dataclasses.replace(self.config, steps=total, schedule_extensions=extensions,
                                         warmup_steps=self.config.resolved_warmup_steps)  # the warm-up stays where it is
        except ConfigError as error:
            raise OptionRefused(str(error).rstrip(".")) from None
        before = self.lrs.scheduled[0] * self.options.lr_scale
        self.scheduler = replan_schedule(self.scheduler, self.optimizer, config, self.workload, self.step)
        self.lrs = LearningRates(self.optimizer, self.scheduler)
        self.lrs.apply(self.options.lr_scale)
        self.config = config
        after = self.lrs.scheduled[0] * self.options.lr_scale
        if self.workload.scheduler is None or math.isclose(before, after, rel_tol=1e-3):
            return None
        groups = group_names(self.optimizer)
        group = f" (group {groups[0]})" if len(groups) > 1 else ""
        return f"the workload's scheduler, built for {total:,} steps, moves the LR{group} {before:.1e} → {after:.1e}"

    @enacts(WORLD_SIZE)
    def _enact_world_size(self, size: int) -> bool:
        if size == self.world_size:
            return True
        if self.ranks is not None and not self.ranks.supervised:
            raise OptionRefused(
                f"the world size is fixed by the launcher that started these ranks (torchrun); to train with "
                f"{size}, stop the run and start it again with --nproc-per-node and --resume"
            )
        check_world_size(size, device=self.device, batch_size=self.batch_size)
        if not self.can_relaunch:
            raise OptionRefused(
                "this trainer has no supervisor to relaunch it with another world size (or no checkpoint "
                "directory to relaunch from)"
            )
        return False

    def _apply_lr_scale(self, scale: float | None = None) -> None:
        """The schedule's LR times ``scale`` (by default the one in force), on every parameter group."""
        self.lrs.apply(self.options.lr_scale if scale is None else scale)

    # ----------------------------------------------------------------- checkpoints
    def _save_checkpoint(self, reason: str) -> None:
        """Every rank calls this at the same step (its RNG state is part of the checkpoint); rank 0 writes.

        A periodic checkpoint is written here, and made durable (fsyncs, renames: waiting on the disk) on a
        thread while the next step trains; that step waits for it before its metrics row (``_finish_checkpoint``),
        so a checkpoint that fails stops the run before another row is written, as one written at once does.
        The others (final, requested, relaunch, error) are made durable here."""
        self._finish_checkpoint()  # one at a time, in step order
        if self.checkpoint_dir is None:
            return
        started = time.perf_counter()
        rng = capture_rng_state()
        rng_by_rank = self.collectives.gather_objects(rng) if self.collectives is not None else None
        self._last_checkpoint_step = self.step
        if not self.reports:
            return
        state = {
            "step": self.step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "grad_scaler": self.precisions.state_dict(),
            "rng": rng,
            "data": self.data.position.as_dict(),
            "options": self.options.as_dict(),
            "config": self.config.to_toml(from_workload=self.from_workload),
            # A checkpoint for a relaunch is taken after its boundary's commands and scripted changes were
            # queued; the relaunched run must not queue those scripted changes again. Nor must a run resumed
            # from the one taken before a trial queue that trial again: it stopped the run the first time.
            "scripted_through": self._scripted_through if reason in ("world_size", "trial") else self.step,
            "elapsed_s": self._elapsed(),
        }
        if rng_by_rank is not None:
            state["rng_by_rank"] = rng_by_rank
        written = write_checkpoint(self.checkpoint_dir, self.step, state, keep=self.config.keep_checkpoints)
        self.checkpoint_cadence.record(time.perf_counter() - started)
        if reason == "periodic":
            written.publish_in_background()
            self._publishing = written
            return
        self._emit(p.CheckpointSaved(step=self.step, path=str(written.publish()), reason=reason))

    def _finish_checkpoint(self) -> None:
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
            self._last_checkpoint_step = self.step
            raise
        self._emit(p.CheckpointSaved(step=written.step, path=str(path), reason="periodic"))

    def _restore(self, state: dict[str, Any], config: TrainConfig, explicit_options: Iterable[str]) -> LiveOptions:
        """Load a checkpoint; return the options to run with (the checkpoint's, unless given explicitly).

        The configuration may differ from the checkpoint's (an override given with ``--resume``): the built-in
        optimizer's state is kept only for the same optimizer, and its LR and weight decay are this
        configuration's, not the ones saved in the optimizer's and scheduler's state. A workload's own optimizer
        and scheduler are restored as saved; where ``--steps`` changed, the workload's scheduler is the one its
        factory builds for the new total, stepped to this step (torchlab re-plans only its own schedules)."""
        stored = config_from_toml(state["config"], "the checkpoint's configuration") if "config" in state else config
        own_optimizer, own_scheduler = self.workload.optimizer is not None, self.workload.scheduler is not None
        configured = [{"initial_lr": group["initial_lr"], "weight_decay": group["weight_decay"]} for group in self.optimizer.param_groups]
        check_model_fits(state["model"], self.model.state_dict(), stored.workload)
        try:
            self.model.load_state_dict(state["model"])
            if own_optimizer or stored.optimizer == config.optimizer:
                self.optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as error:
            raise ConfigError(f"--resume: the checkpoint does not fit this workload's model and optimizer: {error}") from None
        if own_scheduler and stored.steps != config.steps:
            step_to(self.scheduler, self.optimizer, state["step"])  # the factory's plan for the new total
        else:
            self.scheduler.load_state_dict(state["scheduler"])
        if not own_optimizer:
            for group, settings in zip(self.optimizer.param_groups, configured):
                group.update(settings)
        if not own_scheduler:
            self.scheduler.base_lrs = [settings["initial_lr"] for settings in configured]
        self.lrs.read_schedule()
        self.precisions.load_state_dict(state.get("grad_scaler"))
        self._restore_rng(state)
        self.data.restore(DataPosition.from_dict(state["data"], self.batch_size))
        self.step = state["step"]
        self._scripted_through = state.get("scripted_through", self.step)
        self._elapsed_before = float(state.get("elapsed_s", 0.0))
        self.first_step_of_process = self.step + 1
        self._last_checkpoint_step = self.step
        # A checkpoint from before an option was live has no value for it: the configuration's (workers was a
        # setting of the configuration, which still reads it), else the default.
        options = LiveOptions(**{**config.options.as_dict(), **state["options"]})
        for name in explicit_options:
            options = options.with_value(name, getattr(config.options, name))
        options = options.with_value(STEPS.name, config.steps)  # the checkpoint's total, or a resume's --steps
        self._resumed = ResumedFromCheckpoint(step=self.step, options=options.as_dict())
        return options

    def _restore_rng(self, state: dict[str, Any]) -> None:
        """Rank 0 (or the single process) continues the saved stream; rank r continues its own if the
        checkpoint has one for this world size, else starts a fresh stream derived from (seed, step, r)."""
        rank = self.ranks.rank if self.ranks is not None else 0
        by_rank = state.get("rng_by_rank")
        if rank == 0:
            restore_rng_state(state["rng"])
        elif by_rank is not None and len(by_rank) == self.world_size:
            restore_rng_state(by_rank[rank])
        else:
            seed_rank(self.config.seed, state["step"], rank)

    # ----------------------------------------------------------------- reporting
    def _elapsed(self) -> float:
        """Training time of the whole run: this process's, and that of the processes it resumed from."""
        return self._elapsed_before + time.monotonic() - self._started

    def _emit_metrics(self, record: dict[str, Any]) -> None:
        self._finish_checkpoint()  # the step's row comes after the checkpoint before it is safe, or not at all
        for observer in self.observers:
            observer.on_metrics(record)

    def _emit_telemetry(self, sample: TelemetrySample) -> None:
        for observer in self.observers:
            observer.on_telemetry(sample)

    def _emit(self, event: p.Message) -> None:
        """To every observer, even when one cannot write (a full disk must not keep the app uninformed)."""
        failure: StorageError | None = None
        for observer in self.observers:
            try:
                observer.on_event(event)
            except StorageError as error:
                failure = failure or error
        if failure is not None:
            raise failure


_WITHOUT_HOOK = [option.name for option in LIVE_OPTIONS if option.name not in _ENACT_HOOKS]
if _WITHOUT_HOOK:  # a live option added to the registry without its hook: say so at import, not at its first use
    raise TypeError(f"live option(s) without an enact hook in the Trainer (@enacts): {', '.join(_WITHOUT_HOOK)}")


def _describe_batch(batch: Any) -> str:
    if isinstance(batch, torch.Tensor):
        return f"tensor{list(batch.shape)} {str(batch.dtype).removeprefix('torch.')}"
    if isinstance(batch, (list, tuple)):
        return "(" + ", ".join(_describe_batch(item) for item in batch) + ")"
    if isinstance(batch, dict):
        return "{" + ", ".join(f"{key}: {_describe_batch(value)}" for key, value in batch.items()) + "}"
    return type(batch).__name__


def _jsonable(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool)) or value is None else repr(value)
