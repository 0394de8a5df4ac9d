"""A transformers ``Trainer``, as it is, trained by the engine (issue 33): the ``Workload`` its own parts describe.

A factory may return a ``transformers.Trainer`` (or a subclass: ``Seq2SeqTrainer``, one of the user's), built as
for ``trainer.train()`` but not started. Nothing here imports transformers: an object is one where the user's code
imported its Trainer already and it is an instance of that class.

What maps to what (docs/workloads.md's table says it for users):

- The model is ``trainer.model``; its configs' ``use_cache`` (the model's, and a part's own copy, as a T5's decoder
  holds) are set False, as transformers does when it checkpoints activations: a key/value cache filled in a training
  forward is thrown away, and a recomputed block (the live ``checkpointing``) would fill it twice (a T5 decoder's
  cross-attention cache made its recomputation save 52 tensors where its forward saved 56).
- The loss is ``trainer.compute_loss(model, batch, num_items_in_batch=...)``: the user's override where there is
  one, else transformers' own (the model's loss from ``labels``, label smoothing, ``compute_loss_func``), on a copy
  of the batch (it may pop ``labels``). Where transformers counts the labels of a step (its ``num_items_in_batch``,
  4.46 on: a model that takes loss kwargs, or a ``compute_loss_func``; a ``loss_is_scaled_for_ga`` said decides), the
  micro-batch's loss is divided by its own count, and the engine weighs each by its count over the step's, all
  ranks' (``Workload.loss_items``): the step's loss and gradient are transformers', the sum over every label of the
  step over their count. ``average_tokens_across_devices`` is set False on the Trainer, which counts over the ranks
  no more: the engine does (the same figure, where it is left True as by default). Elsewhere each micro-batch's
  loss is its own mean, weighed alike. The validation loss is the same call without a count, under ``no_grad``.
- The data are what ``trainer.get_train_dataloader()`` and ``get_eval_dataloader()`` hold (columns the model does not
  take removed, ``data_collator``), read with the engine's own sampler (shuffled from ``--seed``, shared over ranks,
  resumable); one eval set.
- The optimizer is ``trainer.create_optimizer()``: the one given as ``optimizers=(optimizer, ...)``, or the one
  ``TrainingArguments`` describe (``optim``, ``learning_rate``, ``weight_decay`` on all but biases and norms, Adam's
  betas and epsilon), its groups named ``decay`` and ``no_decay``. The schedule is ``trainer.create_scheduler(total,
  optimizer)`` (``lr_scheduler_type``, ``warmup_steps``/ratio, ``lr_scheduler_kwargs``), built again for a new total
  of steps, or the one given as ``optimizers=(..., scheduler)``, which cannot be.
- ``TrainingArguments`` give the run's starting settings (``Workload.settings``): ``steps`` (``max_steps``, or
  ``num_train_epochs`` of the engine's batches), ``batch_size`` (``per_device_train_batch_size`` times the ranks the
  run starts with: the engine's batch is all ranks' together), ``accum``, ``clip`` (``max_grad_norm``; 0: off),
  ``amp`` (``bf16``/``fp16``), ``checkpointing`` (``activation_checkpointing``, was ``gradient_checkpointing``), ``compile`` (``torch_compile``) and
  ``eval_every`` (``eval_strategy`` "steps" or "epoch"). A flag or ``--config`` still wins over each.
- ``trainer.state.global_step`` and ``epoch`` say where the run is before each step (``Workload.before_step``), and
  ``max_steps`` its total, for a ``compute_loss`` that reads them.

Refused with one paragraph each, never trained differently: an overridden ``training_step``, callbacks the engine
would not call (``EarlyStoppingCallback``, the user's own), ``model_init``, several eval sets, and the arguments
that train otherwise (DeepSpeed, transformers' own FSDP, NEFTune).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from torchlab.core.engine.batch_split import batch_samples
from torchlab.core.errors import WorkloadError
from torchlab.core.options import OptionChangeError
from torchlab.core.workload import Workload

#: Callbacks a Trainer has of its own: they print and drive ``trainer.train()``'s loop, which the engine replaces.
_ITS_OWN_CALLBACKS = ("DefaultFlowCallback", "ProgressCallback", "PrinterCallback")
#: Trainer methods the engine does not call: overriding one would train differently than the code says.
_METHODS_NOT_CALLED = {
    "training_step": "the engine runs the step itself (forward through compute_loss, backward, accumulation, AMP's "
                     "scaler, clipping, the optimizer); move what it does into compute_loss",
}


def trainer_class() -> type | None:
    """transformers' Trainer, where the user's code imported it; None where it did not."""
    module = sys.modules.get("transformers.trainer")
    return getattr(module, "Trainer", None) if module is not None else None


def transformers_workload(made: Any, where: str) -> Workload | None:
    """The Workload of what a factory returned, where it is a transformers Trainer; None where it is not."""
    trainer_type = trainer_class()
    if trainer_type is None or not isinstance(made, trainer_type):
        return None
    return TrainerAdapter(made, where).workload()


class TrainerAdapter:
    """One transformers Trainer as a Workload; see the module docstring."""

    def __init__(self, trainer: Any, where: str) -> None:
        self.trainer, self.where = trainer, where
        self.args = trainer.args
        said = getattr(trainer, "loss_is_scaled_for_ga", None)  # the user's word on their compute_loss, 5.x on
        #: whether transformers would count the labels of a step and divide its loss by their number
        self.counts_items = bool(said if said is not None else
                                 getattr(trainer, "model_accepts_loss_kwargs", False) or trainer.compute_loss_func is not None)
        if self.counts_items:  # the engine counts over the ranks: the Trainer must not scale by them as well
            self.args.average_tokens_across_devices = False
        self.given_scheduler: LRScheduler | None = trainer.lr_scheduler
        self._scheduler_built = False
        self._names_groups = trainer.optimizer is None  # its own groups: decay and no_decay

    def workload(self) -> Workload:
        trainer = self.trainer
        self._refuse_what_is_not_honoured()
        model = trainer.model
        for config in {id(module.config): module.config for module in model.modules()
                       if getattr(getattr(module, "config", None), "use_cache", None)}.values():
            config.use_cache = False  # each part's own: a T5's decoder holds a copy of the model's config
        train = trainer.get_train_dataloader()
        validation = self._eval_loader()
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        batch_size = self.args.per_device_train_batch_size * world_size
        return Workload(
            model=model,
            dataset=train.dataset,
            loss_fn=self.loss,
            loss_items=self.items if self.counts_items else None,
            val_dataset=validation.dataset if validation is not None else None,
            collate_fn=train.collate_fn,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            before_step=self.before_step,
            settings=self.settings(train.dataset, batch_size),
        )

    # ---------------------------------------------------------------- the loss
    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        inputs = dict(batch) if isinstance(batch, Mapping) else batch
        counted = self.counts_items and model.training and _has_labels(batch)
        loss = self.trainer.compute_loss(model, inputs, num_items_in_batch=self.items(batch) if counted else None)
        return loss[0] if isinstance(loss, tuple) else loss  # an override that returns (loss, outputs) regardless

    def items(self, batch: Any) -> torch.Tensor | int:
        """The labels transformers counts in ``batch`` (``_get_num_items_in_batch``: not -100; past the first
        position where its loss shifts them; ``shift_labels`` where the collator gives them); a batch without labels
        counts its samples (transformers then weighs the micro-batches alike)."""
        if not _has_labels(batch):
            return batch_samples(batch)
        if "shift_labels" in batch:
            labels = batch["shift_labels"]
        else:
            labels = batch["labels"][..., 1:] if getattr(self.trainer, "_loss_shifts_labels", False) else batch["labels"]
        return labels.ne(-100).sum()

    def before_step(self, step: int, epoch: int) -> None:
        self.trainer.state.global_step, self.trainer.state.epoch = step - 1, float(epoch)

    # ---------------------------------------------------------------- the optimizer and its schedule
    def optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        optimizer = self.trainer.create_optimizer()
        if self._names_groups and len(optimizer.param_groups) == 2:
            for group, name in zip(optimizer.param_groups, ("decay", "no_decay")):
                group.setdefault("name", name)
        return optimizer

    def scheduler(self, optimizer: torch.optim.Optimizer, total_steps: int) -> LRScheduler:
        self.trainer.state.max_steps = total_steps  # the run's plan, for a compute_loss or scheduler that reads it
        if self.given_scheduler is not None:
            if self._scheduler_built:
                raise OptionChangeError(
                    "the Trainer was given its scheduler (optimizers=(optimizer, scheduler)), made for a length it "
                    "cannot be made again for; give max_steps in TrainingArguments and let the Trainer make it"
                )
            self._scheduler_built = True
            return self.given_scheduler
        self.trainer.lr_scheduler = None  # create_scheduler makes one only where there is none
        return self.trainer.create_scheduler(num_training_steps=total_steps, optimizer=optimizer)

    # ---------------------------------------------------------------- TrainingArguments as the run's settings
    def settings(self, dataset: Any, batch_size: int) -> dict[str, Any]:
        args = self.args
        accum = args.gradient_accumulation_steps
        steps_per_epoch = self._steps_per_epoch(dataset, batch_size, accum)
        if args.max_steps > 0:
            steps = args.max_steps
        elif steps_per_epoch is None:
            raise WorkloadError(f"{self.where}: the training set has no length (an IterableDataset), so "
                                f"num_train_epochs says no number of steps: give max_steps in TrainingArguments.")
        else:
            steps = max(1, math.ceil(args.num_train_epochs * steps_per_epoch))
        settings: dict[str, Any] = {
            "steps": steps,
            "batch_size": batch_size,
            "accum": accum,
            "clip": args.max_grad_norm if args.max_grad_norm else None,
            "amp": "bf16" if args.bf16 else "fp16" if args.fp16 else "off",
            "checkpointing": bool(getattr(args, "activation_checkpointing", None) or args.gradient_checkpointing),
            "compile": bool(args.torch_compile),
        }
        strategy = str(getattr(args.eval_strategy, "value", args.eval_strategy))
        if strategy == "steps" and args.eval_steps:
            every = args.eval_steps
            settings["eval_every"] = max(1, math.ceil(every * steps)) if every < 1 else int(every)
        elif strategy == "epoch" and steps_per_epoch is not None:
            settings["eval_every"] = steps_per_epoch
        return settings

    @staticmethod
    def _steps_per_epoch(dataset: Any, batch_size: int, accum: int) -> int | None:
        """Optimizer steps in one epoch of the engine's batches (it drops a last partial batch)."""
        try:
            batches = len(dataset) // batch_size
        except TypeError:
            return None
        return max(1, math.ceil(batches / accum))

    # ---------------------------------------------------------------- what it cannot do
    def _eval_loader(self) -> Any:
        eval_dataset = self.trainer.eval_dataset
        if eval_dataset is None:
            return None
        if isinstance(eval_dataset, Mapping):
            raise WorkloadError(f"{self.where}: the Trainer has {len(eval_dataset)} eval sets ({', '.join(map(str, eval_dataset))}); "
                                f"the engine evaluates one: give eval_dataset one dataset.")
        return self.trainer.get_eval_dataloader()

    def _refuse_what_is_not_honoured(self) -> None:
        trainer, args = self.trainer, self.args
        said = f"{self.where}: this Trainer"
        if trainer.model is None:
            raise WorkloadError(f"{said} has no model (model_init makes one per trial of a hyperparameter search); "
                                f"the engine trains one: give Trainer(model=...).")
        for method, instead in _METHODS_NOT_CALLED.items():
            if _overrides(trainer, method):
                raise WorkloadError(f"{said} overrides {method}(), which the engine does not call, so it would train "
                                    f"differently than its code says: {instead}.")
        others = [type(callback).__name__ for callback in trainer.callback_handler.callbacks
                  if type(callback).__name__ not in _ITS_OWN_CALLBACKS
                  and not type(callback).__module__.startswith("transformers.integrations")]
        if others:
            raise WorkloadError(f"{said} has callbacks the engine does not call ({', '.join(others)}): their on_step "
                                f"and on_evaluate hooks would never run. Remove them; the workbench stops a run from "
                                f"the app (s) or at --steps, and guards spikes with --spike-guard.")
        unsupported = {
            "deepspeed": "DeepSpeed runs its own engine: train with --parallel fsdp and --world-size N instead",
            "fsdp": "transformers' FSDP wraps the model itself: give --parallel fsdp and --world-size N instead",
            "neftune_noise_alpha": "NEFTune adds noise to the embeddings inside trainer.train(): not here",
        }
        for name, instead in unsupported.items():
            if getattr(args, name, None):
                raise WorkloadError(f"{said}'s TrainingArguments set {name}, which the engine cannot honour: {instead}.")


def _has_labels(batch: Any) -> bool:
    return isinstance(batch, Mapping) and isinstance(batch.get("labels"), torch.Tensor)


def _overrides(obj: Any, method: str) -> bool:
    """Whether ``obj``'s class defines ``method`` itself (or a class between it and transformers'), not
    transformers' own (a Seq2SeqTrainer is transformers')."""
    for cls in type(obj).__mro__:
        if method in vars(cls):
            return not cls.__module__.startswith("transformers.")
    return False
