"""The workload contract: what a user hands to torchlab. Public API; keep it stable.

A workload file defines a zero-argument factory that returns a ``Workload``::

    from torchlab.core.workload import Workload

    def workload() -> Workload:
        return Workload(model=MyNet(), dataset=my_dataset, loss_fn=lambda model, batch: ...)

The factory runs in the trainer process only, after seeding, so model initialisation is reproducible.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset

from torchlab.core.errors import WorkloadError

LossFn = Callable[[torch.nn.Module, Any], torch.Tensor | Mapping[str, torch.Tensor]]
OptimizerFactory = Callable[[torch.nn.Module], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer, int], torch.optim.lr_scheduler.LRScheduler]


@dataclass(kw_only=True)
class Workload:
    """A model, its data, and how to compute a scalar loss from one batch. Each field:

    ``model`` (required): any ``torch.nn.Module``. The trainer moves it to the run's device; checkpoints hold its
    own state dict.

    ``dataset`` (required): any map-style (``__getitem__`` and ``__len__``) or iterable torch ``Dataset``. A
    map-style one is shuffled each epoch from ``--seed``; the batches and their order are the same whatever the
    number of data-loader workers.

    ``loss_fn(model, batch)`` (required) returns the loss, a scalar floating-point tensor, or a mapping with
    ``"loss"`` and the workload's own metrics, each a scalar tensor or a number (``{"loss": loss, "accuracy":
    acc}``, Lightning's ``training_step`` convention). The batch is the loader's, on the device (tensors inside
    tuples, lists, dicts and namedtuples moved). The metrics are reduced on the device with the loss (no extra
    host transfer), averaged over micro-batches and ranks, reported under ``metrics`` in ``metrics.jsonl``,
    evaluated on ``val_dataset`` too (``val_metrics``) and plotted by the app. The same names every step.

    ``val_dataset``: evaluated with ``loss_fn`` (no gradients, in order) every ``--eval-every`` steps and at
    the last, on its first ``--eval-batches`` batches: ``val_loss`` and ``val_metrics``. None: no evaluation.

    ``collate_fn``: makes one batch of a list of samples, for ``dataset`` and ``val_dataset`` (the
    ``DataLoader``'s ``collate_fn``). None: PyTorch's default, which stacks tensors.

    ``batch_size``: samples per micro-batch (with ranks, all ranks together). ``--batch-size`` overrides it;
    both None: 32.

    ``checkpoint_blocks`` names the submodules that activation checkpointing wraps (qualified names,
    as in ``model.named_modules()``); left as None, they are the children of the largest
    ``ModuleList``/``Sequential`` in the model.

    ``optimizer(model)`` (or ``optimizer(model, total_steps)``, for an optimizer built together with its
    schedule, as a LightningModule's ``configure_optimizers`` builds them) returns the run's optimizer (any
    ``torch.optim.Optimizer``, any parameter groups; a group's ``"name"`` entry names its LR in reports), built
    on the model it is given (already on the run's device). ``scheduler(optimizer, total_steps)`` returns its
    ``LRScheduler``, stepped once per optimizer step. ``scheduler_interval``: ``"step"`` (that, the default) or
    ``"epoch"``, once per epoch of ``dataset`` (after the optimizer step that took its last whole batch, so the
    next epoch trains at the new LR, as Lightning steps an epoch scheduler and a plain loop steps ``StepLR``; an
    ``IterableDataset``'s end shows only when its next epoch begins, so there the step that opened it still
    trains at the old LR). Left as None,
    ``--optimizer``/``--lr``/``--weight-decay`` and ``--schedule``/``--warmup-steps`` build them. The live
    ``lr_scale`` multiplies every group's scheduled LR; checkpoints and exact resume cover both. A change of the
    run's length (a resume with another ``--steps``, or the live ``steps``) builds the workload's step scheduler
    for the new total and steps it to the step it is at: the LR is what that plan says there, which may differ
    from before (torchlab's own schedules continue without a jump); an epoch scheduler goes on as it is.

    ``before_step(step, epoch)``: called before each training step's first forward with the optimizer step it
    trains (1, 2, …) and the epoch of ``dataset`` its first batch comes from (0, 1, …), for a loss that depends on
    where the run is (KL annealing, a curriculum) and a LightningModule's ``self.global_step``. A trial's arms call
    it with the steps they train, and a step retried after running out of memory calls it again.

    ``loss_items(batch)``: for a loss that is a mean over items within the batch (tokens with a label, where
    sequences are padded), the number of those items in ``batch`` (a scalar tensor or a number). Each micro-batch's
    loss is then weighed by its items over the step's, all ranks' (counted before the step's first forward), so the
    step's gradient and loss are the mean over every item of the step, as transformers' Trainer makes them
    (``num_items_in_batch``); None: each micro-batch weighs by its samples.

    ``settings``: the run's starting values that the workload's own code says, by the name of a torchlab setting or
    live option (``{"steps": 500, "accum": 4, "clip": 1.0, "amp": "bf16", "checkpointing": True}``; a transformers
    Trainer's TrainingArguments give them so). A new run takes each one that neither a flag nor ``--config`` gives,
    in the place of torchlab's default; config.toml records them; a resume keeps the run's own (and says where the
    workload's have changed since). The live ones go on changing live as any run's. Not ``seed``, ``device``,
    ``world_size`` and the run's files: those are decided before the factory runs.
    """

    model: torch.nn.Module
    dataset: Dataset
    loss_fn: LossFn
    val_dataset: Dataset | None = None
    collate_fn: Callable[[list], Any] | None = None
    batch_size: int | None = None
    checkpoint_blocks: Sequence[str] | None = None
    optimizer: OptimizerFactory | None = None
    scheduler: SchedulerFactory | None = None
    scheduler_interval: str = "step"
    before_step: Callable[[int, int], None] | None = None
    loss_items: Callable[[Any], torch.Tensor | int] | None = None
    settings: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, torch.nn.Module):
            raise WorkloadError(
                f"Workload.model must be a torch.nn.Module, got {type(self.model).__name__}."
            )
        for field_name in ("dataset", "val_dataset"):
            data = getattr(self, field_name)
            if data is None and field_name == "val_dataset":
                continue
            if not _is_dataset(data):
                raise WorkloadError(
                    f"Workload.{field_name} must be a torch Dataset (map-style with __getitem__ and "
                    f"__len__, or an IterableDataset), got {type(data).__name__}."
                )
        if not callable(self.loss_fn):
            raise WorkloadError("Workload.loss_fn must be callable as loss_fn(model, batch) -> scalar tensor.")
        if self.collate_fn is not None and not callable(self.collate_fn):
            raise WorkloadError("Workload.collate_fn must be callable or None.")
        if self.optimizer is not None and not callable(self.optimizer):
            raise WorkloadError("Workload.optimizer must be callable as optimizer(model) -> torch.optim.Optimizer, or None.")
        if self.scheduler is not None and not callable(self.scheduler):
            raise WorkloadError("Workload.scheduler must be callable as scheduler(optimizer, total_steps) -> LRScheduler, or None.")
        if self.before_step is not None and not callable(self.before_step):
            raise WorkloadError("Workload.before_step must be callable as before_step(step, epoch), or None.")
        if self.loss_items is not None and not callable(self.loss_items):
            raise WorkloadError("Workload.loss_items must be callable as loss_items(batch) -> the items its loss "
                                "averages over, or None.")
        if self.settings is not None and not (isinstance(self.settings, Mapping)
                                              and all(isinstance(name, str) for name in self.settings)):
            raise WorkloadError("Workload.settings must map the names of torchlab's settings and live options to their "
                                "starting values, as {\"steps\": 500, \"accum\": 4}, or be None.")
        if self.scheduler_interval not in ("step", "epoch"):
            raise WorkloadError(f"Workload.scheduler_interval must be \"step\" or \"epoch\", got {self.scheduler_interval!r}.")
        if self.scheduler_interval == "epoch" and self.scheduler is None:
            raise WorkloadError("Workload.scheduler_interval is \"epoch\" but the workload gives no scheduler; torchlab's "
                                "own schedules step per optimizer step.")
        if self.batch_size is not None and (
            isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1
        ):
            raise WorkloadError(f"Workload.batch_size must be a positive integer, got {self.batch_size!r}.")
        if self.checkpoint_blocks is not None:
            if isinstance(self.checkpoint_blocks, str) or not all(
                isinstance(name, str) for name in self.checkpoint_blocks
            ):
                raise WorkloadError(
                    "Workload.checkpoint_blocks must be a list of qualified module names, "
                    "e.g. ['blocks.0', 'blocks.1']."
                )
            self.checkpoint_blocks = list(self.checkpoint_blocks)


def _is_dataset(data: object) -> bool:
    if isinstance(data, IterableDataset):
        return True
    return hasattr(data, "__getitem__") and hasattr(data, "__len__")
