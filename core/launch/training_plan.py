"""What a run trains with, decided in the trainer's process: the flags, or with ``--resume`` the
checkpoint's own configuration, with any flag given beside it as an override.

Every checkpoint keeps the whole resolved configuration of its run (``TrainConfig.to_toml``), so
``--resume RUN_DIR`` alone continues the run as it was started (workload, seed, lr, schedule, warm-up,
steps, batch size, optimizer, scripted ``--at`` changes) and its live options as they were at the
checkpoint. Precedence, lowest first: defaults, the checkpoint's configuration, ``--config``, flags.

A checkpoint never chooses the code that runs. Its stored workload is imported only when

- it is a built-in sample (``mlp``, ``convnet``, ``tiny_gpt``): torchlab's own code, a fixed list; or
- the checkpoint sits in a run directory of the user's: ``RUN/checkpoints/FILE`` beside ``RUN/config.toml``,
  the four owned by the user running torchlab (``os.geteuid()``) and none writable by group or others, and
  ``config.toml`` names the same workload as the checkpoint (so the checkpoint was written by the run the
  user started there, and no one else could have put it there).

Otherwise the workload is given on the command line (``torchlab-tui my_model.py:workload --resume c.pt``) or in
``--config``: what the user typed. That goes for ``package.module:factory`` too, though only code already
installed can be named so: importing a module runs it, and an installed module may do anything when imported
(``antigravity`` opens a browser; a package's test helpers, a plugin), so a checkpoint from somewhere else may
name none. The refusal is one paragraph that names the workload, says why it is not imported, and gives the
command to run it if the user trusts it. A workload given for a checkpoint must have the checkpoint's model
(the trainer compares parameter names and shapes, core/engine/state/checkpoint_contents.py ``check_model_fits``).

An override that makes the resumed run differ from one that was never stopped (core/records/resume_changes.py)
is said in one warning line, on the CLI, in the app and in ``events.jsonl``; the run goes on. A larger
``--steps`` extends the run: the LR schedule re-plans its decay from the checkpoint's step
(core/engine/schedule.py), with no jump at the boundary.

``config.toml`` is the record of how the run was started: a resume rewrites it only once the checkpoint
has loaded and only if the configuration changed, and keeps the earlier one beside it
(``config.before-step-NNNNNNN.toml``). A resume that fails leaves it as it was.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from torchlab.core.engine.state.checkpoint import checkpoint_file, load_training_state
from torchlab.core.engine.adapters.loading import SAMPLES, spec_as_shown, spec_as_typed
from torchlab.core.errors import ConfigError
from torchlab.core.launch.resume_in_place import require_resume_in_place
from torchlab.core.launch.arguments import explicit_names, resolve_config, setting_layers, workload_origin
from torchlab.core.records.config import FromWorkload, TrainConfig, build_config, settings_from_toml
from torchlab.core.records.resume_changes import SettingChange, resume_note
from torchlab.core.records.starting_values import with_workload_settings
from torchlab.core.records.rundir import RunDirectory
from torchlab.core.safe_open import read_regular_text, who_else_may_write
from torchlab.core.wire.events import RunStarted
from torchlab.core.wire.observer import TrainerObserver
from torchlab.core.options import LIVE_OPTIONS
from torchlab.core.wire.protocol import Message

#: Derived from other settings, or the record of a change rather than a setting of its own.
#: Not settings of the training: options are compared at the checkpoint's step; shared_run_dir concerns
#: only a new run directory (an existing one keeps its modes), so a resume does not change it.
_NOT_COMPARED = ("options", "schedule_extensions", "shared_run_dir")
#: The live options that are not also a setting (``steps`` is compared as a setting).
_LIVE_ONLY = frozenset(option.name for option in LIVE_OPTIONS if not option.setting)


@dataclass(frozen=True)
class TrainingPlan:
    """The configuration to train with; with a resume, the checkpoint and what the flags changed."""

    config: TrainConfig
    explicit: set[str]
    resume: Path | None = None  # the checkpoint file
    changes: tuple[SettingChange, ...] = ()
    config_changed: bool = False  # the resolved configuration differs from the checkpoint's
    workload_origin: str | None = None  # what was typed where, when the workload is recorded otherwise (a comment)

    def resume_note(self) -> dict[str, Any] | None:
        """What this resume changed, as the run journals it (``resume_changed_settings``); None where nothing did."""
        return resume_note(self.changes)


def plan_training(args: argparse.Namespace) -> TrainingPlan:
    """The configuration a trainer process runs with, from the parsed command line."""
    if args.resume is None:
        config, explicit = resolve_config(args)
        return TrainingPlan(config, explicit, workload_origin=workload_origin(args))
    require_resume_in_place(args.resume, args.run_dir)  # a run goes on in its own directory, or is refused
    checkpoint = checkpoint_file(args.resume)
    state = load_training_state(checkpoint, mmap=True)  # memory-mapped: the tensors are read once, for the digest
    stored_settings = settings_from_toml(state.config, f"the configuration in {checkpoint}")
    stored = build_config(stored_settings)
    file_settings, flags = setting_layers(args)
    if "workload" not in flags and "workload" not in file_settings:
        _refuse_to_import(stored.workload, checkpoint)
    layers = [stored_settings, file_settings, flags]
    config = build_config(*layers)
    step = state.step
    if config.steps != stored.steps:
        config = build_config(*layers, _extension(stored, config, step, checkpoint))
    explicit = explicit_names(file_settings, flags)
    changes = [
        SettingChange(f.name, _comparable(stored, f.name), _comparable(config, f.name))
        for f in fields(TrainConfig)
        if f.name not in _NOT_COMPARED and _comparable(stored, f.name) != _comparable(config, f.name)
    ]
    live_at_checkpoint = state.options
    for name in sorted(explicit & _LIVE_ONLY - {"world_size"}):  # the world size is the supervisor's to say
        value = getattr(config.options, name)
        if name in live_at_checkpoint and live_at_checkpoint[name] != value:
            changes.append(SettingChange(name, live_at_checkpoint[name], value))
    return TrainingPlan(config, explicit, checkpoint, tuple(changes), config_changed=config != stored,
                        workload_origin=workload_origin(args))


def _refuse_to_import(workload: str, checkpoint: Path) -> None:
    """The ConfigError for a workload that ``checkpoint`` names and that is not to be imported on its word."""
    reason = refusal_to_import(workload, checkpoint)
    if reason is None:
        return
    typed = spec_as_typed(workload) or "path/to/file.py:factory"
    raise ConfigError(
        f"--resume {checkpoint}: the checkpoint names the workload {spec_as_shown(workload)}, which torchlab does not "
        f"import on a checkpoint's word outside a run directory of yours: {reason}. Anyone can write a checkpoint, "
        f"and the code it names would run as you. If you trust that code, give it on the command line: "
        f"torchlab-tui {typed} --resume {checkpoint}"
    )


def refusal_to_import(workload: str, checkpoint: Path) -> str | None:
    """Why the workload that ``checkpoint`` names may not be imported on its word, or None where it may be: a
    built-in sample, or a checkpoint in a run directory of the user's whose config.toml names it (the module
    docstring has the rule)."""
    if workload.strip() in SAMPLES:
        return None
    checkpoint = Path(checkpoint)
    folder, run = checkpoint.parent, checkpoint.parent.parent
    config = run / "config.toml"
    if folder.name != "checkpoints" or not config.is_file():
        return "it is not in a run directory (RUN/checkpoints/ beside RUN/config.toml)"
    for path in (run, folder, config, checkpoint):
        fault = who_else_may_write(os.stat(path))
        if fault is not None:
            return f"{path} {fault}"
    named = settings_from_toml(read_regular_text(config), str(config)).get("workload")
    if named != workload:
        return f"its run's config.toml names {spec_as_shown(named) if isinstance(named, str) else 'no workload'}"
    return None


def _extension(stored: TrainConfig, config: TrainConfig, step: int, checkpoint: Path) -> dict[str, Any]:
    """The settings that make a new total of steps continue the schedule where the checkpoint left it."""
    if config.steps < step:
        raise ConfigError(
            f"steps (--steps) {config.steps}: {checkpoint.name} is at step {step} already; give a total of at least "
            f"{step} to continue it (the run was started for {stored.steps} steps)."
        )
    layer: dict[str, Any] = {"schedule_extensions": [*stored.schedule_extensions, (step, stored.steps)]}
    if config.warmup_steps is None:  # a default warm-up follows the total: keep the one the run had
        layer["warmup_steps"] = stored.resolved_warmup_steps
    return layer


class ConfigRecord(TrainerObserver):
    """Writes the run's ``config.toml``: at once for a new run; for a resumed one, once its checkpoint has loaded
    (the trainer reports ``run_started``) and only if the configuration changed. Where the workload brought its own
    optimizer or scheduler, or its own starting values (run_started says which), config.toml records them, not the
    settings they replaced: a new run's is written again then."""

    def __init__(self, directory: RunDirectory, plan: TrainingPlan) -> None:
        self.directory, self.plan = directory, plan
        self._pending = True  # the first run_started only: a relaunch for a new world size starts again, not ours

    def write_for_new_run(self) -> None:
        if self.plan.resume is None:
            self.directory.write_config(self._toml(None))

    def on_event(self, event: Message) -> None:
        if not isinstance(event, RunStarted) or not self._pending:
            return
        self._pending = False
        record = FromWorkload.from_mapping(event.from_workload, "run_started") if event.from_workload else None
        taken = event.workload_settings or {}
        if self.plan.resume is None:
            if record is not None or taken:
                self.directory.write_config(self._toml(record, taken))
        elif not (self.directory.path / "config.toml").exists():  # resumed into a directory of its own
            self.directory.write_config(self._toml(record))
        elif self.plan.config_changed:
            self.directory.replace_config(self._toml(record), event.step)

    def _toml(self, record: FromWorkload | None, taken: dict[str, Any] | None = None) -> str:
        """``taken``: the workload's own starting values the new run took (its trainer's configuration holds them)."""
        config = self.plan.config
        if taken:
            config, _ = with_workload_settings(config, taken, frozenset(), "run_started")
        return config.to_toml(workload_origin=self.plan.workload_origin, from_workload=record,
                              workload_settings=tuple(taken or ()))


def _comparable(config: TrainConfig, name: str) -> Any:
    return config.resolved_warmup_steps if name == "warmup_steps" else getattr(config, name)
