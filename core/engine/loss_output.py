"""What a workload's ``loss_fn`` returns: the loss, or a mapping of the loss and the workload's own metrics.

``{"loss": loss, "accuracy": accuracy}`` is Lightning's ``training_step`` convention. The metrics stay on the
device: the trainer stacks them beside the loss, averages them over micro-batches and ranks, and reads them in
the step's one host transfer (core/engine/step_report.py). Their names are fixed by the first step, so a
metric's column means the same thing in every row of ``metrics.jsonl``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from torchlab.core.wire.errors import WorkloadError, shown

#: The longest metric name a report carries (names are keys in every metrics row and chart titles).
MAX_METRIC_NAME_CHARS = 40


def read_loss_output(output: Any, where: str, device: torch.device) -> tuple[Any, dict[str, torch.Tensor]]:
    """The loss as ``loss_fn`` gave it (the caller checks it is a scalar tensor), and the other entries of a
    mapping as detached fp32 scalar tensors on ``device``. ``where`` names the user's function in errors."""
    if not isinstance(output, Mapping):
        return output, {}
    if "loss" not in output:
        raise WorkloadError(f"{where}: loss_fn returned a mapping without \"loss\" (its keys: "
                            f"{', '.join(shown(key) for key in list(output)[:8])}); put the loss under \"loss\".")
    metrics: dict[str, torch.Tensor] = {}
    for name, value in output.items():
        if name == "loss":
            continue
        if not isinstance(name, str) or not name.strip() or len(name) > MAX_METRIC_NAME_CHARS:
            raise WorkloadError(f"{where}: loss_fn's metric names must be text of 1 to {MAX_METRIC_NAME_CHARS} "
                                f"characters, got {shown(name)}.")
        metrics[name] = _scalar(value, name, where, device)
    return output["loss"], metrics


def _scalar(value: Any, name: str, where: str, device: torch.device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise WorkloadError(f"{where}: loss_fn's metric {name!r} must be a scalar, got a tensor of shape "
                                f"{list(value.shape)} (reduce it, e.g. with .mean()).")
        return value.detach().reshape(()).float()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return torch.tensor(float(value), device=device)
    raise WorkloadError(f"{where}: loss_fn's metric {name!r} must be a scalar tensor or a number, got {type(value).__name__}.")


class MetricNames:
    """The names of the workload's metrics, as its first step returned them; every later step must return the
    same ones (a row whose columns changed meaning would plot one metric as another)."""

    def __init__(self) -> None:
        self.names: tuple[str, ...] | None = None

    def stack(self, metrics: dict[str, torch.Tensor], where: str, step: int) -> torch.Tensor | None:
        """The metrics as one fp32 vector in the names' order (None: the workload has none)."""
        names = tuple(metrics)
        if self.names is None:
            self.names = names
        elif set(names) != set(self.names):
            raise WorkloadError(
                f"{where}: loss_fn returned the metrics {', '.join(self.names) or 'none'} on the first step and "
                f"{', '.join(names) or 'none'} on step {step}: return the same ones every step (NaN for one that has "
                f"no value on a batch)."
            )
        if not self.names:
            return None
        first = metrics[self.names[0]]
        return torch.stack([metrics[name].to(first.device) for name in self.names])
