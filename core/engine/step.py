"""One optimizer step, read top to bottom: training's, and each step of a trial's arm (core/engine/trials.py).

Split as torchtitan splits it: ``batches_to_loss`` (the step's micro-batches, cut in pieces, each forward and
backward) and the step around it::

    batches → loss and gradients     (retried one rung down by the OOM rescue, core/engine/guards/oom_rescue.py)
    → fp16 unscale → the mean loss (over ranks) → gradient norms → the step's one host transfer
    → the row held for this transfer sent → the spike guard's verdict → the non-finite stop
    → clip → the optimizer step (the update probe around it) → zero_grad → the LR schedule

Changing the step: these orders are what its figures and guards rely on.

- **Unscale before measuring.** Under fp16 the gradients are unscaled before their norms are measured or clipped: the
  figures and the clip limit are in true scale.
- **One host transfer.** The loss, the norms, the metrics and the last measured step's update figures go to the host
  together; clipping and every verdict read the host's copy (on CUDA the only sync of the step).
- **The held row after the transfer, before the update.** A measured step's row waits for its update figures,
  which this step's transfer read; it is sent before this step's update, so a row that cannot be written fails the
  run at the step it belongs to, whose checkpoint is the error's.
- **The guard before the precision's step.** A step the spike guard holds back takes no update, and its gradients
  are zeroed there (the next step must not add to them).
- **The non-finite stop before the optimizer step**, so the weights and the last checkpoint stay finite.
- **The update probe's copy just before the optimizer step**, measured against just after it.

What differs between training's step and a trial arm's is in its plan (``StepPlan``): whether it may be retried,
whether the guard judges it, what a NaN ends, whether its figures are training's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
import torch

from torchlab.core.engine.batch_split import split_batch
from torchlab.core.engine.guards.nonfinite import stop_on_nonfinite
from torchlab.core.engine.guards.oom_rescue import StepAttempts, with_rescue
from torchlab.core.engine.guards.spike_guard import SpikeGuard
from torchlab.core.engine.instruments import Instruments, StepPlan, StepWatch
from torchlab.core.engine.loss_output import mean_of_micro_batches
from torchlab.core.engine.measure.probes import GradNorms, clip_by_total_norm, clipped
from torchlab.core.engine.measure.step_report import StepReport, Update
from torchlab.core.engine.parts import TrainingParts
from torchlab.core.engine.trials import TrialStopped
from torchlab.core.wire.events import HELD_BACK


class OptimizerStep:
    """Training's step, and a trial arm's (see the module docstring). ``send_held_row``: the trainer's row waiting
    for this step's transfer."""

    def __init__(self, parts: TrainingParts, instruments: Instruments, guard: SpikeGuard,
                 send_held_row: Callable[[], None]) -> None:
        self.parts, self.instruments, self.guard, self.send_held_row = parts, instruments, guard, send_held_row

    def __call__(self, plan: StepPlan) -> StepReport:
        parts, step = self.parts, self.parts.progress.step + 1
        watch = self.instruments.watch(plan, step)
        attempts = StepAttempts(retries=plan.retries)
        with watch.counting_flops():
            losses, metrics = with_rescue(parts, step, attempts, lambda: self.batches_to_loss(plan, step, watch, attempts),
                                          self.instruments.memory_at_failure, self.instruments.last_memory)
        if step < parts.config.steps:
            parts.data.fetch_ahead()  # CUDA: the next step's batch, while the device runs the backward
        parts.precisions.current.unscale_(parts.optimization.optimizer)
        loss, mean_metrics = mean_of_micro_batches(losses, metrics)
        if parts.world.collectives is not None:  # every rank sees the same loss, and stops on the same NaN
            with watch.phase("communication"):
                loss, mean_metrics = parts.world.collectives.mean_loss(loss, mean_metrics)
        norms = watch.gradients(clipping=parts.options.clip is not None or self.guard.on)
        host = watch.to_host(loss, norms, mean_metrics)
        if plan.training:
            watch.outside_the_step(self.send_held_row)
        update = self._update(plan, step, watch, host.scalar("loss"), host.scalar("grad_norm_total"), norms)
        return watch.finish(host, update)

    def _update(self, plan: StepPlan, step: int, watch: StepWatch, loss: float, total_norm: float | None,
                norms: GradNorms | None) -> Update:
        """The step's optimizer step, judged by its loss and total norm on the host: held back by the spike guard,
        stopped where they are not finite, else clipped, taken, and the LR schedule moved on."""
        parts, clip = self.parts, self.parts.options.clip
        optimizer, precision = parts.optimization.optimizer, parts.precisions.current
        update = Update(parts.options, loss, total_norm, clipped(total_norm, clip), False,
                        [group["lr"] for group in optimizer.param_groups])
        spike = self.guard.judge(step, loss, total_norm) if plan.guarded else None
        if spike is not None and spike.action in HELD_BACK:
            optimizer.zero_grad(set_to_none=True)
            update.spike = self.guard.hold_back(spike).action
            return update
        if not precision.tolerates_nonfinite and not _finite(loss, total_norm):
            self._stop_on_nonfinite(plan, step, loss, total_norm)
        if clip is not None and norms is not None:
            clip_by_total_norm(norms, clip, total_norm)
        self.guard.before_update()
        update.stepped = watch.measured_update(lambda: precision.step(optimizer))  # its phase timed inside
        with watch.phase("optimizer"):
            optimizer.zero_grad(set_to_none=True)
            parts.optimization.step_schedule(parts.optimization.per_epoch and parts.data.finished_epoch())
        if spike is not None:  # let through: the guard is off (a notice), or a new level
            self.guard.report(spike)
            update.spike = spike.action
        return update

    def batches_to_loss(self, plan: StepPlan, step: int, watch: StepWatch,
                        attempts: StepAttempts) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """The step's forward and backward passes, ``accum`` micro-batches of ``split`` pieces each (a retry's batches
        are those its attempts took): each micro-batch's loss and metrics, on the device. Each piece's loss is
        weighted by its share of the samples (or of the items: ``Workload.loss_items``), so that the gradients add
        up to those of the mean's."""
        parts, precision, data = self.parts, self.parts.precisions.current, self.parts.data
        accum, split, taken = parts.options.accum, parts.options.split, attempts.batches
        model = parts.model.for_step(eager=plan.activations)  # hooks added to a compiled model would not fire
        losses, metrics = [], []
        weights, cut = None, []
        if parts.workload.loss_items is not None:  # every batch first: the items of all of them are counted
            while len(taken) < accum:
                taken.append(data.next_batch())
            cut = [split_batch(batch, split) for batch in taken]
            weights = parts.loss.item_weights([[piece for piece, _ in pieces] for pieces in cut], parts.world.collectives)
        for micro in range(accum):
            if micro == len(taken):
                taken.append(data.next_batch())
            if micro == 0:
                self._before_first_forward(step, attempts)
            pieces = cut[micro] if cut else split_batch(taken[micro], split)
            for index, (piece, share) in enumerate(pieces):
                weight = weights[micro][index] if weights is not None else share
                as_is = weights is None and share == 1  # the batch itself, uncut: its loss as it is
                with parts.model.gradient_sync(micro == accum - 1 and index == len(pieces) - 1):
                    with watch.forward(), watch.census(), watch.phase("forward"), precision.autocast():
                        loss, metric_values = parts.loss(model, piece, step)
                    with watch.phase("backward"):
                        precision.backward(loss if as_is and accum == 1 else loss * (weight / accum))
                weighted = loss.detach() if as_is else loss.detach().float() * weight
                weighted_metrics = metric_values if as_is or metric_values is None else metric_values * weight
                if index == 0:
                    losses.append(weighted)
                    metrics.append(weighted_metrics)
                else:
                    losses[-1] = losses[-1] + weighted
                    metrics[-1] = metrics[-1] + weighted_metrics if metric_values is not None else None
        return losses, metrics

    def _before_first_forward(self, step: int, attempts: StepAttempts) -> None:
        """Where the run is, for a loss that depends on it (the epoch of the step's first batch); torch's generators,
        for a retry."""
        parts = self.parts
        if parts.workload.before_step is not None:
            parts.workload.before_step(step, parts.data.epoch_of_taken(len(attempts.batches)))
        attempts.first_forward(parts.device)

    def _stop_on_nonfinite(self, plan: StepPlan, step: int, loss: float, total_norm: float | None) -> None:
        """NaN/Inf stops the run before the optimizer step (under fp16 it is routine overflow: the precision skips the
        step instead). In a trial's arm a NaN loss ends the arm, and training goes on."""
        if plan.training:
            self.raise_nonfinite(step, loss, total_norm)
        if not math.isfinite(loss):
            raise TrialStopped(loss)

    def raise_nonfinite(self, step: int, loss: float, total_norm: float | None) -> None:
        """Stop the run on a non-finite loss or gradient at ``step``, with the phase that made it: the step's last
        batch is run again, alone, to find it (core/engine/guards/nonfinite.py)."""
        parts = self.parts
        precision, batch = parts.precisions.current, parts.data.last_batch

        def replay() -> torch.Tensor:
            with precision.autocast():
                return parts.loss.alone(parts.model.model, batch)

        stop_on_nonfinite(step, loss, total_norm, model=parts.model.model, optimizer=parts.optimization.optimizer,
                          run_loss=replay, batch=batch)


def _finite(loss: float, total_norm: float | None) -> bool:
    return math.isfinite(loss) and (total_norm is None or math.isfinite(total_norm))
