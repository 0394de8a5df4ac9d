"""Metrics rows for tests, torch-free (the app's tests use it too): a row like the trainer's with plain figures."""

from __future__ import annotations

from typing import Any

from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.options import OPTION_NAMES, LiveOptions


def metrics_row(step: int, **given: Any) -> MetricsRow:
    """A row at ``step``; ``given`` replaces any of its fields, or a live option's value (``amp="bf16"``)."""
    options = {name: given.pop(name) for name in list(given) if name in OPTION_NAMES}
    figures: dict[str, Any] = {
        "time": 1_700_000_000.0 + step, "elapsed_s": float(step), "epoch": 0, "loss": 1.0, "lr": 1e-3,
        "samples_per_s": 1000.0, "step_time_s": 0.032, "grad_norm_total": None, "clipped": None, "grad_norms": None,
        "skipped": False, "data_wait_s": 0.0, "options": given.pop("options", LiveOptions(**options)),
    }
    return MetricsRow(step=step, **{**figures, **given})
