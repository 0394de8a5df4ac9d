"""Controlled trials: "what would bf16 do?", measured on this run rather than guessed, then undone.

A trial of ``option = value`` at a step boundary copies the training state (``TrainingSnapshot``: the
model's state dict, the optimizer's, the schedule's, the GradScaler, every RNG and the data position),
runs K steps with the option changed, puts the state back, runs K steps as it is, on the same batches
from the same state, and puts the state back again. Training then goes on exactly as if no trial had
run: the same weights, optimizer moments, LR, random numbers and next batch, so a run with a trial and
a run without one have bit-identical losses at every training step (``tests/test_trials.py``).

The copy is in memory (a clone of each tensor), not a checkpoint on disk: a trial costs its 2K steps,
a state dict's copy and two loads. Each arm reports what the impact table would: its step time (median
and 90 % interval), its memory by kind on one step, and the loss of each step.
"""

from __future__ import annotations

import copy
import statistics
from dataclasses import dataclass
from typing import Any

import torch

from torchlab.core.engine.checkpoint import capture_rng_state, restore_rng_state
from torchlab.core.engine.data import DataPosition
from torchlab.core.wire.impact import median_interval
from torchlab.core.wire.payloads import MemoryBreakdown, TrialArm

#: The step of an arm whose memory is measured: its second, once the first paid its one-off costs.
MEMORY_STEP = 1


@dataclass
class TrainingSnapshot:
    """Everything a training step reads and changes, copied at a step boundary (see the module docstring)."""

    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    grad_scaler: dict[str, Any] | None
    rng: dict[str, Any]
    data: DataPosition

    @classmethod
    def take(cls, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, grad_scaler: dict[str, Any] | None,
             data: DataPosition) -> TrainingSnapshot:
        return cls(
            model={name: tensor.detach().clone() for name, tensor in model.state_dict().items()},
            optimizer=copy.deepcopy(optimizer.state_dict()),
            scheduler=copy.deepcopy(scheduler.state_dict()),
            grad_scaler=copy.deepcopy(grad_scaler),
            rng=capture_rng_state(),
            data=DataPosition(data.epoch, data.samples),
        )

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
        """Put the model, optimizer, schedule and RNG back (the caller restores the GradScaler, the data
        position and the options, which live in objects of its own)."""
        model.load_state_dict(self.model)  # copied into the same tensors: the optimizer's still hold them
        optimizer.zero_grad(set_to_none=True)
        optimizer.load_state_dict(copy.deepcopy(self.optimizer))
        scheduler.load_state_dict(copy.deepcopy(self.scheduler))
        restore_rng_state(self.rng)


class TrialStopped(Exception):
    """An arm that cannot go on (its loss became NaN): the trial reports it, and training goes on."""


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
