"""What the app works out from the run's state rather than being told: the value an option's key cycles from,
why the trainer would refuse a value, the ETA, whether the ranks are worth their space, whether a trial runs.

A part of ``RunState`` (state.py), whose other parts declare the fields and fold the events into them; this class
only reads them. A mixin, so that widgets and tests keep asking the state itself (``state.eta_s()``,
``state.world_size``).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from torchlab.core.wire import protocol
from torchlab.core.wire.events import COMPILING
from torchlab.core.options import format_option_value
from torchlab.core.wire.run_status import RunStatus
from torchlab.tui.unchecked_numbers import int_or_none

#: The states in which no trainer is left to answer a key, and how the app says so (the same words for
#: every key: space, an option, a profile, a checkpoint).
ENDED = {
    RunStatus.FINISHED: "the run is finished",
    RunStatus.STOPPED: "the run is stopped",
    RunStatus.FAILED: "the run failed",
    RunStatus.DETACHED: "the app has detached from the run",
}

#: The ETA waits for this many measured steps. A trainer's first steps take many times a later one's (its start-up,
#: a compile, cold caches): at step 1 of a 20 s run the mean said 7:34. The median of the recent steps then passes
#: over them as long as they are fewer than half.
ETA_MIN_STEPS = 8


class RunFigures:
    """The figures ``RunState`` derives from its fields, for the widgets and the keys."""

    def option(self, name: str) -> Any:
        """The value in force, or the one requested and not yet answered (so repeated keys cycle on)."""
        if name in self.pending:
            return self.pending[name]
        return self.options.get(name)

    @property
    def ended(self) -> str | None:
        """How the app says that no trainer is left to answer a key ("the run is finished"); None while one is."""
        return ENDED.get(self.state)

    def changed_since_checkpoint(self) -> dict[str, Any]:
        """The options in force whose last change came after the newest checkpoint: a restart from it would
        go back to their earlier values unless it is told these (the error screen shows these values)."""
        if self.checkpoint_step is None:
            return {}
        return {name: self.options[name] for name, step in self._applied_at.items()
                if step > self.checkpoint_step and name in self.options}

    def was_refused(self, option: str, value: Any) -> bool:
        """The trainer refused ``option = value`` on this run (a key that cycles skips it from then on)."""
        return (option, format_option_value(option, value)) in self.refused

    def elapsed_now(self) -> float | None:
        """The run's training time now: the last report's, and while it runs the time since that report came (a
        trial or a compile sends no report for minutes: the header held 3:22 for three, then jumped)."""
        if self.elapsed_s is None or self.state != RunStatus.RUNNING:
            return self.elapsed_s
        return self.elapsed_s + math.floor(self.clock() - self.elapsed_at)  # whole seconds: it shows seconds

    @property
    def compiling(self) -> bool:
        """torch.compile compiles the model at a step's boundary: training waits for it (seconds to minutes)."""
        return self.state == RunStatus.RUNNING and self.state_detail == COMPILING

    def would_refuse(self, option: str, value: Any) -> str | None:
        """Why the trainer would refuse ``option = value`` on this run, in its words, from what the app knows: the
        device and the batch (its welcome), the machine's cores and GPUs (its system samples). None when the app
        knows no reason; the trainer still checks what only it knows.

        The app asks before it sends: a key that cycles skips such a value, a switch and a prompt refuse it with
        this reason. The trainer's checks are core/engine/precision.py (fp16), option_hooks.py (pinned memory) and
        distributed.py's ``check_world_size``; its own refusals, once made, are ``was_refused``.
        """
        device = self.device.split(":")[0]
        if not device:  # before the welcome
            return None
        if option == "amp" and value == "fp16" and device != "cuda":
            return f"fp16 needs CUDA; this run is on {device}: use bf16"
        if option == "pin_memory" and value and device != "cuda":
            return (f"pinned memory speeds up copies of batches from the host to a CUDA device; this run trains on "
                    f"{device}, where batches are not copied")
        if option == "world_size" and isinstance(value, int):
            return self._world_size_refusal(value, device)
        return None

    def _world_size_refusal(self, size: int, device: str) -> str | None:
        """A batch the ranks cannot share equally, or more ranks than the machine has GPUs (CUDA) or cores (CPU).
        The machine's figures are all its GPUs and cores: a run may be allowed fewer, which the trainer refuses."""
        batch = self.batch_size
        if batch and batch % size:
            return (f"world size {size} does not divide the batch of {batch} (the global batch stays {batch} and "
                    f"each rank takes an equal share): choose a divisor of {batch}")
        sample = self.telemetry
        if sample is None:
            return None
        if device == "cuda":
            gpus = len(sample.gpus)
            if gpus and size > gpus:
                return f"{size} ranks need {size} GPUs, one each; this machine has {gpus}"
            return None
        cores = sample.host.cpu_count
        if cores and size > cores:
            return f"{size} ranks on the CPU need {size} cores, one each; this machine has {cores}"
        return None

    def eta_s(self) -> float | None:
        """Seconds to the last step at the recent pace: the median of the recent steps' times, once ETA_MIN_STEPS
        were measured; None when unknown (``eta_pending`` says whether it will be known soon)."""
        if self.total_steps is None or self.state not in (RunStatus.RUNNING, RunStatus.STARTING):
            return None
        remaining = self.total_steps - self.step
        if remaining <= 0:
            return 0.0
        if len(self.recent_step_times) < ETA_MIN_STEPS:
            return None
        return remaining * statistics.median(self.recent_step_times)

    @property
    def eta_pending(self) -> bool:
        """The run trains towards a known last step, and too few steps were measured to say when it gets there."""
        return (self.total_steps is not None and self.state in (RunStatus.RUNNING, RunStatus.STARTING)
                and self.step < self.total_steps and len(self.recent_step_times) < ETA_MIN_STEPS)

    def within_run(self, path: str) -> str:
        """A path of the run as the user finds it in its directory (``checkpoints/step-0000400.pt``), or as given
        when it lies elsewhere: a whole path does not fit an 80-column event log."""
        run_dir = self.run_dir.rstrip("/")
        return path[len(run_dir) + 1 :] if run_dir and path.startswith(run_dir + "/") else path

    @property
    def world_size(self) -> int:
        """The number of ranks training now, as the trainer last said (1 before it said)."""
        value = int_or_none(self.options.get("world_size"))
        return value if value is not None and value > 0 else 1

    @property
    def has_ranks(self) -> bool:
        """Whether anything rank-related is worth its space: above world size 1, or relaunching to it."""
        return self.world_size > 1 or (self.state == RunStatus.RELAUNCHING and (self.relaunch_to or 1) > 1)

    def median_norm(self) -> float | None:
        values = [m.norm for m in self.modules if m.norm is not None and math.isfinite(m.norm)]
        return statistics.median(values) if values else None

    @property
    def after_detach(self) -> str:
        """What the run does once this app has detached: "keeps training" would be a lie about a paused run,
        which waits, holding its memory, until someone attaches (a stop or SIGTERM still ends it)."""
        if self.detached_paused:
            return "the run stays paused: nothing trains until you attach and resume it (space)"
        return "the trainer keeps training"

    def running_trial(self) -> protocol.TrialProgress | None:
        """The trial running now: its progress while training has not gone past the step it began at (progress
        is sent as the newest value, apart from the ordered events, so one may land after the trial's result)."""
        progress = self.trial_progress
        if progress is None or progress.step <= self.step or self.state != RunStatus.RUNNING:
            return None
        return progress
