"""The supervisor: one stable process that owns a run's reporting while its ranks come and go.

::

    supervisor (the headless process, or the app's trainer process)          rank processes
      observers: run directory, impact table, progress bar or app outbox
      world size 1: the Trainer, in this process (no launcher, fast start)
      world size N: elastic_launch (torchrun's machinery; its rendezvous   python -m torchlab.core.engine.ranks.rank_process
                    on 127.0.0.1 only) ─── starts N ──────────────────▶    (gloo on CPU; nccl, one GPU each)
                    ◀── rank 0: metrics, events, outcome ── Unix socket ──  rank 0 broadcasts the commands
                    ── commands ──────────────────────────▶ typed messages  at each step boundary

A change of world size, or of how the ranks hold the model (``parallel``: ddp or fsdp), ends the current trainer
(or ranks) with a checkpoint and the outcome ``relaunch``; the supervisor starts the new ranks from that checkpoint,
and acknowledges the change (``option_applied``, at the step it takes effect) once the new trainer reports
``run_started``.

A rank that fails takes the run down with it: the launcher stops the other ranks, and the supervisor
reports the rank whose failure caused it (core/engine/ranks/launcher.py ``root_cause``; ``@record`` gives its
traceback) as the run's error. A rank's process is core/engine/ranks/rank_process.py. Rank processes
die with their supervisor (parent-death signal), so none is ever left behind. A rank that ran out of memory is
the OOM rescue's (core/engine/guards/oom_rescue.py), where it is on: the other ranks wait in the failed step's
collectives, so no rank can retry the step alone; the supervisor decides the rung from the rank's failure and
starts the ranks again from the run's newest checkpoint, with the options in force at the failure and the rung
(``oom_rescued``; core/engine/ranks/rescue.py).

Under ``torchrun`` (several nodes, or a launcher of your own) there is no relaunch: each process is a
rank with its world size fixed by the launcher, rank 0 reports in-process, and a change is refused.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import sys
import threading
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from torchlab.core.engine.forecast.forecaster import Forecaster
from torchlab.core.engine.parallel import loopback_rendezvous
from torchlab.core.engine.state.checkpoint import peek_checkpoint
from torchlab.core.engine.state.checkpoint_contents import saved_world_size
from torchlab.core.engine.parallel.cpu_share import apply_thread_share
from torchlab.core.engine.parallel.distributed import RANK_MODULE, RankContext, check_world_size
from torchlab.core.engine.outcome import Relaunch, RunOutcome
from torchlab.core.engine.parallel.preemption import stop_on_signals
from torchlab.core.engine.ranks.rescue import RankRescue, Rescue
from torchlab.core.engine.parts import Reporter, resolve_device
from torchlab.core.engine.ranks.channel import TOKEN_VARIABLE, RankChannel
from torchlab.core.engine.ranks.launcher import TERMINATE_GRACE_S, private_rank_logs, root_cause, terminate_ranks
from torchlab.core.engine.trainer import Trainer
from torchlab.core.errors import ConfigError, HangEnded, StorageError, WorkloadError
from torchlab.core.records.config import TrainConfig, config_from_toml
from torchlab.core.records.resume_changes import SettingChange, resume_note
from torchlab.core.records.storage import make_folder, write_atomically
from torchlab.core.wire.events import Relaunching, ResumeChangedSettings, ResumedFromCheckpoint, RunStarted
from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.wire.observer import TrainerObserver
from torchlab.core.options import OPTION_NAMES, OptionChangeError, live_option
from torchlab.core.wire.payloads import TelemetrySample
from torchlab.core.wire.protocol import Error, ForecastCommand, Message, OptionApplied, StopCommand, TrainerCommand
from torchlab.core.wire.run_status import RunStatus



class Supervisor:
    """Runs ``config`` at its world size and reports to ``observers``; API as the Trainer's: ``submit``,
    ``request_stop``, ``run``, ``step``. Under ``torchrun`` (``external`` given) it is one rank of many."""

    def __init__(
        self,
        config: TrainConfig,
        *,
        observers: Iterable[TrainerObserver],
        run_dir: Path,
        resume_from: Path | None = None,
        explicit: Iterable[str] = (),
        workload=None,
        external: RankContext | None = None,
        resume_note: dict[str, Any] | None = None,
    ) -> None:
        """``workload``: already loaded (seeded first) for the first in-process trainer; later ones load
        their own, as a fresh process would. ``external``: this process is a rank that torchrun started.
        ``resume_note``: what the resume changed (``changes``, ``message``, ``level``), reported as the event
        ``resume_changed_settings`` once the checkpoint has loaded."""
        self.config = config
        self.observers = list(observers)
        self.run_dir = Path(run_dir)
        self.resume_from = resume_from
        self.explicit = set(explicit)
        self.external = external
        self._workload = workload
        self.step = 0
        self.trainer: Trainer | None = None
        self._relay = _Relay(self)
        self._lock = threading.Lock()
        self._pending: list[TrainerCommand] = []  # commands that arrived while no trainer or rank 0 could take them
        self._channel: RankChannel | None = None
        self._signalled_stop: StopCommand | None = None
        self._signal_number = 0  # the signal that asked for the stop, where one did
        self._acknowledge: Relaunch | None = None
        self._resume_note = resume_note
        self._rescue: Rescue | None = None
        if external is not None:
            self.world_size = external.world_size
            self.config = _with_world_size(config, external.world_size)
            self.explicit.add("world_size")
        else:
            self.world_size = initial_world_size(config, resume_from, self.explicit)
            self.config = _with_world_size(config, self.world_size)
        if resume_from is not None:
            self._resume_note = _with_world_size_change(resume_note, resume_from, self.world_size)
        #: the run's forecaster (what fits; the OOM rescue's split with ranks): its process starts when first asked
        self.forecaster = Forecaster(self.config, self.explicit, self.run_dir, self._emit, gpus=self._gpus)
        #: the OOM rescue with ranks: what rank 0 said, and its rungs
        self.rank_rescue = RankRescue(resume_from, rung_to_fit=self.forecaster.rung_to_fit)

    # ------------------------------------------------------------------ the Trainer's API
    def submit(self, command: TrainerCommand) -> None:
        if isinstance(command, ForecastCommand):  # the forecaster's, whatever the trainer is doing
            self.forecaster.start()
            return
        with self._lock:
            if self.trainer is not None:
                self.trainer.submit(command)
            elif self._channel is not None:
                self._channel.send(command)
            else:
                self._pending.append(command)

    def request_stop(self, reason: str, signal_number: int = 0) -> None:
        """Safe in a signal handler: attribute stores only; the run loop forwards the stop to the ranks
        (``signal_number``: the signal that asked, where one did: core/engine/parallel/preemption.py)."""
        self._signal_number = signal_number
        self._signalled_stop = StopCommand(reason)
        trainer = self.trainer
        if trainer is not None:
            trainer.request_stop(reason, signal_number)

    # ------------------------------------------------------------------ running
    def prepare(self) -> None:
        """Check the world size; at world size 1 (or under torchrun) build the trainer here, so a bad
        workload fails before training starts (WorkloadError, ConfigError), exactly as without ranks."""
        if self.external is None and self.world_size > 1:
            try:
                check_world_size(self.world_size, device=resolve_device(self.config.device),
                                 batch_size=self.config.batch_size or self.world_size)
            except OptionChangeError as refusal:
                raise ConfigError(f"world_size (--world-size) {self.world_size}: {refusal}.") from None
        elif self.trainer is None:
            self._build_trainer(self.config, self.resume_from, self.explicit)

    def run(self) -> RunOutcome:
        try:
            return self._run()
        finally:
            self.forecaster.close()

    def _run(self) -> RunOutcome:
        config, resume, explicit = self.config, self.resume_from, self.explicit
        while True:
            if self.world_size == 1 or self.external is not None:
                outcome = self._run_here(config, resume, explicit)
            else:
                outcome = self._run_ranks(config, resume, explicit)
            if self._rescue is not None:  # a rank ran out of memory: the ranks start again one rung down
                rescue, self._rescue = self._rescue, None
                config = dataclasses.replace(configuration_at(rescue.resume, config), steps=rescue.options.steps,
                                             options=rescue.options)
                resume, explicit = rescue.resume, set(OPTION_NAMES)
                continue
            if outcome.status != RunStatus.RELAUNCH:
                return outcome
            change = outcome.relaunch
            self._emit(Relaunching(step=outcome.step, option=change.option, value=change.value, previous=change.previous,
                                   world_size=change.world_size))
            self._acknowledge = change
            self.world_size = change.world_size
            # the checkpoint's configuration and options (parallel among them), but the world size the change asked for
            resume, explicit = self.run_dir / "checkpoints" / "last.pt", {"world_size"}
            config = _with_world_size(configuration_at(resume, config), change.world_size)

    def _emit(self, event: Message) -> None:
        for observer in self.observers:
            observer.on_event(event)

    def _gpus(self) -> int | None:
        """The GPUs of this machine a change of world size could use (None on a CPU): what fits is asked for them."""
        if resolve_device(self.config.device).type != "cuda":
            return None
        return torch.cuda.device_count()

    def _build_trainer(self, config: TrainConfig, resume: Path | None, explicit: set[str]) -> Trainer:
        from torchlab.core.engine.seeding import seed_everything
        from torchlab.core.engine.adapters.loading import load_workload

        apply_thread_share(reports=self.external is None or self.external.reports)
        workload, self._workload = self._workload, None
        if workload is None:
            seed_everything(config.seed)
            workload = load_workload(config.workload)
        trainer = Trainer(
            config,
            workload,
            observers=[self._relay],
            checkpoint_dir=self.run_dir / "checkpoints",
            profiles_dir=self.run_dir / "profiles",
            resume_from=resume,
            explicit=explicit,
            ranks=self.external,
            can_relaunch=self.external is None,
        )
        with self._lock:
            self.trainer = trainer
            pending, self._pending = self._pending, []
        for command in pending:
            trainer.submit(command)
        if self._signalled_stop is not None:
            trainer.request_stop(self._signalled_stop.reason, self._signal_number)
        return trainer

    def _run_here(self, config: TrainConfig, resume: Path | None, explicit: set[str]) -> RunOutcome:
        trainer = self.trainer or self._build_trainer(config, resume, explicit)
        try:
            return trainer.run()
        finally:
            with self._lock:
                self.trainer = None
                self._pending = trainer.pending_commands() + self._pending
            del trainer
            gc.collect()  # the model and optimizer of this size go before the next size loads its own
            if torch.cuda.is_initialized():
                torch.cuda.empty_cache()  # and their cached GPU memory, which rank 0 will want on this GPU

    def _run_ranks(self, config: TrainConfig, resume: Path | None, explicit: set[str]) -> RunOutcome:
        from torchlab.core.engine.measure.telemetry import TelemetrySampler

        loopback_rendezvous.register()
        logs = self.run_dir / "ranks"
        make_folder(logs)  # as private as the run directory
        rank_config = logs / "config.toml"
        write_atomically(rank_config, config.to_toml())
        channel = RankChannel(self._relay, step=lambda: self.step)
        with self._lock:
            self._channel = channel
            pending, self._pending = self._pending, []
        for command in pending:
            channel.send(command)
        args = ["-m", RANK_MODULE, "--run-dir", str(self.run_dir), "--config", str(rank_config),
                "--socket", str(channel.path), "--explicit", ",".join(sorted(explicit))]
        if resume is not None:
            args += ["--resume", str(resume)]
        os.environ[TOKEN_VARIABLE] = channel.token  # children inherit it; it never appears on a command line
        sampler = None
        if config.telemetry_interval > 0:
            sampler = TelemetrySampler(torch.device("cpu"), self._relay.on_telemetry, lambda: self.step, config.telemetry_interval)
            sampler.start()
        try:
            failure = self._launch(args, logs, channel)
        finally:
            if sampler is not None:
                sampler.stop()
            os.environ.pop(TOKEN_VARIABLE, None)
            with self._lock:
                self._channel = None
                self._pending = channel.close() + self._pending
        return self._outcome_of_ranks(channel, failure)

    def _launch(self, args: list[str], logs: Path, channel: RankChannel) -> BaseException | None:
        """Start the ranks with torch's elastic launcher and wait for them; what the launcher raised, if anything.

        The launcher runs on its own thread, so this thread's signal handlers stay the run's own (Ctrl-C: stop at
        a boundary with a checkpoint) instead of the launcher's (terminate at once); a stop signalled meanwhile
        goes to rank 0 as a command."""
        from torch.distributed.launcher.api import LaunchConfig, elastic_launch

        launch = LaunchConfig(
            min_nodes=1, max_nodes=1, nproc_per_node=self.world_size,
            run_id=f"torchlab-{uuid.uuid4().hex[:12]}",
            rdzv_backend=loopback_rendezvous.BACKEND, rdzv_endpoint="",  # a store on 127.0.0.1 only
            max_restarts=0, monitor_interval=0.1, start_method="spawn",
            logs_specs=private_rank_logs(logs),
        )
        failure: list[BaseException] = []

        def launcher() -> None:
            try:
                elastic_launch(launch, sys.executable)(*args)
            except BaseException as error:  # reported by the supervisor's thread
                failure.append(error)

        # The launcher warns that, off the main thread, it cannot forward signals to its workers (ours
        # need none: they die with this process, and stop on a command), and logs each rank's failure,
        # which the supervisor reports itself, with the rank that caused it.
        logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
        thread = threading.Thread(target=launcher, name="torchlab-launcher", daemon=True)
        stop_sent = False
        try:
            thread.start()
            while thread.is_alive():
                thread.join(0.1)
                if self._signalled_stop is not None and not stop_sent:
                    channel.send(self._signalled_stop)
                    stop_sent = True
                if channel.outcome is not None and channel.outcome.as_run_outcome().failed_with(HangEnded):
                    terminate_ranks()  # rank 0 ended a hang: the others are stuck, deaf to the launcher's SIGTERM
        finally:
            if thread.is_alive():  # leaving early (a second Ctrl-C): take the ranks down with us
                terminate_ranks()
                thread.join(TERMINATE_GRACE_S + 5.0)
        return failure[0] if failure else None

    def _outcome_of_ranks(self, channel: RankChannel, failure: BaseException | None) -> RunOutcome:
        """How the ranks' run ended: rank 0's outcome, or the failure that ended it, reported."""
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

        outcome = channel.outcome
        if channel.storage_failure is not None:  # the run directory could not be written: that ended the run
            message = str(channel.storage_failure)
            try:
                self._relay.on_event(Error(step=self.step + 1, message=message, traceback=""))
            except StorageError:
                pass  # the journal is what could not be written; the outcome carries the message
            return RunOutcome(RunStatus.FAILED, self.step, message, error=StorageError)
        if outcome is not None and outcome.status == RunStatus.USAGE:
            if (rescue := self.rank_rescue.split_refused()) is not None:  # the batches cannot be split: checkpointing
                self._relay.on_event(rescue.event)
                self._rescue = rescue
                return RunOutcome(RunStatus.RELAUNCH, self.step)
            raise (ConfigError if outcome.as_run_outcome().failed_with(ConfigError) else WorkloadError)(outcome.message)
        if outcome is not None and outcome.as_run_outcome().failed_with(HangEnded):  # rank 0 ended a hang, and left
            return outcome.as_run_outcome()
        if failure is not None:
            if isinstance(failure, ChildFailedError):
                rank, message, trace, exitcode = root_cause(failure)
                rescue = self.rank_rescue.rescue_from(rank, message, step=self.step + 1, world_size=self.world_size)
                if isinstance(rescue, Rescue):
                    self._relay.on_event(rescue.event)
                    self._rescue = rescue
                    return RunOutcome(RunStatus.RELAUNCH, self.step)
                message += rescue
            else:
                rank, message, trace, exitcode = None, f"the launcher failed: {type(failure).__name__}: {failure}", "", None
            self._relay.on_event(Error(step=self.step + 1, message=message, traceback=trace, rank=rank, exitcode=exitcode))
            return RunOutcome(RunStatus.FAILED, self.step, message)
        if outcome is None:
            message = f"rank 0 stopped reporting: {channel.broken or 'its channel to the supervisor never opened'}"
            self._relay.on_event(Error(step=self.step + 1, message=message, traceback=""))
            return RunOutcome(RunStatus.FAILED, self.step, message)
        return outcome.as_run_outcome()


class _Relay(TrainerObserver):
    """Passes every record on to the supervisor's observers; tracks the step; acknowledges a world-size
    change when the relaunched trainer reports ``run_started``."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor

    def on_metrics(self, row: MetricsRow) -> None:
        self.supervisor.step = row.step
        for observer in self.supervisor.observers:
            observer.on_metrics(row)
        self.supervisor.rank_rescue.observe_row(row)
        self.supervisor.forecaster.observe_row(row)

    def on_event(self, event: Message) -> None:
        for observer in self.supervisor.observers:
            observer.on_event(event)
        self.supervisor.rank_rescue.observe(event)
        self.supervisor.forecaster.observe(event)
        change = self.supervisor._acknowledge
        note = self.supervisor._resume_note
        match event:
            case ResumedFromCheckpoint() if note is not None:
                self.supervisor._resume_note = None
                self.on_event(ResumeChangedSettings(step=event.step, **note))
            case RunStarted():
                self.supervisor.step = event.step
                if change is not None:
                    self.supervisor._acknowledge = None
                    self.on_event(OptionApplied(
                        step=change.step, option=change.option, value=change.value, previous=change.previous,
                        display=live_option(change.option).format(change.value), source=change.source,
                    ))

    def on_telemetry(self, sample: TelemetrySample) -> None:
        for observer in self.supervisor.observers:
            observer.on_telemetry(sample)

    def leaving(self, status: str, step: int, message: str) -> None:
        """Passed on as every record is: under torchrun, rank 0's process leaves at a hang it ended, and the run's
        records (its journal, headless's lines, the app's socket) are the supervisor's observers'."""
        Reporter(self.supervisor.observers).leaving(status, step, message)

    def before_checkpoint(self, step: int) -> None:
        """Passed on as every record is: the run directory writes the rows it holds before the checkpoint lands.
        Left to the observer's default (nothing), a kill after the checkpoint's rename lost them for good: the
        rows of a run's last few steps are held while steps come fast (issue 46: seven rows of a run checkpointing
        every 7 steps, ``last.pt`` at step 231 and ``metrics.jsonl`` ending at 224)."""
        for observer in self.supervisor.observers:
            observer.before_checkpoint(step)


def initial_world_size(config: TrainConfig, resume: Path | None, explicit: Iterable[str]) -> int:
    """--world-size when given; else a resumed run keeps the world size its checkpoint trained with."""
    if "world_size" in explicit or resume is None:
        return config.options.world_size
    try:  # memory-mapped: only the small options entry is read
        saved = saved_world_size(peek_checkpoint(resume))
    except Exception:  # missing or unreadable: the trainer says why when it loads it
        return config.options.world_size
    return config.options.world_size if saved is None else saved


def _with_world_size_change(note: dict[str, Any] | None, resume: Path, world_size: int) -> dict[str, Any] | None:
    """The resume's note (``resume_changed_settings``) with the world size where it is not the checkpoint's
    (``--resume RUN --world-size 1``, the error screen's restart, torchrun with another number of processes): the
    supervisor is the one that knows the world size the ranks train with, so it, not the resume's plan, says so,
    and every reader of the run's history (compare, TensorBoard, attach) counts it as the change it is."""
    try:
        saved = saved_world_size(peek_checkpoint(resume))
    except Exception:  # missing or unreadable: the trainer says why when it loads it
        return note
    if saved is None or saved == world_size:
        return note
    changes = [SettingChange.of_record(change) for change in note["changes"]] if note is not None else []
    return resume_note([*changes, SettingChange("world_size", saved, world_size)])


def configuration_at(checkpoint: Path, config: TrainConfig) -> TrainConfig:
    """The configuration the run had when ``checkpoint`` was written, which ranks started again resume with, as
    ``--resume`` alone would: a live change of ``steps`` and a workload's own starting values (``Workload.settings``)
    are in it, not in the configuration the run was started with (with that one, a relaunch for a new world size
    trained to the first total of steps). ``config`` where the checkpoint cannot be read: the trainer says why when
    it loads it. The workload stays ``config``'s, the one the user started: the code the new ranks import is never
    chosen by a file."""
    try:
        stored = config_from_toml(peek_checkpoint(checkpoint)["config"], "the checkpoint's configuration")
    except Exception:
        return config
    return dataclasses.replace(stored, workload=config.workload)


def _with_world_size(config: TrainConfig, world_size: int) -> TrainConfig:
    return dataclasses.replace(config, options=config.options.with_value("world_size", world_size))



def run_quiet_rank(config: TrainConfig, context: RankContext, *, run_dir: Path, resume: Path | None,
                   explicit: Iterable[str]) -> RunOutcome:
    """A rank other than 0 under torchrun (headless or worker): trains its share; reports and writes nothing."""
    from torchlab.core.engine.seeding import seed_everything
    from torchlab.core.engine.adapters.loading import load_workload

    seed_everything(config.seed)
    workload = load_workload(config.workload)
    supervisor = Supervisor(config, observers=[], run_dir=run_dir, resume_from=resume,
                            explicit=explicit, workload=workload, external=context)
    stop_on_signals(supervisor.request_stop, context.rank)  # a scheduler's warning to this rank stops every rank
    supervisor.prepare()
    return supervisor.run()
