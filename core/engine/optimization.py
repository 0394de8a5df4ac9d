"""The optimizer and its LR schedule, built-in (``--optimizer``, ``--schedule``) or the workload's own, and the
live ``lr_scale`` on top of either: ``Optimization``, the trainer's part that owns all three and their state.

The scale must not feed back into the schedule. Built-in schedules are closed forms of the step, but a
workload's scheduler may be chainable (``CosineAnnealingLR``, ``StepLR``, ``ExponentialLR`` compute the next LR
from the LR in the group): scaling the group's LR in place would compound at every step. ``LearningRates`` keeps
the schedule's own LR for each group: the groups hold it while the scheduler steps, and the scaled LR while the
optimizer steps. A checkpoint holds the scheduler's state, whose last LRs are the schedule's own.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable

import torch
from torch.optim.lr_scheduler import LambdaLR, LRScheduler, ReduceLROnPlateau

from torchlab.core.engine.adapters.loading import describe_code, user_frame
from torchlab.core.engine.schedule import make_scheduler
from torchlab.core.errors import ConfigError, WorkloadError
from torchlab.core.options import OptionChangeError
from torchlab.core.records.config import FromWorkload, TrainConfig
from torchlab.core.workload import Workload


def build_optimizer(model: torch.nn.Module, config: TrainConfig, workload: Workload) -> torch.optim.Optimizer:
    """The workload's ``optimizer(model)``, checked, or the built-in one that ``--optimizer`` names."""
    if workload.optimizer is None:
        return make_optimizer(model, config)
    _refuse_settings_it_replaces(config, ("optimizer", "lr", "weight_decay"), workload.optimizer, "optimizer",
                                 "set them in it, or scale its LR live with --lr-scale")
    if _positional_parameters(workload.optimizer) >= 2:  # optimizer(model, total_steps): built with its schedule
        optimizer = _call(workload.optimizer, "optimizer(model, total_steps)", model, config.steps)
    else:
        optimizer = _call(workload.optimizer, "optimizer(model)", model)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise WorkloadError(f"{describe_code(workload.optimizer)}: Workload.optimizer must return a torch.optim.Optimizer, "
                            f"got {type(optimizer).__name__}.")
    owned = {id(parameter) for parameter in model.parameters()}
    foreign = sum(1 for group in optimizer.param_groups for tensor in group["params"] if id(tensor) not in owned)
    if foreign:
        raise WorkloadError(
            f"{describe_code(workload.optimizer)}: Workload.optimizer returned an optimizer over {foreign} tensor(s) that "
            f"are not the model's parameters: build it from the model it is given (optimizer(model)), not from another "
            f"copy of it."
        )
    if not any(group["params"] for group in optimizer.param_groups):
        raise WorkloadError(f"{describe_code(workload.optimizer)}: Workload.optimizer returned an optimizer with no parameters.")
    return optimizer


def build_scheduler(optimizer: torch.optim.Optimizer, config: TrainConfig, workload: Workload) -> LRScheduler:
    """The workload's ``scheduler(optimizer, total_steps)``, checked, or the built-in one ``--schedule`` names.
    It is stepped once per optimizer step; ``total_steps`` is the run's ``--steps``."""
    if workload.scheduler is None:
        return make_scheduler(optimizer, config)
    # Not warmup_steps: a resume that changes --steps sets it (to keep the built-in warm-up where it was).
    _refuse_settings_it_replaces(config, ("schedule",), workload.scheduler, "scheduler", "plan them in it",
                                 replaced=("schedule", "warmup_steps"))
    scheduler = _call(workload.scheduler, "scheduler(optimizer, total_steps)", optimizer, config.steps)
    where = describe_code(workload.scheduler)
    if isinstance(scheduler, ReduceLROnPlateau):
        raise WorkloadError(f"{where}: Workload.scheduler returned ReduceLROnPlateau, which steps on a metric, not once "
                            f"per optimizer step; torchlab cannot step it. Use a schedule of the step (or none).")
    if not isinstance(scheduler, LRScheduler):
        raise WorkloadError(f"{where}: Workload.scheduler must return a torch.optim.lr_scheduler.LRScheduler, "
                            f"got {type(scheduler).__name__}.")
    if scheduler.optimizer is not optimizer:
        raise WorkloadError(f"{where}: Workload.scheduler must schedule the optimizer it is given, not another one.")
    return scheduler


def replan_schedule(scheduler: LRScheduler, optimizer: torch.optim.Optimizer, config: TrainConfig, workload: Workload,
                    step: int) -> LRScheduler:
    """The schedule for ``config``'s new total, at ``step``. A built-in one re-plans its decay from ``step``
    (``config.schedule_extensions``), so the LR goes on without a jump; the workload's own is built by its
    factory for the new total and stepped to ``step`` (its LR there is what its plan says)."""
    if workload.scheduler is None:
        replanned = make_scheduler(optimizer, config)
        replanned.load_state_dict(scheduler.state_dict())  # its step count and base LRs; the plan is the new one
        return replanned
    replanned = build_scheduler(optimizer, config, workload)
    step_to(replanned, optimizer, step)
    return replanned


def step_to(scheduler: LRScheduler, optimizer: torch.optim.Optimizer, step: int) -> None:
    """Step a fresh ``scheduler`` ``step`` times, from its own LRs, as training would have. The groups start from
    them too: a chainable scheduler (LinearLR, ExponentialLR) computes each LR from the group's current one, which a
    loaded checkpoint or the steps trained so far had moved on (a resume with another --steps replayed LinearLR's
    warm-up from the checkpoint's LR: 2.6e-2 where the plan said 7.5e-3)."""
    lrs = LearningRates(optimizer, scheduler)
    for group, lr in zip(optimizer.param_groups, lrs.scheduled):
        group["lr"] = lr
    with warnings.catch_warnings():  # "lr_scheduler.step() before optimizer.step()": on purpose, a replay
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(step):
            lrs.step(1.0)


def own_training(optimizer: torch.optim.Optimizer, scheduler: LRScheduler, workload: Workload) -> FromWorkload | None:
    """What the workload's own optimizer and scheduler are, for the run's record (config.toml), or None where it
    gives neither. Read as built, before a checkpoint loads: each group's ``initial_lr`` is where its schedule
    starts (the group's LR, or what the scheduler set, as OneCycleLR's max_lr / div_factor)."""
    if workload.optimizer is None and workload.scheduler is None:
        return None
    own_optimizer = workload.optimizer is not None
    return FromWorkload(
        optimizer=class_path(type(optimizer)) if own_optimizer else None,
        groups=tuple(group_names(optimizer)) if own_optimizer else (),
        lrs=tuple(float(group.get("initial_lr", group["lr"])) for group in optimizer.param_groups) if own_optimizer else (),
        scheduler=class_path(type(scheduler)) if workload.scheduler is not None else None,
    )


def class_path(cls: type) -> str:
    """A class as one imports it: ``torch.optim.SGD`` (torch.optim's public name, not torch.optim.sgd.SGD),
    ``torch.optim.lr_scheduler.StepLR``, ``my_model.Lion``."""
    for public in (torch.optim, torch.optim.lr_scheduler):
        if getattr(public, cls.__name__, None) is cls:
            return f"{public.__name__}.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def make_optimizer(model: torch.nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """AdamW or SGD; weight decay only on matrices (not biases or norm gains), as nanoGPT and most LLM code."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise WorkloadError(f"the model {type(model).__name__} has no trainable parameters.")
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    groups = [group for group in groups if group["params"]]
    if config.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=config.lr, momentum=0.9)
    return torch.optim.AdamW(groups, lr=config.lr)


def group_names(optimizer: torch.optim.Optimizer) -> list[str]:
    """Each parameter group's name: its ``"name"`` entry where the workload gave one, else its index."""
    return [group["name"] if isinstance(group.get("name"), str) and group["name"] else str(index)
            for index, group in enumerate(optimizer.param_groups)]


class Optimization:
    """The trainer's optimization part: the optimizer, its LR schedule, and the live LR scale on top of both.

    ``state_dict`` is the optimizer's and the scheduler's, which checkpoints hold under ``"optimizer"`` and
    ``"scheduler"``; the scale is a live option, saved with the others."""

    def __init__(self, optimizer: torch.optim.Optimizer, scheduler: LRScheduler, per_epoch: bool = False) -> None:
        self.optimizer, self.scheduler = optimizer, scheduler
        self.lrs = LearningRates(optimizer, scheduler)
        self.lr_scale = 1.0  # until the lr_scale option is enacted
        self.per_epoch = per_epoch  # the workload's scheduler steps once per epoch (Workload.scheduler_interval)

    def step_schedule(self, finished_epoch: bool) -> None:
        """After an optimizer step: the schedule's step (a per-epoch one's only where the step ``finished_epoch``),
        from its own LRs, then the live scale on what it gives."""
        if not self.per_epoch or finished_epoch:
            self.lrs.step(self.lr_scale)

    def scale_lr(self, scale: float) -> None:
        """The schedule's LR times ``scale`` on every parameter group, from now on."""
        self.lr_scale = scale
        self.lrs.apply(scale)

    def state_dict(self) -> dict[str, dict]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, dict]) -> None:
        """Both states as saved (gradients dropped first), and the scale in force on the schedule's LRs."""
        self.optimizer.zero_grad(set_to_none=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.lrs.read_schedule()
        self.lrs.apply(self.lr_scale)

    def load_resumed(self, state: dict[str, dict], stored: TrainConfig, config: TrainConfig, workload: Workload,
                     step: int) -> None:
        """A checkpoint's optimizer and schedule, under a configuration that may differ from ``stored``, the one it
        was saved with (an override given with ``--resume``): the built-in optimizer's state is kept only for the
        same optimizer, and its LR and weight decay are this configuration's, not the ones saved in the optimizer's
        and scheduler's state. A workload's own optimizer and scheduler are restored as saved; where ``--steps``
        changed, the workload's scheduler is the one its factory builds for the new total, stepped to ``step``
        (torchlab re-plans only its own schedules)."""
        own_optimizer, own_scheduler = workload.optimizer is not None, workload.scheduler is not None
        configured = [{"initial_lr": group["initial_lr"], "weight_decay": group["weight_decay"]} for group in self.optimizer.param_groups]
        if own_optimizer or stored.optimizer == config.optimizer:
            try:
                self.optimizer.load_state_dict(state["optimizer"])
            except (RuntimeError, ValueError, KeyError) as error:
                raise ConfigError(f"--resume: the checkpoint does not fit this workload's model and optimizer: {error}") from None
        if own_scheduler and stored.steps != config.steps and not self.per_epoch:
            step_to(self.scheduler, self.optimizer, step)  # the factory's plan for the new total
        else:
            self.scheduler.load_state_dict(state["scheduler"])
        if not own_optimizer:
            for group, settings in zip(self.optimizer.param_groups, configured):
                group.update(settings)
        if not own_scheduler:
            self.scheduler.base_lrs = [settings["initial_lr"] for settings in configured]
        self.lrs.read_schedule()

    def replan(self, config: TrainConfig, workload: Workload, step: int) -> None:
        """The schedule for ``config``'s new total from ``step`` on (``replan_schedule``), the scale on it; a per-epoch
        schedule goes on as it is (its steps are epochs, not a share of the run)."""
        if self.per_epoch:
            return
        self.scheduler = replan_schedule(self.scheduler, self.optimizer, config, workload, step)
        self.lrs = LearningRates(self.optimizer, self.scheduler)
        self.lrs.apply(self.lr_scale)


class LearningRates:
    """The schedule's own LR for each parameter group, and the groups' LRs with the live scale on them."""

    def __init__(self, optimizer: torch.optim.Optimizer, scheduler: LRScheduler) -> None:
        self.optimizer, self.scheduler = optimizer, scheduler
        self.scheduled: list[float] = []
        self.read_schedule()

    def read_schedule(self) -> None:
        """Take the schedule's LRs from the scheduler, as built or as a state it loaded left it. A ``LambdaLR``'s
        is its closed form of the base LRs (a resume with another ``--lr`` sets those after the state loaded)."""
        if isinstance(self.scheduler, LambdaLR):
            epoch = self.scheduler.last_epoch
            self.scheduled = [base * factor(epoch) for base, factor in zip(self.scheduler.base_lrs, self.scheduler.lr_lambdas)]
        else:
            self.scheduled = [float(lr) for lr in self.scheduler.get_last_lr()]

    def step(self, scale: float) -> None:
        """The schedule's step, from its own LRs (never the scaled ones), then the scale on what it gives. At a
        scale of 1 (the default) the groups hold the schedule's own LRs already, and what it gives is what they keep."""
        groups = self.optimizer.param_groups
        if scale != 1.0:
            for group, lr in zip(groups, self.scheduled):
                group["lr"] = lr
        self.scheduler.step()
        self.scheduled = [float(group["lr"]) for group in groups]
        if scale != 1.0:
            self.apply(scale)

    def apply(self, scale: float) -> None:
        for group, lr in zip(self.optimizer.param_groups, self.scheduled):
            group["lr"] = lr * scale


def _refuse_settings_it_replaces(config: TrainConfig, names: tuple[str, ...], factory: Callable, field: str, instead: str,
                                 replaced: tuple[str, ...] | None = None) -> None:
    """A setting the workload's own factory replaces, given a value of its own (not its default), would be
    ignored without a word: say so instead, naming it."""
    given = [name for name in names if getattr(config, name) != TrainConfig.__dataclass_fields__[name].default]
    if given:
        flags = ["--" + name.replace("_", "-") for name in replaced or names]
        listed = ", ".join(flags[:-1]) + " and " + flags[-1] if len(flags) > 1 else flags[0]
        settings = ", ".join(f"{name} (--{name.replace('_', '-')}) {getattr(config, name)!r}" for name in given)
        raise ConfigError(f"{settings}: this workload gives its own {field} ({describe_code(factory)}), so {listed} do "
                          f"not apply: {instead}.")


def _positional_parameters(factory: Callable) -> int:
    """How many positional arguments ``factory`` takes (a bound method's own ``self`` not counted)."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: called with the model alone
        return 1
    return sum(1 for parameter in parameters if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD))


def _call(factory: Callable, shown_as: str, *args):
    try:
        return factory(*args)
    except (WorkloadError, OptionChangeError):  # a refusal: the change that asked for a new plan is refused, saying why
        raise
    except Exception as error:  # said at the user's line that raised (a LightningModule's configure_optimizers too)
        frame = user_frame(error.__traceback__)
        where = f"{frame.filename}:{frame.lineno} in {frame.name}()" if frame else describe_code(factory)
        raise WorkloadError(f"{where}: Workload.{shown_as} failed: {type(error).__name__}: {str(error).rstrip('.')}.") from error
