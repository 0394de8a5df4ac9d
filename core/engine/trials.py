"""Controlled trials: "what would bf16 do?", measured on this run rather than guessed, then undone.

A trial of ``option = value`` at a step boundary copies the training state (``Checkpointer.snapshot``: each
part a step changes gives its ``state_dict``: the model's, the optimizer's and the schedule's, the GradScaler,
every RNG, the data position, and the live options) and runs two arms of K steps from it, on the same batches:
the option changed (the options part's ``load_state_dict`` enacts it) and as it is. Then it puts the state back,
and training goes on exactly as if no trial had run: the same weights, optimizer moments, LR, random numbers and
next batch, so a run with a trial and a run without one have bit-identical losses at every training step
(``tests/engine/test_trials.py``). An arm's steps are training's own step (``Trainer.train_step``), planned to report
nothing (``StepPlan.trial``).

**Interleaved.** The arms do not run one after the other, where a load that came between them would decide
their speeds: they alternate in blocks of about ``BLOCK_STEPS`` steps, A B B A A B ..., the i-th block of each
arm being the same steps of it on the same batches, one right after the other. Each block goes on from where its
arm's previous block ended: leaving an arm copies its state (``snapshot``), entering the other loads that arm's
copy (``restore``, without a second copy: each is loaded once). So each arm's K steps are the K consecutive steps
from the snapshot that one arm run whole would take, bit for bit (its losses compare as before); what interleaving
adds is a copy and a load at each change of arm (one every two blocks, A B B A), measured by
``benchmarks/trial_cost.py``. The pairs of blocks give the speed verdict
(core/analysis/trial_speed.py): a pair's two blocks run within a fraction of a second of each other, so a
neighbour's load or a VM's drift falls on both. Where K steps' pairs leave the interval wide (``precise_enough``),
the arms go on in blocks past their K steps, for timing alone, until it is narrow or they reach ``timing_cap(K)``
steps each: those steps' losses are not compared, and one that turns NaN or runs out of memory ends the timing,
not the arm. With ranks, rank 0's figures decide for every rank (their steps' collectives pair up).

Each arm reports what the impact table would: its step time (median and 90 % interval, of all its steps but its
first and its memory step), its memory by kind on one step, and the loss of each step. A block's figure for its
pair is the median of its steps but its first (which pays for the change of arm: the data stream reopened at the
arm's position, caches cold) and the memory step (its hooks).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

from torchlab.core.analysis.step_times import median_interval
from torchlab.core.analysis.trial_speed import paired_speed, precise_enough
from torchlab.core.analysis.trial_words import AS_IT_IS, NOT_TRIED
from torchlab.core.engine.checkpointer import Checkpointer
from torchlab.core.engine.instruments import StepPlan
from torchlab.core.engine.measure.memory import out_of_memory
from torchlab.core.engine.option_hooks import for_this_device, jsonable
from torchlab.core.engine.parts import TrainingParts
from torchlab.core.engine.measure.profiler import Profiling
from torchlab.core.engine.measure.step_report import StepReport
from torchlab.core.engine.measure.telemetry import OthersCpuMeter
from torchlab.core.errors import shown
from torchlab.core.records.settings import MAX_TRIAL_STEPS
from torchlab.core.wire import protocol as p
from torchlab.core.wire.events import TrialStarted
from torchlab.core.options import ACCUM, AMP, LiveOption, OptionChangeError, live_option
from torchlab.core.wire.payloads import MemoryBreakdown, TrialArm, TrialSpeed
from torchlab.core.wire.protocol import TrialCommand, TrialProgress

#: Steps in a block of an arm (K // BLOCK_STEPS blocks an arm, K spread evenly over them: at least one). Short, so
#: that a pair's two timed steps run within a few steps of each other (a busy machine's speed moves over tenths of
#: a second) and a trial of K = 20 has ten pairs; the price is a change of arm (a state copy and a load, about a
#: step of a small model) every two blocks.
BLOCK_STEPS = 2
#: A trial times past its K steps an arm (while its interval is wide) up to 5K steps an arm and at most this many,
#: never fewer than K: a trial of 20 steps on a noisy machine takes up to five times as long, not more.
TIMING_STEPS_CAP = 100
#: A running trial says how far it is at most this often (and at each arm's start).
TRIAL_PROGRESS_INTERVAL_S = 0.25


class Trials:
    """Runs the trials asked for at a boundary, each arm's steps with ``train_step`` (see the module docstring)."""

    def __init__(self, parts: TrainingParts, train_step: Callable[[StepPlan], StepReport], checkpoints: Checkpointer,
                 profiling: Profiling) -> None:
        self.parts, self.train_step, self.checkpoints, self.profiling = parts, train_step, checkpoints, profiling
        self._progress_at = -float("inf")
        self._samples_ratio = 1.0  # the trial's changed arm's samples a step over the arm as it is (``run``)

    def run(self, command: TrialCommand, step: int) -> None:
        """Two arms of ``command.steps`` steps from this boundary's state on the same batches, the option changed
        and as it is, interleaved; then the state as it was. Answered by one TrialResult, or one that says why it
        could not run."""
        parts = self.parts

        def answer(arms: list, error: str | None = None, speed: TrialSpeed | None = None) -> None:
            parts.reporter.emit(p.TrialResult(step=step, option=command.option, value=jsonable(command.value),
                                              steps=command.steps, arms=arms, error=error, source=command.source,
                                              speed=speed))

        try:
            option = live_option(command.option)
            value = for_this_device(parts, option, option.parse(command.value))
        except OptionChangeError as refusal:
            return answer([], str(refusal))
        refusal = self._refusal(option, value, command)
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
        except OptionChangeError as refusal:
            self.checkpoints.restore(snapshot)
            return answer([], f"{changed} cannot run here: {refusal}")
        # A step of the changed arm trains this many times the samples of one as it is (accum): timed per sample.
        self._samples_ratio = value / snapshot["options"][ACCUM.name] if option is ACCUM else 1.0
        parts.reporter.emit(TrialStarted(step=step, option=option.name, value=jsonable(value), steps=command.steps,
                                         source=command.source))
        arms = [ArmRecord(changed), ArmRecord(AS_IT_IS)]
        neighbours = OthersCpuMeter()
        neighbours.start()
        try:
            self._interleave(arms, snapshot, TrialProgress(step=step, label=changed, arm=1, done=0, steps=command.steps))
        finally:
            self.checkpoints.restore(snapshot, last_use=True)  # the options too: training goes on as it is
        others_cpu_percent = neighbours.stop()  # over the whole trial: its arms take turns
        for arm in arms:
            arm.others_cpu_percent = others_cpu_percent
        speed = None if any(arm.error for arm in arms) else paired_speed(arms[0].block_times, arms[1].block_times,
                                                                         arms[0].timed_steps, self._samples_ratio)
        answer([arm.result() for arm in arms], speed=speed)

    def _interleave(self, arms: list[ArmRecord], snapshot: dict, progress: TrialProgress) -> None:
        """The arms' blocks in turn, A B B A A B ...: each from where its arm's last block left it (the first arm's
        state is the live one, enacted; the second's begins as ``snapshot``). An arm that stopped runs no more blocks;
        the other runs the rest of its own. Past the K steps, blocks for timing alone while ``_times_on``."""
        saved: list[dict | None] = [None, snapshot]  # where each arm goes on from, while another runs
        live = 0  # the arm whose state the parts hold
        compared = progress.steps
        blocks = arm_blocks(compared)
        memory_step = blocks[1][0] if len(blocks) > 1 else 1  # a step no pair times: after a change of arm
        cap = timing_cap(compared)
        index = 0
        while True:
            if index < len(blocks):
                start, end = blocks[index]
            elif blocks[-1][1] < cap and self._times_on(arms):
                start, end = blocks[-1][1], min(blocks[-1][1] + BLOCK_STEPS, cap)
                blocks.append((start, end))
            else:
                return
            for arm in (0, 1) if index % 2 == 0 else (1, 0):
                if arms[arm].error is not None or any(record.timing_ended for record in arms):
                    continue  # an arm that stopped runs no more blocks; past K, neither does the other
                if arm != live:
                    if arms[live].error is None:
                        saved[live] = self.checkpoints.snapshot()
                    self.checkpoints.restore(saved[arm], last_use=saved[arm] is not snapshot)  # snapshot: again at the end
                    saved[arm], live = None, arm
                timing = start >= compared  # past K: the steps say how far the timing may go
                block = TrialProgress(step=progress.step, label=progress.label, arm=arm + 1, done=start,
                                      steps=cap if timing else compared, timing=timing)
                self._block(arms[arm], block, end, memory_step, compared)
            index += 1

    def _times_on(self, arms: list[ArmRecord]) -> bool:
        """Whether the arms time another pair of blocks past their K steps: while both run and their interval is
        wider than ``precise_enough`` allows. With ranks, rank 0's answer is every rank's."""
        more = not any(arm.error or arm.timing_ended for arm in arms) and not precise_enough(
            paired_speed(arms[0].block_times, arms[1].block_times, arms[0].timed_steps, self._samples_ratio))
        collectives = self.parts.world.collectives
        if collectives is not None:
            more = bool(collectives.share({"more": more} if self.parts.world.reports else None)["more"])
        return more

    def _refusal(self, option: LiveOption, value: object, command: TrialCommand) -> str | None:
        """Why this trial cannot run now, or None: asked before anything is spent (with ranks, the checkpoint before
        the arms), so a trial that cannot run writes nothing."""
        if option.name in NOT_TRIED:
            return NOT_TRIED[option.name]
        if option is AMP and (refusal := self.parts.precisions.in_place_refusal(value)) is not None:
            return f"{option.name}={option.format(value)} cannot run here: {refusal}"
        if not 1 <= command.steps <= MAX_TRIAL_STEPS:
            return f"a trial runs 1 to {MAX_TRIAL_STEPS} steps an arm, got {shown(command.steps)}"
        if self.profiling.recording is not None:
            return "a profile is recording; try again once it is ready"
        return None

    def _block(self, record: ArmRecord, progress: TrialProgress, end: int, memory_step: int, compared: int) -> None:
        """An arm's steps from ``progress.done`` to ``end``, measured into ``record`` (its memory on ``memory_step``,
        once the arm's first step paid the change's one-off costs; the losses of its first ``compared``). Its loss
        turning NaN, or the CPU's memory running out, ends the arm with the reason (past ``compared``, the timing
        alone); with ranks, running out of memory stops the run (``TrialOutOfMemory``)."""
        self._report_progress(progress, now=progress.done == 0)
        start, timed = progress.done, []
        try:
            for index in range(start, end):
                report = self.train_step(StepPlan.trial(memory=index == memory_step and self.parts.world.reports))
                if index < compared:
                    record.losses.append(report.loss)
                if index not in (0, memory_step):  # the arm's first pays the change's one-off costs, the other the hooks
                    record.step_times.append(report.step_time_s)
                    if index != start:  # a block's first pays for the change of arm: its pair's figure leaves it out
                        timed.append(report.step_time_s)
                if report.memory is not None:
                    record.memory = report.memory
                record.timed_steps = index + 1
                progress = dataclasses.replace(progress, done=index + 1)
                self._report_progress(progress)
        except TrialStopped as stopped:
            if start >= compared:
                record.timing_ended = True
            else:
                record.error = f"the loss became {stopped.loss} at its step {len(record.losses) + 1}"
        except Exception as error:
            if not out_of_memory(error):
                raise
            world = self.parts.world
            if world.collectives is not None:  # the other ranks wait inside this step's collectives
                saved = None if self.checkpoints.directory is None else progress.step - 1
                raise TrialOutOfMemory(record.label, record.timed_steps + 1, progress.steps, world.size, saved, error) from error
            if start >= compared:
                record.timing_ended = True
            else:
                record.error = f"out of memory: {str(error).splitlines()[0]}"
        finally:
            ended = record.error is not None or record.timing_ended
            record.block_times.append(statistics.median(timed) if timed and not ended else None)

    def _report_progress(self, progress: TrialProgress, now: bool = False) -> None:
        """At most every ``TRIAL_PROGRESS_INTERVAL_S`` (an arm's start at once): the app's header and the bar
        say how far a trial is, which no step report does while one runs. Rank 0 reports for every rank."""
        if not self.parts.world.reports:
            return
        clock = time.monotonic()
        if now or clock - self._progress_at >= TRIAL_PROGRESS_INTERVAL_S:
            self._progress_at = clock
            self.parts.reporter.emit(progress)


def timing_cap(steps: int) -> int:
    """The most steps an arm of a trial of ``steps`` runs to time its speed: 5K, at most ``TIMING_STEPS_CAP``, at
    least K."""
    return max(steps, min(5 * steps, TIMING_STEPS_CAP))


def arm_blocks(steps: int) -> list[tuple[int, int]]:
    """An arm's blocks as (first step, end) from 0: ``steps // BLOCK_STEPS`` of them (at least one), as even as can be."""
    count = max(1, steps // BLOCK_STEPS)
    bounds = [steps * index // count for index in range(count + 1)]
    return list(zip(bounds, bounds[1:]))


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
        self.block_times: list[float | None] = []  # each block's median step time (None: none timed, or it stopped)
        self.timed_steps = 0  # the steps it ran: its K, and those past them for timing alone
        self.timing_ended = False  # a step past its K turned NaN or ran out of memory: no more timing
        self.losses: list[float] = []
        self.memory: MemoryBreakdown | None = None
        self.error: str | None = None
        self.others_cpu_percent: float | None = None  # OthersCpuMeter's, over the trial (its arms take turns)

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
