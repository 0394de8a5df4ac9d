"""Test helpers: build a trainer on a tiny workload, in-process, and record what it reports.

A module of its own, not conftest.py: ``from conftest import ...`` picked whichever of the two conftest
modules (tests/'s or tests/tui's) was imported first, so listing tests/tui first on the command
line broke the other tests' imports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchlab.core.engine.adapters.loading import load_workload
from torchlab.core.engine.seeding import seed_everything
from torchlab.core.engine.trainer import Trainer
from torchlab.core.records.config import build_config
from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.wire.observer import TrainerObserver
from torchlab.core.wire.payloads import TelemetrySample
from torchlab.core.wire.protocol import Message, StopCommand

WORKLOADS = Path(__file__).parent.parent / "workloads"
TINY = f"{WORKLOADS / 'tiny.py'}:workload"


class Recorder(TrainerObserver):
    """A trainer observer that keeps every report, event and telemetry sample, for assertions."""

    def __init__(self) -> None:
        self.metrics: list[MetricsRow] = []
        self.events: list[dict[str, Any]] = []
        self.telemetry: list[TelemetrySample] = []

    def on_telemetry(self, sample: TelemetrySample) -> None:
        self.telemetry.append(sample)

    def on_metrics(self, row: MetricsRow) -> None:
        self.metrics.append(row)

    def on_event(self, event: Message) -> None:
        self.events.append(event.journal_record())  # as events.jsonl has it

    def of(self, event: str) -> list[dict[str, Any]]:
        return [record for record in self.events if record["event"] == event]

    def at(self, step: int) -> MetricsRow:
        return next(row for row in self.metrics if row.step == step)


class StopAt(TrainerObserver):
    """Stops ``trainer`` at the boundary after ``step``, as the app's stop asked during that step would. Not on the
    step's row: a measured step's row waits for the next step's transfer (its update figures), and whether a step
    is measured depends on the box's load (the auto probe cadence), so a stop asked on rows came a step late."""

    def __init__(self, trainer, step: int) -> None:
        apply = trainer.boundary.apply

        def stop_then_apply() -> None:
            if trainer.parts.progress.step == step:
                trainer.submit(StopCommand("test"))
            apply()

        trainer.boundary.apply = stop_then_apply


def make_trainer(
    workload_spec: str = TINY,
    *,
    checkpoint_dir: Path | None = None,
    profiles_dir: Path | None = None,
    resume_from: Path | None = None,
    explicit=(),
    workload=None,
    **settings: Any,
) -> tuple[Trainer, Recorder]:
    """A trainer exactly as the CLI builds one (seeded before the factory), with a Recorder attached."""
    options = settings.pop("options", {})
    at = settings.pop("at", [])
    if "profile_at" in settings:
        settings["profile_at"] = list(settings["profile_at"])
    settings.setdefault("eval_every", 0)
    config = build_config({}, {"workload": workload_spec, **settings, "options": options, "at": at})
    seed_everything(config.seed)
    recorder = Recorder()
    trainer = Trainer(
        config,
        workload if workload is not None else load_workload(config.workload),
        observers=[recorder],
        checkpoint_dir=checkpoint_dir,
        profiles_dir=profiles_dir,
        resume_from=resume_from,
        explicit=explicit,
    )
    return trainer, recorder
