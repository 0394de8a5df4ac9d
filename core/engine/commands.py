"""The step boundary: commands queue here from any thread, and apply between optimizer steps.

Anything may *request* a change at any time (``submit``); the loop applies queued requests only at a step
boundary, after a full accumulation cycle, and each answers with the step it took effect at. Scripted changes
(``--at``, ``--trial``, ``--profile-at``) enter through the same queue when their step comes, so they exercise
the same path as the app's keys. While paused, the boundary waits for the next command.

With ranks, rank 0 alone takes commands; at each boundary it broadcasts the commands it took (as many as fit
one packet, then more packets) with its decisions for the next step (core/engine/instruments.py ``NextStep``),
so every rank applies the same changes at the same step (core/engine/parallel/distributed.py).

What each command does is its owner's: ``set`` the option hooks (core/engine/option_hooks.py), ``trial`` the
trials (core/engine/trials.py), ``profile`` the profiler (core/engine/measure/profiler.py), ``save_checkpoint`` the
checkpointer (core/engine/checkpointer.py). Pause, resume and stop are the boundary's own; a stop, or a change that
takes new ranks (a world size, ``parallel``: a relaunch), ends the run after this boundary (``ends_run``).
"""

from __future__ import annotations

import queue
import time

from torchlab.core.engine.checkpointer import Checkpointer
from torchlab.core.engine.parallel.distributed import packet_fits
from torchlab.core.engine.parallel import preemption
from torchlab.core.engine.instruments import Instruments, NextStep
from torchlab.core.engine.option_hooks import apply_change
from torchlab.core.engine.outcome import Relaunch
from torchlab.core.engine.parts import TrainingParts
from torchlab.core.engine.measure.profiler import Profiling
from torchlab.core.engine.trials import Trials
from torchlab.core.wire import protocol as p
from torchlab.core.wire.events import Paused, Resumed, StopRequested
from torchlab.core.wire.protocol import (
    PauseCommand, ProfileCommand, ResumeCommand, SaveCheckpointCommand, SetCommand, StopCommand, TrainerCommand, TrialCommand,
    trainer_command,
)

#: With ranks, the per-rank figures (step time, data wait, memory, RSS) are gathered at most this often.
RANK_FIGURES_INTERVAL_S = 1.0


class StepBoundary:
    """The command queue and what happens between two optimizer steps (see the module docstring)."""

    def __init__(self, parts: TrainingParts, instruments: Instruments, checkpoints: Checkpointer, trials: Trials,
                 profiling: Profiling) -> None:
        self.parts, self.instruments, self.checkpoints, self.trials, self.profiling = parts, instruments, checkpoints, trials, profiling
        self._commands: queue.Queue[TrainerCommand] = queue.Queue()
        self.paused = False
        self.stop: StopCommand | None = None
        self.relaunch: Relaunch | None = None
        #: the signal that asked this run to stop and the rank it reached ("SIGTERM to rank 1"), once a boundary took it
        self.stopped_by = ""
        self._signalled_stop: StopCommand | None = None
        self._signal_number = 0

    # ----------------------------------------------------------------- any thread
    def submit(self, command: TrainerCommand) -> None:
        """Queue a command; it is applied at the next optimizer-step boundary."""
        self._commands.put(command)

    def request_stop(self, reason: str, signal_number: int = 0) -> None:
        """Stop at the next boundary; ``signal_number``: the signal that asked (0: a launcher's own stop). Safe in a
        signal handler: attribute stores, no lock taken (``submit`` takes the queue's lock, which the interrupted main
        thread may hold). With ranks, any rank's signal stops every rank at the same boundary (``_share``)."""
        self._signal_number = signal_number
        self._signalled_stop = StopCommand(reason)

    def stop_asked(self) -> str | None:
        """The reason of a stop asked and not yet taken (a signal's, or a queued stop command's), else None: what the
        hang watch ends a hung run for, from its own thread (no boundary comes to take it)."""
        if self._signalled_stop is not None:
            return self._signalled_stop.reason
        with self._commands.mutex:
            return next((command.reason for command in self._commands.queue if isinstance(command, StopCommand)), None)

    def pending(self) -> list[TrainerCommand]:
        """Commands still queued (after the run ended): a supervisor hands them to the next trainer. A run paused at
        the boundary of a relaunch (a pause and a world-size change there) is paused by its first: a relaunch is no
        resume the user asked for (a run detached so stays paused)."""
        commands: list[TrainerCommand] = [PauseCommand()] if self.paused and self.relaunch is not None else []
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands

    # ----------------------------------------------------------------- the training thread
    @property
    def ends_run(self) -> bool:
        """A stop was taken, or a change that takes new ranks (a relaunch): no step follows this boundary."""
        return self.stop is not None or self.relaunch is not None

    def apply(self) -> None:
        """The boundary before the next step: queue its scripted entries, then apply every queued command (with
        ranks, every rank the same ones); while paused, wait for more."""
        reports, collectives = self.parts.world.reports, self.parts.world.collectives
        self._queue_scripted()
        unsent: list[TrainerCommand] = []
        while True:
            commands = self._take() if reports else []
            more = False
            if collectives is not None:
                commands, more = self._share(unsent + commands, unsent)
            for command in commands:
                # The checkpoint of the step before is reported before what the command does (paused at
                # step 46 comes after step 46's checkpoint), and never left waiting for a pause to end.
                self.checkpoints.finish()
                self._handle(command)
            if not (self.paused and not self.ends_run) and not more:
                return

    def _queue_scripted(self) -> None:
        """The ``--at``, ``--trial`` and ``--profile-at`` entries of the next step. A relaunched run has already
        queued those of the boundary it was relaunched at (``scripted_through``)."""
        config, progress = self.parts.config, self.parts.progress
        next_step = progress.step + 1
        if self.parts.world.reports and next_step > progress.scripted_through:
            for change in config.at:
                if change.step == next_step:
                    self.submit(SetCommand(change.option, change.value, source="--at"))
            for trial in config.trials:  # after the changes of this boundary: tried from where they leave it
                if trial.step == next_step:
                    self.submit(TrialCommand(trial.option, trial.value, config.trial_steps, source="--trial"))
            if next_step in config.profile_at:
                self.submit(ProfileCommand(config.profile_steps, source="--profile-at"))
        progress.scripted_through = max(progress.scripted_through, next_step)

    def _take(self) -> list[TrainerCommand]:
        """What is queued; while paused, wait up to 0.25 s for the first. A signalled stop (Ctrl-C, SIGTERM) is taken
        alone: nothing else starts once the user asked to stop, and what was queued stays queued (``pending``: handed
        on, or queued again by a resume's scripted entries)."""
        commands: list[TrainerCommand] = []
        waits = self.paused and not self.ends_run
        # Nearly every boundary finds the queue empty: said by ``empty()``, not by raising ``queue.Empty``.
        if self._signalled_stop is None and (waits or not self._commands.empty()):
            try:
                commands.append(self._commands.get(block=waits, timeout=0.25))
                while True:
                    commands.append(self._commands.get_nowait())
            except queue.Empty:
                pass
        if self._signalled_stop is not None:
            commands.append(self._signalled_stop)
            if self._signal_number and self.parts.world.collectives is None and not self.stopped_by:
                self.stopped_by = preemption.stopped_by(self._signal_number, None)
                self.parts.reporter.emit(StopRequested(step=self.parts.progress.step, reason=self._signalled_stop.reason))
        return commands

    def _share(self, commands: list[TrainerCommand], unsent: list[TrainerCommand]) -> tuple[list[TrainerCommand], bool]:
        """Rank 0's commands (as many as fit one packet; ``unsent`` keeps the rest) to every rank, with rank 0's
        decisions for the next step. Returns the commands and whether more packets follow at this boundary."""
        payload = None
        if self.parts.world.reports:
            payload = {**self._decisions(), "commands": []}
            unsent.clear()
            for index, command in enumerate(commands):
                payload["commands"].append(command.json_text())  # the protocol's own line
                if not packet_fits({**payload, "more": True}):
                    payload["commands"].pop()
                    unsent.extend(commands[index:])
                    break
            payload["more"] = bool(unsent)
        packet = self.parts.world.collectives.share(payload, signalled=self._signal_number)
        self.instruments.next_step = NextStep(probe=bool(packet["probe"]), figures=bool(packet["figures"]),
                                              checkpoint=bool(packet["checkpoint"]))
        commands = [trainer_command(line) for line in packet["commands"]]
        if packet["signalled"] and not self.stopped_by:  # a signal reached some rank: every rank stops here, as one
            self.stopped_by = preemption.stopped_by(packet["signalled"], packet["signalled_rank"])
            reason = preemption.stop_reason(packet["signalled"], packet["signalled_rank"])
            if self.parts.world.reports:
                self.parts.reporter.emit(StopRequested(step=self.parts.progress.step, reason=reason))
            if not any(isinstance(command, StopCommand) for command in commands):
                commands.append(StopCommand(reason))
        return commands, bool(packet["more"])

    def _decisions(self) -> dict[str, bool]:
        """Rank 0's decisions for the next step. Per-rank figures are for the live table and the straggler verdict
        (core/analysis/stragglers.py): gathered on report steps that are the probe's (its cadence is the overhead's
        budget) or at least RANK_FIGURES_INTERVAL_S after the last, not at the price of one more collective a step."""
        next_step, instruments = self.parts.progress.step + 1, self.instruments
        probe = instruments.cadence.should_probe(next_step)
        figures = instruments.is_report_step(next_step) and (
            probe or time.monotonic() - instruments.figures_gathered_at >= RANK_FIGURES_INTERVAL_S)
        return {"probe": probe, "figures": figures, "checkpoint": self.checkpoints.cadence.due(next_step)}

    def _handle(self, command: TrainerCommand) -> None:
        parts = self.parts
        next_step = parts.progress.step + 1
        match command:
            case SetCommand():
                self.relaunch = apply_change(parts, command, next_step) or self.relaunch
            case PauseCommand() if not self.paused:
                self.paused = True
                parts.reporter.emit(Paused(step=parts.progress.step))
            case ResumeCommand() if self.paused:
                self.paused = False
                parts.reporter.emit(Resumed(step=next_step))
            case StopCommand():
                self.stop = command
                self.paused = False
                if self.relaunch is not None:  # a stop wins over a relaunch asked for at the same boundary
                    change, self.relaunch = self.relaunch, None
                    parts.options = parts.options.with_value(change.option, change.previous)
                    parts.reporter.emit(p.OptionRefused(step=next_step, option=change.option, value=change.value,
                                                        reason="the run stops at this step", source=change.source))
            case SaveCheckpointCommand() if parts.progress.step > 0:
                self.checkpoints.save(reason="requested")
            case ProfileCommand() if parts.world.reports:  # one profile per run: rank 0's
                self.profiling.start(command, next_step)
            case TrialCommand():
                self.trials.run(command, next_step)  # every rank: their steps' collectives pair up
