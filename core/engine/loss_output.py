"""The workload's ``loss_fn`` as the trainer calls it (``LossFunction``), and what it returns: the loss, or a
mapping of the loss and the workload's own metrics.

``{"loss": loss, "accuracy": accuracy}`` is Lightning's ``training_step`` convention. The metrics stay on the
device: the trainer stacks them beside the loss, averages them over micro-batches and ranks, and reads them in
the step's one host transfer (core/engine/measure/step_report.py). Their names are fixed by the first step, so a
metric's column means the same thing in every row of ``metrics.jsonl``. A loss that is no scalar, or that
does not require grad, and a first step that fails in the user's code, are WorkloadErrors naming that code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

from torchlab.core.engine.batch_split import is_batch_dataclass
from torchlab.core.engine.data import evaluation_batches
from torchlab.core.engine.adapters.loading import describe_code, user_frame
from torchlab.core.engine.measure.memory import out_of_memory
from torchlab.core.errors import WorkloadError, shown
from torchlab.core.workload import Workload
from torchlab.core.wire.metric_names import validation_key

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
        elif names != self.names and set(names) != set(self.names):  # the same order (every step): no sets made
            raise WorkloadError(
                f"{where}: loss_fn returned the metrics {', '.join(self.names) or 'none'} on the first step and "
                f"{', '.join(names) or 'none'} on step {step}: return the same ones every step (NaN for one that has "
                f"no value on a batch)."
            )
        if not self.names:
            return None
        first = metrics[self.names[0]]
        return torch.stack([metrics[name].to(first.device) for name in self.names])


class LossFunction:
    """The workload's ``loss_fn`` as the steps call it: its loss checked, its own metrics stacked in the order
    their names were first seen (``metric_names``), its errors on the first step of a process named in the user's
    code. ``first_step`` says which step is that first one (a resumed process starts after its checkpoint)."""

    def __init__(self, workload: Workload, device: torch.device, first_step: Callable[[], int]) -> None:
        self.workload, self.device = workload, device
        self.loss_fn = workload.loss_fn
        self.where = describe_code(workload.loss_fn)
        self.metric_names = MetricNames()
        self._first_step = first_step

    def __call__(self, model: torch.nn.Module, batch: Any, step: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The loss of one micro-batch through ``model``, and the workload's metrics as one vector (None without)."""
        try:
            output = self.loss_fn(model, batch)
        except Exception as error:
            # Out of memory is a resource problem, not a model that cannot eat its batch: say it as is.
            if step != self._first_step() or out_of_memory(error):
                raise
            frame = user_frame(error.__traceback__)
            where = f"{frame.filename}:{frame.lineno} in {frame.name}()" if frame else self.where
            # A process's first step is the run's only where it starts the run: a resumed or relaunched one (a new
            # world size, FSDP) starts after the steps before, which trained (issue 45: "the first training step
            # failed" at step 335, after 334 good ones).
            failed = "the first training step failed" if step == 1 else f"training step {step}, the first of this process (resumed after step {step - 1}), failed"
            blame = ("The model cannot train on the batches its dataset gives" if step == 1 else
                     "What changed since the steps before (its options, the number of processes, how they hold the "
                     "model) does not train")
            raise WorkloadError(
                f"{where}: {failed}: {type(error).__name__}: {error}. {blame} (batch: {describe_batch(batch)})."
            ) from error
        loss, metrics = read_loss_output(output, self.where, self.device)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
            got = f"a tensor of shape {list(loss.shape)} and dtype {loss.dtype}" if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise WorkloadError(
                f"{self.where}: loss_fn must return a scalar floating-point tensor, got {got} (reduce it, e.g. with .mean())."
            )
        if not loss.requires_grad:
            raise WorkloadError(
                f"{self.where}: the loss does not require grad, so nothing can train "
                f"(was it computed under torch.no_grad(), or detached?)."
            )
        return loss, self.metric_names.stack(metrics, self.where, step)

    def item_weights(self, pieces: list[list[Any]], collectives: Any) -> list[list[torch.Tensor]]:
        """Each piece's weight in the step where the workload's loss is a mean over items (``Workload.loss_items``:
        tokens with a label), in the place of its share of the samples: its items times the micro-batches and the
        ranks, over the step's items, every rank's (one all-reduce). The engine's average over micro-batches and
        ranks then gives the step's gradient and loss as the mean over every item of the step: transformers'
        ``num_items_in_batch``. ``pieces``: each micro-batch's, as ``split_batch`` cut them."""
        counts = [[self._items(piece) for piece in micro] for micro in pieces]
        total = torch.stack([count for micro in counts for count in micro]).sum()
        ranks = 1
        if collectives is not None:
            total, ranks = collectives.total(total), collectives.context.world_size
        scale = len(pieces) * ranks / total.clamp(min=1.0)  # a step of no items: its loss weighs nothing
        return [[count * scale for count in micro] for micro in counts]

    def _items(self, piece: Any) -> torch.Tensor:
        count = self.workload.loss_items(piece)
        if isinstance(count, torch.Tensor) and count.numel() == 1 and not count.is_complex():
            return count.detach().reshape(()).to(self.device, torch.float32)
        if isinstance(count, (int, float)) and not isinstance(count, bool) and count >= 0:
            return torch.tensor(float(count), device=self.device)
        raise WorkloadError(f"{describe_code(self.workload.loss_items)}: Workload.loss_items must return the number of items a batch's loss averages "
                            f"over (a scalar tensor or a number), got {shown(count)}.")

    def alone(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        """The loss ``loss_fn`` gives on ``batch``, its metrics (if it returns a mapping) left out: for the passes
        that only backpropagate it, the compile at a boundary and the non-finite guard's replay."""
        loss, _ = read_loss_output(self.loss_fn(model, batch), self.where, self.device)
        return loss

    def evaluate(self, model: torch.nn.Module, *, batch_size: int, limit: int, autocast: Callable[[], Any],
                 step: int) -> tuple[float, dict[str, float] | None]:
        """The mean loss over the first ``limit`` validation batches, and the workload's own metrics over them;
        one host transfer for both."""
        model.eval()
        total, count = torch.zeros((), device=self.device), 0
        metric_totals: torch.Tensor | None = None
        try:
            with torch.inference_mode(), autocast():
                for batch in evaluation_batches(self.workload.val_dataset, batch_size=batch_size,
                                                collate_fn=self.workload.collate_fn, limit=limit, device=self.device):
                    loss, named = read_loss_output(self.loss_fn(model, batch), self.where, self.device)
                    total += loss.float()
                    metrics = self.metric_names.stack(named, self.where, step)
                    if metrics is not None:
                        metric_totals = metrics if metric_totals is None else metric_totals + metrics
                    count += 1
        finally:
            model.train()
        if metric_totals is None:
            return total.item() / max(count, 1), None
        values = torch.cat([total.reshape(1), metric_totals]).tolist()
        figures = {key: value / max(count, 1) for name, value in zip(self.metric_names.names, values[1:])
                   if (key := validation_key(name)) is not None}  # train_acc's is val_acc (core/wire/metric_names.py)
        return values[0] / max(count, 1), figures or None


def mean_of_micro_batches(losses: list[torch.Tensor], metrics: list[torch.Tensor | None]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The mean loss (fp32, on the device: no sync) and metrics of a step's micro-batches. With one micro-batch (the
    common case) nothing is stacked: each such op is a kernel, ~20 us of a 10 ms step on a CPU."""
    if len(losses) == 1:
        loss = losses[0]
        return loss if loss.dtype == torch.float32 else loss.float(), metrics[0]
    mean_metrics = torch.stack(metrics).mean(dim=0) if metrics[0] is not None else None
    return torch.stack(losses).float().mean(), mean_metrics


def describe_batch(batch: Any) -> str:
    if isinstance(batch, torch.Tensor):
        return f"tensor{list(batch.shape)} {str(batch.dtype).removeprefix('torch.')}"
    if isinstance(batch, (list, tuple)):
        return "(" + ", ".join(describe_batch(item) for item in batch) + ")"
    if isinstance(batch, dict):
        return "{" + ", ".join(f"{key}: {describe_batch(value)}" for key, value in batch.items()) + "}"
    if is_batch_dataclass(batch):
        fields = ", ".join(f"{field.name}={describe_batch(getattr(batch, field.name))}" for field in dataclasses.fields(batch))
        return f"{type(batch).__name__}({fields})"
    return type(batch).__name__
