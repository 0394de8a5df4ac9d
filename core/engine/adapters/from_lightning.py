"""A LightningModule, as it is, trained by the engine: the ``Workload`` its own hooks describe (issue 33).

A factory may return a ``lightning.pytorch.LightningModule`` (or ``pytorch_lightning``'s), or a tuple of one and
the ``LightningDataModule`` that feeds it. Nothing here imports Lightning: an object is one where Lightning is
already loaded (the user's file imported it) and it is an instance of its class.

What maps to what (docs/workloads.md's table says it for users):

- ``training_step(batch, batch_idx)`` is the loss: a tensor, or a mapping with ``"loss"``. It runs inside the model's
  own forward, as Lightning's strategies run it (``_LightningModuleWrapperBase``): the engine calls the model, so
  DDP averages the gradients, FSDP2 gathers the blocks and the probes' hooks fire, while ``self(x)`` inside the step
  is the module's plain forward. ``batch_idx`` counts the micro-batches of the epoch this process trained (from 0
  where it resumed); ``self.global_step`` and ``self.current_epoch`` are the run's (``Workload.before_step``).
- ``self.log(name, value)`` and ``self.log_dict`` during a training step are the workload's metrics, reduced as
  metrics are (averaged over micro-batches and ranks, reported every step); the same names every step.
- ``configure_optimizers`` (with ``self.trainer`` a stand-in that gives the run's plan: ``estimated_stepping_batches``,
  ``max_steps``, the ranks; ``PlanOfTheRun``): an optimizer; a list or tuple of one; a dict with ``"optimizer"`` and
  ``"lr_scheduler"`` (a scheduler, or a dict with ``"scheduler"``, ``"interval"`` and ``"frequency"``); two lists
  ``([optimizer], [scheduler])``. A scheduler whose interval is ``"step"`` is stepped once per optimizer step, an
  ``"epoch"`` one (Lightning's default where no interval is said) once per epoch of the training set
  (``Workload.scheduler_interval``), every ``frequency``. No scheduler: the optimizer's LR, constant, as under
  Lightning (not torchlab's own schedule).
- Activation checkpointing's blocks (the live ``c``): the module's own ``checkpoint_blocks`` (an attribute: qualified
  names, as ``Workload.checkpoint_blocks``), else the children that hold parameters of the ``ModuleList``/``Sequential``
  with the most such children (``lightning_checkpoint_blocks``): a CNN's conv stages, not its classifier's
  Flatten/ReLU/Dropout/Linear, which the largest container by parameters (the plain default) picks.
- ``train_dataloader()`` (of the data module, or the module) gives the dataset, its ``collate_fn`` and batch size;
  the engine reads the dataset with its own sampler (shuffled from ``--seed``, shared over ranks, resumable).
  ``val_dataloader()`` gives the validation set; ``validation_step``'s logged ``val_loss`` (or its returned loss)
  is ``val_loss``, and its logged ``val_<metric>`` the validation value of the training metric ``train_<metric>``
  (or ``<metric>``), journalled and charted as ``val_<metric>`` for ``train_<metric>`` (core/wire/metric_names.py).

Refused with one paragraph each, never trained differently: manual optimization, several optimizers, several
loaders, ``ReduceLROnPlateau``, and hooks the engine would not call (``configure_gradient_clipping``,
``on_before_optimizer_step``, ``optimizer_step``, ``on_train_batch_start``/``_end``, ``backward``): each names the
hook and what to do.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

from torchlab.core.errors import WorkloadError
from torchlab.core.workload import Workload

#: Lightning's packages, in the order they are looked for: whichever the user's file imported.
_PACKAGES = ("lightning.pytorch", "pytorch_lightning")
#: Hooks of the training step the engine does not call: overriding one would train differently than it says.
_HOOKS_NOT_CALLED = {
    "configure_gradient_clipping": "use the live option clip (--clip NORM) for the global norm",
    "on_before_optimizer_step": "the engine measures and clips gradients itself (--clip); move what it does into "
                                "training_step, or train this module with Lightning's Trainer",
    "optimizer_step": "the engine takes the optimizer step (with accumulation, AMP's scaler and the guards)",
    "on_train_batch_start": "move what it does into training_step",
    "on_train_batch_end": "move what it does into training_step",
    "backward": "the engine calls loss.backward() (with AMP's scaler where fp16 is on)",
}


def lightning_classes() -> tuple[type, type] | None:
    """(LightningModule, LightningDataModule) of the Lightning the user's code loaded, or None where none is."""
    for name in _PACKAGES:
        package = sys.modules.get(name)
        if package is not None:
            return package.LightningModule, package.LightningDataModule
    return None


def lightning_workload(made: Any, where: str) -> Workload | None:
    """The Workload of what a factory returned, where it is a LightningModule (or a tuple of one and its data
    module); None where it is not Lightning's."""
    classes = lightning_classes()
    if classes is None:
        return None
    module_class, data_class = classes
    if isinstance(made, module_class):
        return LightningAdapter(made, None, where).workload()
    if (isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], module_class)
            and isinstance(made[1], data_class)):
        return LightningAdapter(made[0], made[1], where).workload()
    return None


class LoggedValues:
    """What ``self.log`` and ``self.log_dict`` gave during one step: put in place of the module's own methods, which
    without Lightning's Trainer only warn."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        self.values[name] = _step_value(value)

    def log_dict(self, dictionary: Mapping[str, Any], *args: Any, **kwargs: Any) -> None:
        for name, value in dictionary.items():
            self.log(name, value)

    def take(self) -> dict[str, Any]:
        values, self.values = self.values, {}
        return values


def _step_value(value: Any) -> Any:
    """A logged value as this step's: a torchmetrics ``Metric`` logged as itself (``self.log("acc", self.accuracy)``)
    is its value on this step's batch, the one its ``forward`` just computed (Lightning logs the same on_step)."""
    cached = getattr(value, "_forward_cache", None)
    if cached is not None or hasattr(value, "compute") and hasattr(value, "update"):
        return cached if cached is not None else value.compute()
    return value


class LightningAdapter:
    """One LightningModule (and its data module) as a Workload; see the module docstring."""

    def __init__(self, module: Any, data: Any, where: str) -> None:
        self.module, self.data, self.where = module, data, where
        self.logged = LoggedValues()
        self.batch_index = 0
        self.training_names: tuple[str, ...] | None = None
        self.plan = PlanOfTheRun()
        self._configured: Configured | None = None
        self._scheduler_given = False
        self._workload: Workload | None = None

    def workload(self) -> Workload:
        module = self.module
        self._refuse_what_is_not_honoured()
        module.log, module.log_dict = self.logged.log, self.logged.log_dict  # this instance's own: the class is untouched
        module._trainer = self.plan  # self.trainer, self.global_step, self.current_epoch: the run's
        _route_forward(module)
        source = self.data if self.data is not None else module
        if self.data is not None:
            self.data.prepare_data()
            self.data.setup("fit")
        train = self._loader(source, "train_dataloader")
        validation = self._loader(source, "val_dataloader") if _overrides(source, "val_dataloader") else None
        self._workload = Workload(
            model=module,
            dataset=train.dataset,
            loss_fn=self.loss,
            val_dataset=validation.dataset if validation is not None else None,
            collate_fn=train.collate_fn,
            batch_size=train.batch_size,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            before_step=self.before_step,
            checkpoint_blocks=lightning_checkpoint_blocks(module),
        )
        return self._workload

    def before_step(self, step: int, epoch: int) -> None:
        """Lightning's position: ``global_step`` the optimizer steps taken before this one, ``current_epoch`` its
        batch's epoch, ``batch_idx`` counted from 0 again in a new epoch."""
        if epoch != self.plan.current_epoch:
            self.batch_index = 0
        self.plan.global_step, self.plan.current_epoch = step - 1, epoch

    # ---------------------------------------------------------------- the loss
    def loss(self, model: torch.nn.Module, batch: Any) -> Any:
        """``training_step`` (or, evaluating, ``validation_step``) through the model's forward, with what it logged."""
        # The module the step runs on: ``model`` itself where it is one (the memory forecast's fake twin of it), else
        # the adapter's, inside the wrapper the engine calls (DDP, torch.compile's).
        module = model if isinstance(model, type(self.module)) else self.module
        if module.training:
            module._torchlab_step = ("training_step", batch, self.batch_index)
            self.batch_index += 1
            returned = model()
            return self._training_output(returned, self.logged.take())
        module._torchlab_step = ("validation_step", batch, 0)
        returned = model()
        return self._validation_output(returned, self.logged.take())

    def _training_output(self, returned: Any, logged: dict[str, Any]) -> dict[str, Any]:
        loss = returned.get("loss") if isinstance(returned, Mapping) else returned
        if loss is None:
            raise WorkloadError(f"{self.where}: training_step returned None (Lightning's way to skip a batch); the "
                                f"engine trains every batch: return the loss.")
        metrics = {name: value for name, value in logged.items() if name != "loss"}
        if self.training_names is None:
            self.training_names = tuple(metrics)
        return {"loss": loss, **metrics}

    def _validation_output(self, returned: Any, logged: dict[str, Any]) -> dict[str, Any]:
        """The validation figures under the training metrics' names (the evaluation reports ``train_<name>``'s as
        ``val_<name>``, the name it was logged under): ``val_<name>`` (or ``val_<name less train_>``) for each, NaN
        where validation logs none; the loss from the logged ``val_loss``, else the returned one."""
        loss = logged.get("val_loss", returned.get("loss") if isinstance(returned, Mapping) else returned)
        if loss is None:
            raise WorkloadError(f"{self.where}: validation_step neither logged val_loss nor returned a loss: "
                                f"log it with self.log(\"val_loss\", loss).")
        figures: dict[str, Any] = {"loss": torch.as_tensor(loss, dtype=torch.float32)}  # a logged float too
        for name in self.training_names or ():
            value = logged.get(f"val_{name}", logged.get(f"val_{name.removeprefix('train_')}", math.nan))
            figures[name] = value
        return figures

    # ---------------------------------------------------------------- the optimizer and its schedule
    def optimizer(self, model: torch.nn.Module, total_steps: int) -> torch.optim.Optimizer:
        """``configure_optimizers``'s optimizer, its scheduler kept for ``scheduler``; a form the engine cannot take
        is refused here, as the run starts."""
        return self._configure(total_steps).optimizer

    def scheduler(self, optimizer: torch.optim.Optimizer, total_steps: int) -> LRScheduler:
        """The module's scheduler for ``optimizer``: the one ``configure_optimizers`` made with it, the first time;
        for a run whose length changed (the engine then steps it to where the run is), made again by
        ``configure_optimizers`` and moved onto ``optimizer`` (the one training holds, with its state), since the
        module builds the two together."""
        configured = self._configured
        if self._scheduler_given or configured.optimizer is not optimizer:  # a replan: the one given is stepped already
            configured = self._configure(total_steps)
            if configured.scheduler is not None:
                for group, new in zip(optimizer.param_groups, configured.optimizer.param_groups):
                    group["initial_lr"] = new.get("initial_lr", new["lr"])
                configured.scheduler.optimizer = optimizer
        self._scheduler_given = True
        # Known only now that configure_optimizers ran (it may read the run's plan): the engine reads it next.
        self._workload.scheduler_interval = configured.interval
        scheduler = configured.scheduler
        if scheduler is None:  # Lightning keeps the optimizer's LR where it has no scheduler: so does this one
            return LambdaLR(optimizer, lambda step: 1.0)
        return scheduler if configured.frequency == 1 else EveryN(scheduler, configured.frequency)

    def _configure(self, total_steps: int) -> Configured:
        """``configure_optimizers``, ``self.trainer`` saying the run's plan for ``total_steps`` (``PlanOfTheRun``): what a
        scheduler's length is read from, ``estimated_stepping_batches`` above all (OneCycleLR's total)."""
        self.plan.estimated_stepping_batches = self.plan.max_steps = total_steps
        configured = self.module.configure_optimizers()  # what it raises is said at its line (optimization._call)
        self._configured = parse_configure_optimizers(configured, self.where)
        return self._configured

    # ---------------------------------------------------------------- what it cannot do
    def _refuse_what_is_not_honoured(self) -> None:
        module = self.module
        if not module.automatic_optimization:
            raise WorkloadError(
                f"{self.where}: this LightningModule sets automatic_optimization = False (manual optimization: its "
                f"training_step steps its optimizers itself), which the engine cannot honour: it takes the optimizer "
                f"step, with accumulation, AMP and the guards. Return the loss from training_step and let the engine "
                f"step, or train this module with Lightning's Trainer."
            )
        for hook, instead in _HOOKS_NOT_CALLED.items():
            if _overrides(module, hook):
                raise WorkloadError(
                    f"{self.where}: this LightningModule overrides {hook}(), a hook the engine does not call, so it "
                    f"would train differently than its code says: {instead}."
                )

    def _loader(self, source: Any, hook: str) -> Any:
        loader = getattr(source, hook)()
        if isinstance(loader, (list, tuple, dict)):
            raise WorkloadError(f"{self.where}: {hook}() returned several loaders; the engine trains and evaluates "
                                f"on one: return one DataLoader.")
        if not isinstance(loader, torch.utils.data.DataLoader):
            raise WorkloadError(f"{self.where}: {hook}() must return a torch DataLoader, got {type(loader).__name__}.")
        if loader.batch_size is None:
            raise WorkloadError(f"{self.where}: {hook}()'s DataLoader has a batch_sampler and no batch_size; the "
                                f"engine samples the dataset itself: give the DataLoader a batch_size.")
        return loader


def lightning_checkpoint_blocks(module: torch.nn.Module) -> list[str] | None:
    """The blocks activation checkpointing wraps in a LightningModule, which has no ``Workload`` to name them: its own
    ``checkpoint_blocks`` where it sets one, else the parameter-holding children of the ``ModuleList``/``Sequential``
    with the most of them (the more parameters on a tie). A block is a stage of layers whose activations a recompute
    saves: a CNN's ``features`` (conv stages) has more of them than its ``classifier`` (Flatten, ReLU, Dropout, Linear:
    two that hold parameters), which holds most of the parameters in the flattened Linear and is what the largest
    container by parameters would give."""
    own = getattr(module, "checkpoint_blocks", None)
    if own is not None:
        return own  # Workload checks the form and the names
    best: tuple[int, int] = (1, 0)  # (blocks, parameters): one block is no choice
    chosen: list[str] = []
    for name, container in module.named_modules():
        if not isinstance(container, (torch.nn.ModuleList, torch.nn.Sequential)):
            continue
        prefix = f"{name}." if name else ""
        blocks = [(f"{prefix}{child_name}", sum(p.numel() for p in child.parameters()))
                  for child_name, child in container.named_children()]
        blocks = [(block, size) for block, size in blocks if size]
        rank = (len(blocks), sum(size for _, size in blocks))
        if rank > best:
            best, chosen = rank, [block for block, _ in blocks]
    return chosen or None  # none with two: the plain default's


class PlanOfTheRun:
    """``self.trainer``: what Lightning's Trainer would say of the run's plan and position: the total of optimizer
    steps (``--steps``, or the live ``steps`` when configure_optimizers is called again), the step and epoch being
    trained (``global_step``, ``current_epoch``: ``Workload.before_step``), the ranks the launcher started. Anything
    else a Trainer has is not here, and says so."""

    def __init__(self) -> None:
        self.estimated_stepping_batches = self.max_steps = 0  # set before configure_optimizers runs
        self.max_epochs = None
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.global_rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.num_devices, self.num_nodes = int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size)), 1
        self.is_global_zero = self.global_rank == 0
        self.global_step = self.current_epoch = 0

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"self.trainer.{name}: the workbench trains this module without Lightning's Trainer; self.trainer gives "
            f"the run's plan and position (estimated_stepping_batches, max_steps, global_step, current_epoch, "
            f"world_size, global_rank, is_global_zero), not {name}"
        )


class EveryN(LRScheduler):
    """A scheduler with Lightning's ``frequency`` N: stepped once every N of its interval's steps (optimizer steps,
    or epochs)."""

    def __init__(self, scheduler: LRScheduler, every: int) -> None:
        self.scheduler, self.every, self.calls = scheduler, every, 0
        self.optimizer = scheduler.optimizer  # noqa: the base class's __init__ would step the inner one: not called

    def step(self, epoch: int | None = None) -> None:
        self.calls += 1
        if self.calls % self.every == 0:
            self.scheduler.step()

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.calls = state["calls"]
        self.scheduler.load_state_dict(state["scheduler"])


@dataclass(frozen=True)
class Configured:
    """What ``configure_optimizers`` gave: the optimizer, its scheduler (None: none) stepped every ``frequency``
    steps of its ``interval``, ``"step"`` or ``"epoch"``."""

    optimizer: torch.optim.Optimizer
    scheduler: LRScheduler | None = None
    interval: str = "step"
    frequency: int = 1


def parse_configure_optimizers(configured: Any, where: str) -> Configured:
    """What ``configure_optimizers`` returned, in each form Lightning accepts for one optimizer; WorkloadError for
    the others, naming the form."""
    said = f"{where}: configure_optimizers()"
    if isinstance(configured, torch.optim.Optimizer):
        return Configured(configured)
    if isinstance(configured, Mapping):
        return _from_dict(configured, said)
    if isinstance(configured, (list, tuple)):
        if len(configured) == 2 and all(isinstance(part, (list, tuple)) for part in configured):
            optimizers, schedulers = configured
            optimizer = _only_optimizer(list(optimizers), said)
            if len(schedulers) > 1:
                raise WorkloadError(f"{said} returned {len(schedulers)} schedulers; the engine steps one.")
            if not schedulers:
                return Configured(optimizer)
            return _with_scheduler(optimizer, schedulers[0], said)
        if len(configured) == 1 and isinstance(configured[0], Mapping):
            return _from_dict(configured[0], said)
        return Configured(_only_optimizer(list(configured), said))
    if configured is None:
        raise WorkloadError(f"{said} returned None (no optimizer); the engine needs one to train.")
    raise WorkloadError(f"{said} returned {type(configured).__name__}, not one of the forms Lightning accepts.")


def _only_optimizer(optimizers: list[Any], said: str) -> torch.optim.Optimizer:
    if len(optimizers) != 1 or not isinstance(optimizers[0], torch.optim.Optimizer):
        kinds = ", ".join(type(optimizer).__name__ for optimizer in optimizers) or "none"
        raise WorkloadError(f"{said} returned {len(optimizers)} optimizers ({kinds}); the engine steps one optimizer "
                            f"(several stepping at once, as a GAN's, need Lightning's Trainer). Put the parameters "
                            f"in one optimizer's groups to give them their own LRs.")
    return optimizers[0]


def _from_dict(configured: Mapping[str, Any], said: str) -> Configured:
    if "optimizer" not in configured:
        raise WorkloadError(f"{said} returned a dict without \"optimizer\".")
    optimizer = _only_optimizer([configured["optimizer"]], said)
    if configured.get("lr_scheduler") is None:
        return Configured(optimizer)
    return _with_scheduler(optimizer, configured["lr_scheduler"], said)


def _with_scheduler(optimizer: torch.optim.Optimizer, entry: Any, said: str) -> Configured:
    settings = entry if isinstance(entry, Mapping) else {"scheduler": entry}
    scheduler, interval = settings.get("scheduler"), settings.get("interval", "epoch")  # Lightning's default
    frequency = settings.get("frequency", 1)
    if not isinstance(scheduler, LRScheduler):
        on_a_metric = " (it steps on a metric, which the engine does not watch)" if "Plateau" in type(scheduler).__name__ else ""
        raise WorkloadError(f"{said}: its lr_scheduler must be a torch LRScheduler of the step or the epoch, got "
                            f"{type(scheduler).__name__}{on_a_metric}.")
    if scheduler.optimizer is not optimizer:
        raise WorkloadError(f"{said}: its scheduler schedules another optimizer than the one it returned.")
    if interval not in ("step", "epoch"):
        raise WorkloadError(f"{said}: its scheduler's interval must be \"step\" or \"epoch\", got {interval!r}.")
    if not isinstance(frequency, int) or isinstance(frequency, bool) or frequency < 1:
        raise WorkloadError(f"{said}: its scheduler's frequency must be a whole number from 1, got {frequency!r}.")
    return Configured(optimizer, scheduler, interval, frequency)


def _overrides(obj: Any, hook: str) -> bool:
    """Whether ``obj``'s class defines ``hook`` itself (or a class between it and Lightning's), not Lightning's own."""
    for cls in type(obj).__mro__:
        if hook in vars(cls):
            return not cls.__module__.startswith(("lightning.", "pytorch_lightning."))
    return False


def _route_forward(module: Any) -> None:
    """The module's forward runs the step the adapter put on it (``_torchlab_step``), once, and is its own forward
    otherwise: the engine calls the model (so DDP's and FSDP2's forward, and the probes' hooks, wrap the step), and
    ``self(x)`` inside ``training_step`` reaches the module's plain forward. A subclass made for this instance: its
    class's name, its state dict's keys and its isinstance checks stay as they were."""
    cls = type(module)
    plain_forward = cls.forward

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        pending = self.__dict__.pop("_torchlab_step", None)
        if pending is None:
            return plain_forward(self, *args, **kwargs)
        hook, batch, index = pending
        return getattr(self, hook)(batch, index)

    module.__class__ = type(cls.__name__, (cls,), {"forward": forward, "__module__": cls.__module__,
                                                    "__qualname__": cls.__qualname__})
