"""Controlled trials: "what would bf16 do?", measured on this run rather than guessed, then undone.

A trial of ``option = value`` at a step boundary copies the training state (``Checkpointer.snapshot``: each
part a step changes gives its ``state_dict``: the model's, the optimizer's and the schedule's, the GradScaler,
every RNG, the data position, and the live options), runs K steps with the option changed (the options part's
``load_state_dict`` enacts it), puts the state back (each part's ``load_state_dict``), runs K steps as it is, on the same batches from the same state, and puts the state back
again. Training then goes on exactly as if no trial had run: the same weights, optimizer moments, LR, random
numbers and next batch, so a run with a trial and a run without one have bit-identical losses at every
training step (``tests/test_trials.py``). An arm's steps are training's own step (``Trainer.train_step``),
planned to report nothing (``StepPlan(trial=True)``).

The copy is in memory (a clone of each tensor), not a checkpoint on disk: a trial costs its 2K steps,
a state dict's copy and two loads. Each arm reports what the impact table would: its step time (median
and 90 % interval), its memory by kind on one step, and the loss of each step.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from torchlab.core.analysis.impact import median_interval
from torchlab.core.analysis.trials import AS_IT_IS, NOT_TRIED
from torchlab.core.engine.checkpointer import Checkpointer
from torchlab.core.engine.instruments import StepPlan
from torchlab.core.engine.memory import out_of_memory
from torchlab.core.engine.option_hooks import for_this_device, jsonable
from torchlab.core.engine.parts import TrainingParts
from torchlab.core.engine.profiler import Profiling
from torchlab.core.engine.step_report import StepReport
from torchlab.core.engine.telemetry import OthersCpuMeter
from torchlab.core.errors import shown
from torchlab.core.records.config import MAX_TRIAL_STEPS
from torchlab.core.wire import protocol as p
from torchlab.core.wire.events import TrialStarted
from torchlab.core.wire.options import LiveOption, OptionRefused, live_option
from torchlab.core.wire.payloads import MemoryBreakdown, TrialArm
from torchlab.core.wire.protocol import TrialCommand, TrialProgress

#: The step of an arm whose memory is measured: its second, once the first paid its one-off costs.
MEMORY_STEP = 1
#: A running trial says how far it is at most this often (and at each arm's start).
TRIAL_PROGRESS_INTERVAL_S = 0.25


class Trials:
    """Runs the trials asked for at a boundary, each arm's steps with ``train_step`` (see the module docstring)."""

    def __init__(self, parts: TrainingParts, train_step: Callable[[StepPlan], StepReport], checkpoints: Checkpointer,
                 profiling: Profiling) -> None:
        self.parts, self.train_step, self.checkpoints, self.profiling = parts, train_step, checkpoints, profiling
        self._progress_at = -float("inf")

    def run(self, command: TrialCommand, step: int) -> None:
        """Two arms of ``command.steps`` steps from this boundary's state on the same batches, the option changed
        and as it is; then the state as it was. Answered by one TrialResult, or one that says why it could not run."""
        parts = self.parts

        def answer(arms: list, error: str | None = None) -> None:
            parts.reporter.emit(p.TrialResult(step=step, option=command.option, value=jsonable(command.value),
                                              steps=command.steps, arms=arms, error=error, source=command.source))

        try:
            option = live_option(command.option)
            value = for_this_device(parts, option, option.parse(command.value))
        except OptionRefused as refusal:
            return answer([], str(refusal))
        refusal = self._refusal(option, command)
        if refusal is not None:
            return answer([], refusal)
        if parts.world.collectives is not None and parts.progress.step > 0 and self.checkpoints.last_step != parts.progress.step:
            # With ranks an arm that runs out of memory on one rank stops the run (TrialOutOfMemory): saved
            # here, it resumes from this step, as if the trial had not run.
            self.checkpoints.save(reason="trial")
        snapshot = self.checkpoints.snapshot()  # what a step changes, and the options
        options = self.checkpoints.states["options"]
        changed = f"{option.name}={option.format(value)}"
        try:
            options.load_state_dict({**snapshot["options"], option.name: value})  # enacted for the first arm
        except OptionRefused as refusal:
            self.checkpoints.restore(snapshot)
            return answer([], f"{changed} cannot run here: {refusal}")
        parts.reporter.emit(TrialStarted(step=step, option=option.name, value=jsonable(value), steps=command.steps,
                                         source=command.source))
        arms = []
        for arm, label in enumerate((changed, AS_IT_IS), start=1):
            try:
                arms.append(self._arm(ArmRecord(label), TrialProgress(step=step, label=changed, arm=arm, done=0,
                                                                      steps=command.steps)).result())
            finally:
                self.checkpoints.restore(snapshot)  # the options too: the second arm runs as it is
        answer(arms)

    def _refusal(self, option: LiveOption, command: TrialCommand) -> str | None:
        """Why this trial cannot run now, or None."""
        if option.name in NOT_TRIED:
            return NOT_TRIED[option.name]
        if not 1 <= command.steps <= MAX_TRIAL_STEPS:
            return f"a trial runs 1 to {MAX_TRIAL_STEPS} steps an arm, got {shown(command.steps)}"
        if self.profiling.recording is not None:
            return "a profile is recording; try again once it is ready"
        return None

    def _arm(self, record: ArmRecord, progress: TrialProgress) -> ArmRecord:
        """One arm's steps, measured into ``record``. Its loss turning NaN, or the CPU's memory running out,
        ends the arm with the reason; with ranks, running out of memory stops the run (``TrialOutOfMemory``)."""
        self._report_progress(progress, now=True)
        neighbours = OthersCpuMeter()
        neighbours.start()
        try:
            for index in range(progress.steps):
                report = self.train_step(StepPlan(memory=index == MEMORY_STEP and self.parts.world.reports, trial=True))
                record.losses.append(report.loss)
                if index not in (0, MEMORY_STEP):  # the first pays the change's one-off costs, the other the memory hooks
                    record.step_times.append(report.step_time_s)
                if report.memory is not None:
                    record.memory = report.memory
                progress = TrialProgress(step=progress.step, label=progress.label, arm=progress.arm, done=index + 1,
                                         steps=progress.steps)
                self._report_progress(progress)
        except TrialStopped as stopped:
            record.error = f"the loss became {stopped.loss} at its step {len(record.losses) + 1}"
        except Exception as error:
            if not out_of_memory(error):
                raise
            world = self.parts.world
            if world.collectives is not None:  # the other ranks wait inside this step's collectives
                saved = None if self.checkpoints.directory is None else progress.step - 1
                raise TrialOutOfMemory(record.label, len(record.losses) + 1, progress.steps, world.size, saved, error) from error
            record.error = f"out of memory: {str(error).splitlines()[0]}"
        finally:
            record.others_cpu_percent = neighbours.stop()
        return record

    def _report_progress(self, progress: TrialProgress, now: bool = False) -> None:
        """At most every ``TRIAL_PROGRESS_INTERVAL_S`` (an arm's start at once): the app's header and the bar
        say how far a trial is, which no step report does while one runs. Rank 0 reports for every rank."""
        if not self.parts.world.reports:
            return
        clock = time.monotonic()
        if now or clock - self._progress_at >= TRIAL_PROGRESS_INTERVAL_S:
            self._progress_at = clock
            self.parts.reporter.emit(progress)


class TrialStopped(Exception):
    """An arm that cannot go on: its loss became ``loss`` (NaN or Inf). The trial reports it, and training goes on."""

    def __init__(self, loss: float) -> None:
        super().__init__(f"the loss became {loss}")
        self.loss = loss


class ArmRecord:
    """What one arm measured as it ran."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.step_times: list[float] = []
        self.losses: list[float] = []
        self.memory: MemoryBreakdown | None = None
        self.error: str | None = None
        self.others_cpu_percent: float | None = None  # OthersCpuMeter's, over the arm

    def result(self) -> TrialArm:
        interval = median_interval(self.step_times)
        return TrialArm(
            label=self.label,
            steps=len(self.losses),
            median_step_time_s=statistics.median(self.step_times) if self.step_times else None,
            step_time_low_s=interval[0] if interval else None,
            step_time_high_s=interval[1] if interval else None,
            activations_bytes=self.memory.activations_bytes if self.memory else None,
            tensor_bytes=self.memory.total_bytes if self.memory else None,
            losses=list(self.losses),
            error=self.error,
            others_cpu_percent=self.others_cpu_percent,
        )


class TrialOutOfMemory(RuntimeError):
    """With ranks, an arm that ran out of memory on this rank: the other ranks are inside the step's collectives
    and cannot leave the arm with it, so the run stops (the launcher stops the other ranks) rather than let
    their steps pair up with the wrong ones. The trainer saved a checkpoint before the trial to resume from."""

    def __init__(self, arm: str, step: int, steps: int, world_size: int, saved_step: int | None, error: BaseException) -> None:
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        if saved_step is None:
            then = "Nothing was saved before the trial (this run keeps no checkpoints)."
        elif saved_step == 0:
            then = "It had not trained a step before the trial: start it again."
        else:
            then = (f"It was saved at step {saved_step}, before the trial: resume it (restart in the app, or --resume "
                    f"RUN_DIR) to go on from there as if the trial had not run.")
        super().__init__(
            f"out of memory in a trial's arm {arm!r} at its step {step} of {steps} ({first_line}). With {world_size} "
            f"ranks one rank cannot leave an arm alone (the others wait in its collectives), so the run stopped. {then}"
        )
