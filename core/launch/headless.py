"""Headless runs: the engine with a Rich progress bar, writing the same run directory as the app.

Ctrl-C (or SIGTERM) asks the trainer to stop at the next step boundary, so the final checkpoint is
a consistent one; a second Ctrl-C aborts at once. A workload that calls ``sys.exit`` fails the run (exit 1,
core/engine/adapters/loading.py's ``exits_as_failure``): its status never passes for torchlab's own. This process is the run's supervisor
(core/engine/ranks/supervisor.py): at world size 1 it trains itself, above that it starts the ranks and reports for
them. Started by ``torchrun`` instead, each process is one rank and only rank 0 reports.
"""

from __future__ import annotations

import collections
import math
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.live import Live
from rich.markup import escape as escape_markup
from rich.text import Text

from torchlab.core.analysis.impact import ImpactTracker
from torchlab.core.analysis.bottleneck import BottleneckWatch
from torchlab.core.analysis.trial_words import describe_trial, trial_progress_text
from torchlab.core.engine.parallel.distributed import RankContext, rank_from_environment
from torchlab.core.engine.parallel import preemption
from torchlab.core.engine.adapters.loading import check_spec, exits_as_failure, load_workload, workload_label
from torchlab.core.engine.outcome import RunOutcome
from torchlab.core.engine.ranks.supervisor import Supervisor, initial_world_size, run_quiet_rank
from torchlab.core.engine.seeding import seed_everything
from torchlab.core.engine.measure.tensorboard import tensorboard_observers
from torchlab.core.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_NONFINITE, EXIT_OK
from torchlab.core.errors import HangEnded, StorageError, TorchlabError, WorkloadExited, printable
from torchlab.core.launch.arguments import exit_code
from torchlab.core.launch.training_plan import ConfigRecord, TrainingPlan
from torchlab.core.records.rundir import RunDirectory
from torchlab.core.records.rundir_folder import choose_run_dir, refuse_an_unfit_run_dir
from torchlab.core.wire import events
from torchlab.core.wire import protocol as p
from torchlab.core.wire.communication import communication_sentence
from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.wire.observer import TrainerObserver
from torchlab.core.wire.metric_names import validation_label
from torchlab.core.options import STEPS, format_option_value
from torchlab.core.wire.protocol import Message
from torchlab.core.wire.run_status import RunStatus

if TYPE_CHECKING:
    from torchlab.core.workload import Workload

#: How headless says a run ended at a hang, whichever process says it (the outcome's, or rank 0's under torchrun)
ENDED_AT_A_HANG = "[bold red]Ended at a hang:[/]"


def run_headless(
    plan: TrainingPlan,
    *,
    run_dir: Path | None,
    runs_root: Path,
    console: Console | None = None,
) -> int:
    """Train ``plan`` to its end as this process's part of the run (the module's docstring): the exit status
    ``_report`` gives its outcome. A run that cannot start raises its TorchlabError, for the command to say."""
    console = console or Console(stderr=True, soft_wrap=True)
    config, resume = plan.config, plan.resume
    external = rank_from_environment(supervised=False)  # started by torchrun: one rank of several
    if external is not None and external.rank != 0:
        return _run_quiet_rank(plan, external, run_dir=run_dir, runs_root=runs_root)
    check_spec(config.workload)
    refuse_an_unfit_run_dir(run_dir, resume, shared=config.shared_run_dir)  # after the checkpoint's own checks
    workload = _workload_trained_here(plan, external)
    tensorboard = tensorboard_observers(config)  # TensorBoard not installed: said before a directory exists
    directory = RunDirectory(choose_run_dir(run_dir, resume, runs_root, workload_label(config.workload)),
                             shared=config.shared_run_dir)
    progress = HeadlessProgress(config.steps, console)
    try:
        supervisor = _prepared_supervisor(plan, directory, [progress, *tensorboard], workload=workload, external=external)
        stop_on_signal = _StopOnSignal(supervisor, console, external.rank if external is not None else None)
        with stop_on_signal, progress:
            try:
                with exits_as_failure("while it trained"):
                    outcome = supervisor.run()
            except WorkloadExited as error:  # the trainer's journal never saw it: the run's code ended it
                directory.record_error(str(error), step=progress.step + 1)
                raise
    finally:
        directory.close()
    return _report(outcome, directory.path.absolute(), progress, interrupted=stop_on_signal.interrupted,
                   steps=progress.total_steps, torchrun=external is not None)


def _run_quiet_rank(plan: TrainingPlan, external: RankContext, *, run_dir: Path | None, runs_root: Path) -> int:
    """One rank of several under torchrun, not rank 0: it trains and reports nothing (rank 0 does)."""
    config = plan.config
    path = choose_run_dir(run_dir, plan.resume, runs_root, workload_label(config.workload))
    outcome = run_quiet_rank(config, external, run_dir=path, resume=plan.resume, explicit=plan.explicit)
    return exit_code(outcome.status)


def _workload_trained_here(plan: TrainingPlan, external: RankContext | None) -> Workload | None:
    """The workload, seeded and loaded where this process trains it (one rank of torchrun's, or world size 1),
    so that a bad one fails before any directory exists; None where the ranks this process starts load their own."""
    config = plan.config
    if external is None and initial_world_size(config, plan.resume, plan.explicit) != 1:
        return None
    seed_everything(config.seed)
    return load_workload(config.workload)


def _prepared_supervisor(plan: TrainingPlan, directory: RunDirectory, observers: list[TrainerObserver], *,
                         workload: Workload | None, external: RankContext | None) -> Supervisor:
    """The run's Supervisor, prepared: its observers are the run's records (the directory, its config record, the
    impact table), then ``observers``. A failure as the run was set up is in the run's journal too."""
    config_record = ConfigRecord(directory, plan)
    config_record.write_for_new_run()
    supervisor = Supervisor(
        plan.config,
        observers=[directory, config_record, ImpactTracker(directory.path / "impact.json"), *observers],
        run_dir=directory.path,
        resume_from=plan.resume,
        explicit=plan.explicit,
        workload=workload,
        external=external,
        resume_note=plan.resume_note(),
    )
    try:
        with exits_as_failure("as the run was set up"):
            supervisor.prepare()
    except TorchlabError as error:
        directory.record_error(str(error))
        raise
    return supervisor


def _report(outcome: RunOutcome, run_path: Path, progress: HeadlessProgress, *, interrupted: bool, steps: int,
            torchrun: bool = False) -> int:
    """How the run ended, said after its progress bar, and the process's exit status. ``run_path`` is absolute: a
    hint to follow from any directory. A stop asked for by a signal (Ctrl-C, a scheduler's warning to any rank) says
    how to resume and exits EXIT_INTERRUPTED; under torchrun 0, as every rank does, for torchrun's own status to say
    the run ended well (a rank's other status is torchrun's failure)."""
    console = progress.console
    console.print(f"Run directory: {escape_markup(printable(run_path))}")  # one path: a newline in it escaped too
    if outcome.status == RunStatus.NONFINITE:
        console.print(f"[bold red]Stopped on a non-finite value:[/] {as_markup(outcome.message)}")
        return EXIT_NONFINITE
    if outcome.failed_with(StorageError):  # the message says what is intact and what to do
        console.print(f"[bold red]Stopped after step {outcome.step}:[/] {as_markup(outcome.message)}")
        return EXIT_FAILED
    if outcome.failed_with(HangEnded):  # the message names the checkpoint to resume from; there is no traceback
        console.print(f"{ENDED_AT_A_HANG} {as_markup(outcome.message)}")
        return EXIT_FAILED
    if outcome.status == RunStatus.FAILED:
        console.print(f"[bold red]Training failed at step {outcome.step + 1}:[/] {as_markup(outcome.message)}")
        console.print(as_markup(f"Traceback in {run_path / 'events.jsonl'}; the last checkpoint is in {run_path / 'checkpoints'}."))
        return EXIT_FAILED
    if interrupted or outcome.stopped_by:
        by = f"Stopped by {outcome.stopped_by}" if outcome.stopped_by else "Interrupted"
        again = (f"the same torchrun command on every node with --resume {run_path}" if torchrun
                 else f"torchlab-tui --resume {run_path}")
        console.print(as_markup(f"{by} at step {outcome.step}, checkpointed there; resume with {again}"))
        return EXIT_OK if torchrun else EXIT_INTERRUPTED
    if outcome.status == RunStatus.FINISHED and progress.last_row is None and outcome.step >= steps:
        console.print(f"Nothing to train: the run is at step {outcome.step}, its --steps. Resume with --steps N "
                      f"(N > {outcome.step}) to train further.")
        return EXIT_OK
    console.print(f"{outcome.status.capitalize()} at step {outcome.step}. {as_markup(progress.summary())}".rstrip())
    return EXIT_OK


def as_markup(text: object) -> str:
    """Words from elsewhere (a path, a workload's message, an option's value) in a line of Rich markup: their control
    characters escaped as every message escapes them (core/errors.py ``printable``), then their brackets. Rich's own
    escaping is of markup only, and Rich drops a bell but writes an ESC through: a run directory holding
    ``\\x1b]0;title\\x07`` would reach the terminal as an escape sequence."""
    return escape_markup(printable(text, keep_lines=True))


#: How often the bar is drawn: two frames a second show the figures a person reads (the step count,
#: loss and rate are read, not watched move). Each frame is drawn on Rich's thread, holding the GIL.
PROGRESS_FRAMES_PER_S = 2

#: The bar's widest; it narrows on a narrow terminal, so the line never wraps.
BAR_WIDTH = 40

#: Where no bar can be drawn (output to a pipe or a file: nohup, CI logs), a training line this often.
PIPE_LINE_INTERVAL_S = 10.0


class HeadlessProgress(TrainerObserver):
    """A trainer observer that draws a progress bar and prints events above it.

    A metrics row only stores its figures (a few attribute writes on the training thread); the line is
    built from them when a frame is drawn. Rich's ``Progress`` cost 1.8 ms a frame in its table layout
    against 0.45 ms for this one line (``benchmarks/loop_cost.py --components``), and its thread takes
    the GIL and a core from training while it draws.
    """

    def __init__(self, total_steps: int, console: Console) -> None:
        self.console = console
        self.total_steps = total_steps
        self.description = "training"
        self.trial: p.TrialProgress | None = None  # while a trial runs: the bar says how far it is
        self.step = 0
        self.loss: float | None = None
        self.samples_per_s: float | None = None
        self.first_loss: float | None = None
        self.last_row: MetricsRow | None = None
        self._step_time_s: float | None = None  # smoothed: the bar shows a rate, not one step's hiccup
        self._grad_norm: float | None = None  # the newest measured (the probe does not run every step)
        self.bottleneck = BottleneckWatch()  # where the time of the last measured steps went
        #: no terminal to draw a bar on: a line of figures every PIPE_LINE_INTERVAL_S instead
        self.prints_lines = not console.is_terminal
        self._line_printed_at = -math.inf
        self._started = time.monotonic()
        self._live = Live(_BarLine(self), console=console, transient=True, refresh_per_second=PROGRESS_FRAMES_PER_S)

    def __enter__(self) -> HeadlessProgress:
        self._started = time.monotonic()
        self._live.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._live.stop()

    def leaving(self, status: str, step: int, message: str) -> None:
        """Rank 0 under torchrun ends a hang: the process leaves now, with no outcome said after this."""
        self._live.stop()
        self.console.print(f"{ENDED_AT_A_HANG} {as_markup(message)}")

    def on_metrics(self, row: MetricsRow) -> None:
        if self.first_loss is None:
            self.first_loss = row.loss
        self.last_row = row
        self.step, self.loss, self.samples_per_s = row.step, row.loss, self.rate(row)
        if row.grad_norm_total is not None:
            self._grad_norm = row.grad_norm_total
        if (found := self.bottleneck.add(row)) is not None:  # said where its kind changed
            self.say(row.step, as_markup(found.text) if found.kind == "compute" else f"[yellow]{as_markup(found.text)}[/]")
        if self.prints_lines:
            now = time.monotonic()
            if now - self._line_printed_at >= PIPE_LINE_INTERVAL_S or row.step >= self.total_steps:
                self._line_printed_at = now
                self.console.print(as_markup(self.training_line(row)))
        if row.val_loss is not None:
            extra = "".join(f", {validation_label(name)} {_number(value, '.4g')}" for name, value in (row.val_metrics or {}).items())
            self.console.print(as_markup(f"step {row.step}: val_loss {row.val_loss:.4f}{extra}"))

    def training_line(self, row: MetricsRow) -> str:
        """``step 340/1000: loss 2.3456, lr 0.0012, 12,345 samples/s, grad norm 0.871, accuracy 0.91`` (``lr body 0.05
        head 0.2`` where the workload's optimizer has several groups)."""
        lrs = row.lrs or {}
        lr = " ".join(f"{name} {_number(value, '.3g')}" for name, value in lrs.items()) if lrs else f"{row.lr:.3g}"
        parts = [f"loss {row.loss:.4f}", f"lr {lr}", f"{self.samples_per_s:,.0f} samples/s"]
        if self._grad_norm is not None:
            parts.append(f"grad norm {self._grad_norm:.3g}")
        parts += [f"{name} {_number(value, '.4g')}" for name, value in (row.metrics or {}).items()]
        if (shares := self.time_shares()) is not None:
            parts.append(f"time {shares}")
        return f"step {row.step}/{self.total_steps}: " + ", ".join(parts)

    def time_shares(self) -> str | None:
        """``data 41 % forward 20 % ..., MFU 3.1 %``: where the last measured steps' time went (phases of 1 % or more),
        and the share of the device's peak FLOP/s they reached, where their FLOPs were counted."""
        current = self.bottleneck.current
        if current is None:
            return None
        shares = " ".join(f"{phase} {share * 100:.0f} %" for phase, share in current.shares.items() if share >= 0.005)
        return shares + (f", MFU {current.mfu * 100:.2g} %" if current.mfu is not None else "")

    def rate(self, row: MetricsRow) -> float:
        """Samples a second over the last ~10 steps (an exponential average of the step time): a frame
        drawn twice a second would otherwise show whichever single step came last."""
        step_time = row.step_time_s
        self._step_time_s = step_time if self._step_time_s is None else 0.9 * self._step_time_s + 0.1 * step_time
        return row.samples_per_s * step_time / self._step_time_s

    def on_event(self, event: Message) -> None:
        match event:
            case events.RunStarted():
                self.step, self.description = event.step, f"training on {event.device}"
                self.total_steps = event.steps  # a workload's own (Workload.settings) where no flag gave it
            case p.OptionApplied():
                if event.option == STEPS.name:
                    self.total_steps = event.value
                detail = f": {as_markup(event.detail)}" if event.detail else ""
                was = ("in force already, nothing changed" if event.value == event.previous else
                       f"was {as_markup(format_option_value(event.option, event.previous))}")
                self.say(event.step, f"[green]{event.option} = {as_markup(event.display)}[/] ({was}){detail}")
            case p.OptionRefused():
                self.say(event.step, f"[yellow]refused {as_markup(event.option)} = {as_markup(str(event.value))}[/]: {as_markup(event.reason)}")
            case p.CheckpointSaved():
                self.say(event.step, as_markup(f"checkpoint {event.path}"))
            case p.ProfileReady() if event.error:
                self.say(event.step, f"[red]profile failed[/]: {as_markup(event.error)}")
            case p.ProfileReady():
                top = ", ".join(f"{row['name']} {row[event.sort] / 1000:.1f} ms" for row in event.rows[:3])
                self.console.print(as_markup(f"steps {event.first_step}–{event.last_step}: profile in {event.dir} (top: {top})"))
                if (communication := communication_sentence(event.communication)) is not None:
                    self.console.print(as_markup(f"steps {event.first_step}–{event.last_step}: {communication}"))
            case p.TrialProgress():
                self.trial = event
            case p.TrialResult():
                self.trial = None
                for line in describe_trial(event):
                    self.say(event.step, as_markup(line))
            case _ if (sentence := events.describe(event)) is not None:  # the same words as the app's event log
                text = as_markup(sentence.text)
                self.say(event.step, f"[yellow]warning: {text}[/]" if sentence.warning else text)

    def say(self, step: int, text: str) -> None:
        """A line above the progress bar, about ``step`` (Rich markup)."""
        self.console.print(f"step {step}: {text}")

    def summary(self) -> str:
        if self.last_row is None or self.first_loss is None:
            return ""
        text = f"loss {self.first_loss:.4f} → {self.last_row.loss:.4f}"
        if self.last_row.val_loss is not None:
            text += f", val_loss {self.last_row.val_loss:.4f}"
        if (shares := self.time_shares()) is not None:
            text += f"; the last measured steps' time: {shares}"
        return text + "."


class _BarLine:
    """The bar's one line, built when a frame is drawn from what the last metrics row left:
    ``training on cpu ━━━━━━━━━━━━━━━  340/1000 loss 2.3456 12,345 samples/s 0:00:12 0:00:30``.
    The time left is the steps to go at the steps a second of the last ~30 s of frames (what Rich's
    own estimate does), so evaluations, checkpoints and option changes count in it."""

    WINDOW_S = 30.0

    def __init__(self, progress: HeadlessProgress) -> None:
        self.progress = progress
        self._seen: collections.deque[tuple[float, int]] = collections.deque()  # (when, step) per frame

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        progress, now = self.progress, time.monotonic()
        total, step = progress.total_steps, progress.step
        self._seen.append((now, step))
        while now - self._seen[0][0] > self.WINDOW_S:
            self._seen.popleft()
        loss = "—" if progress.loss is None else f"{progress.loss:.4f}"
        rate = "—" if progress.samples_per_s is None else f"{progress.samples_per_s:,.0f}"
        tail = Text.assemble(
            f" {step:>{len(str(total))}}/{total} loss ", (loss, "cyan"), f" {rate} samples/s ",
            (_clock(now - progress._started), "progress.elapsed"), " ", (_clock(self._seconds_left(step, total)), "progress.remaining"),
        )
        head = Text(progress.description if progress.trial is None else trial_progress_text(progress.trial), style="bold")
        width = max(0, min(BAR_WIDTH, options.max_width - head.cell_len - tail.cell_len - 1))
        filled = width if total <= 0 else min(width, round(width * step / total))
        line = Text.assemble(head, " ", ("━" * filled, "bar.complete"), ("━" * (width - filled), "bar.back"), tail)
        line.truncate(options.max_width, overflow="ellipsis")
        yield line

    def _seconds_left(self, step: int, total: int) -> float | None:
        (first_time, first_step), now = self._seen[0], self._seen[-1][0]
        if step <= first_step or now <= first_time:
            return None
        return max(0, total - step) * (now - first_time) / (step - first_step)


def _number(value: float | None, spec: str) -> str:
    """A figure of a row's mapping (a workload's metric, a group's LR); None is one that was not finite."""
    return format(math.nan if value is None else value, spec)


def _clock(seconds: float | None) -> str:
    """H:MM:SS, as Rich's progress columns write it; ``-:--:--`` while not known."""
    if seconds is None:
        return "-:--:--"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


class _StopOnSignal:
    """SIGINT, and a scheduler's warning (SIGTERM, SIGUSR1: core/engine/parallel/preemption.py): stop at the next step
    boundary (checkpoint kept); a second SIGINT aborts. ``rank``: this process's under torchrun (its signal stops every
    rank), else None."""

    def __init__(self, trainer: Supervisor, console: Console, rank: int | None) -> None:
        self.trainer, self.console, self.rank = trainer, console, rank
        self.interrupted = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopOnSignal:
        for signum in (signal.SIGINT, *preemption.STOP_SIGNALS):
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame) -> None:
        if self.interrupted and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.interrupted = True
        if signum == signal.SIGINT:
            self.trainer.request_stop("interrupted")
        else:
            self.trainer.request_stop(preemption.stop_reason(signum, self.rank), signum)
        self.console.print("Stopping at the next step boundary, with a checkpoint (Ctrl-C again aborts).")

