"""Will it fit: the memory of a training step under given settings, predicted before it is paid for.

A step is run on the model's fake twin (fake_twin.py: ``FakeTensor`` parameters, no storage) under PyTorch's
``MemTracker`` (``FSDPMemTracker`` for FSDP2, on a fake process group of the world size), which follows every
tensor the step makes and frees, and its kind: parameters, gradients, optimizer state, activations, FSDP2's gathered
parameters and communication buffers, backward's temporaries. Nothing is allocated but Python objects; the numbers
are the real step's (checked against the memory the trainer measures on the tensors, ``benchmarks/README.md``).

The step is the trainer's, in memory's terms: the same autocast (core/engine/precision.py), the same activation
checkpointing (core/engine/activation_checkpointing.py), the same FSDP2 units and mixed precision
(core/engine/parallel/sharding.py ``shard_units``), the batch cut as ``split`` cuts it, the workload's own loss and
optimizer. The optimizer's state is made first (a step on zero gradients), as every step but a run's first holds it
through its forward and backward; then one step is measured. Of its micro-batches and pieces (``accum`` × ``split``)
two run: from the second on, the gradients of the first are held while the next forward saves its activations, as in
every later one.

What it does not model, said wherever a prediction is shown (``NOT_MODELLED``): the caching allocator's blocks and
fragmentation (CUDA reserves more than the tensors hold), cuDNN/cuBLAS workspaces, NCCL's buffers, the CUDA
context itself; a compiled model's own graphs (predicted as it runs eagerly); a batch longer than the one given (the
dataset's first samples, or a live run's longest so far: ``stretched``); and an op that fake tensors cannot run (one
whose output depends on the data: ``nonzero``, ``.item()``) ends the prediction with ``ForecastError`` naming it.
"""

from __future__ import annotations

import contextlib
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode, UnsupportedOperatorException,
)
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker

from torchlab.core.engine.activation_checkpointing import ActivationCheckpointing
from torchlab.core.engine.adapters.loading import own_frame
from torchlab.core.engine.batch_split import batch_samples, batch_tensors, split_batch
from torchlab.core.engine.data import map_batch_tensors, move_to_device
from torchlab.core.engine.forecast.fake_twin import fake_twin
from torchlab.core.engine.forecast.step_shape import StepShape
from torchlab.core.engine.measure.memory import MemoryProbe
from torchlab.core.engine.parallel.sharding import refuse_shared_across_blocks, shard_units
from torchlab.core.engine.precision import Precision, make_precision
from torchlab.core.errors import ForecastError
from torchlab.core.options import CHECKPOINTING, OptionChangeError
from torchlab.core.wire.payloads import MemoryPrediction

#: MemTracker's kinds (``_MemRefType``, FSDPMemTracker's ``_FSDPRefType``), by their values, as the memory view's.
_KIND_OF = {
    "Parameter": "parameters", "Sharded Param": "parameters", "Buffer": "parameters",
    "Gradient": "gradients", "Sharded Grad": "gradients", "Unsharded Grad": "gradients",
    "Optstate": "optimizer", "OptState": "optimizer",
    "Activation": "activations", "Inputs": "activations",
    "Unsharded Param": "gathered",
}
KINDS = ("parameters", "gradients", "optimizer", "activations", "gathered")
_TOTAL = "Total"  # MemTracker's key of a snapshot's sum
#: What a step raises where an op cannot run without the data: ``DataDependentOutputException`` (``.item()``, a
#: tensor's value in Python), ``DynamicOutputShapeException`` (``nonzero``: a shape that depends on the data), and an
#: op fake tensors have no rule for.
_CANNOT_RUN_ON_FAKES = (DataDependentOutputException, DynamicOutputShapeException, UnsupportedOperatorException)


class MemoryForecast:
    """Predicts the memory of ``model``'s training step under a ``StepShape``, each shape once (cached).

    ``model`` is left untouched (real tensors or ``meta`` ones); ``loss_of(model, batch)`` is the workload's loss,
    ``make_optimizer(model)`` its optimizer, ``draw_batch(size)`` one batch of ``size`` samples (real, small: the
    data must be read to be drawn). ``checkpoint_blocks``: the blocks checkpointing wraps and FSDP2 shards."""

    def __init__(self, model: torch.nn.Module, loss_of: Callable[[torch.nn.Module, Any], torch.Tensor],
                 make_optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer], draw_batch: Callable[[int], Any],
                 device: torch.device, checkpoint_blocks: Sequence[str] | None) -> None:
        self.model, self.loss_of, self.make_optimizer, self.draw_batch = model, loss_of, make_optimizer, draw_batch
        self.device, self.checkpoint_blocks = device, checkpoint_blocks
        self._predicted: dict[tuple[StepShape, tuple], MemoryPrediction] = {}  # by the settings and the batch's shapes
        self._batches: dict[int, Any] = {}  # the dataset's first samples, by how many

    def predict(self, shape: StepShape, longest: Sequence[Sequence[int]] | None = None) -> MemoryPrediction:
        """``shape``'s step, on a batch of the dataset's first samples, or where ``longest`` gives the shapes of the
        run's longest batch so far (``longest_batch``), on one as long (``stretched``): with batches of varying
        length, the longest is the one that must fit. Cached by the shapes of the batch it runs: a longest batch no
        longer than the first samples' is answered at once."""
        batch = stretched(self._drawn(shape.rank_batch), longest)
        key = (shape, tuple(tuple(tensor.shape) for tensor in batch_tensors(batch)))
        if key not in self._predicted:
            self._predicted[key] = self._predict(shape, batch)
        return self._predicted[key]

    def _drawn(self, size: int) -> Any:
        if size not in self._batches:
            self._batches[size] = self.draw_batch(size)
        return self._batches[size]

    def _predict(self, shape: StepShape, batch: Any) -> MemoryPrediction:
        started = time.perf_counter()
        try:
            precision = make_precision(shape.amp, self.device, _no_scaler(self.device), sharded=shape.sharded)
        except OptionChangeError as refusal:
            return _refused(shape, str(refusal), time.perf_counter() - started)
        try:
            drawn = batch_samples(batch)
        except OptionChangeError:  # a batch of the user's own type: run whole, as training runs it at split 1
            if shape.split > 1:
                raise
            drawn = shape.rank_batch
        if drawn < shape.rank_batch:  # the dataset is smaller than the batch: a prediction of fewer samples is no answer
            raise ForecastError(f"a batch of {shape.rank_batch} samples a rank: the dataset gives at most {drawn}")
        mode = FakeTensorMode()
        # The step's warnings are training's to give (FSDP2's of a view returned, autocast's): said when it trains.
        with _fake_process_group(shape, self.device) as mesh, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            twin = fake_twin(self.model, mode, self.device)
            checkpointing = ActivationCheckpointing(twin, self.checkpoint_blocks)
            if shape.checkpointing:
                checkpointing.enable(CHECKPOINTING.names(shape.checkpointing))
            if shape.sharded:
                refuse_shared_across_blocks(list(checkpointing.blocks.values()), twin)
                shard_units(twin, list(checkpointing.blocks.values()), shape.reshard_after_forward,
                            precision.param_dtype, mesh)
            try:
                most, peak = self._measured_step(twin, shape, precision, mode, batch, checkpointing)
            except _CANNOT_RUN_ON_FAKES as error:
                raise ForecastError(_cannot_run(error)) from error
            except AssertionError as error:  # FakeTensorMode meeting a real tensor the batch's own type holds
                if "convert all Tensors to FakeTensors" not in str(error):
                    raise
                raise ForecastError("the batch is an object of the workload's own type, whose tensors the forecast "
                                    "cannot reach to make them fake; a dict, list, tuple or dataclass of tensors it "
                                    "can") from None
            except NotImplementedError as error:  # FSDPMemTracker's own refusal, which _PeakOfTheStep cannot reach
                if "multiple iterative calls" not in str(error):
                    raise
                raise ForecastError("PyTorch's FSDPMemTracker cannot follow a model that runs itself inside its own "
                                    "forward (a LightningModule's training_step calling self(x)): its memory under "
                                    "FSDP2 is not predicted; train it with --memory-every 1 to measure it") from None
        at_peak = dict.fromkeys((*KINDS, "other"), 0)
        for category, value in peak.items():
            if category != _TOTAL:
                at_peak[_KIND_OF.get(category, "other")] += value
        at_peak["other"] += _ddp_buckets(twin) if shape.world_size > 1 and not shape.sharded else 0
        kinds = {f"{kind}_bytes": most[kind] for kind in KINDS}
        return MemoryPrediction(settings=shape.settings(), peak_bytes=sum(at_peak.values()), at_peak=at_peak, **kinds,
                                seconds=time.perf_counter() - started)

    def _measured_step(self, twin: torch.nn.Module, shape: StepShape, precision: Precision, mode: FakeTensorMode,
                   batch: Any, checkpointing: ActivationCheckpointing) -> tuple[dict[str, int], dict[str, int]]:
        """One optimizer step of the twin, its optimizer's state made first (as every step but the first holds it):
        each kind by the trainer's own memory probe (the same definitions: core/engine/measure/memory.py), and the
        tracker's peak by category."""
        passes = min(shape.accum * shape.split, 2)
        probe = MemoryProbe(twin, checkpointing.wrapped_blocks, shape.reshard_after_forward)
        most = dict.fromkeys(KINDS, 0)
        with mode:
            optimizer = _stepping_as_the_run_would(self.make_optimizer(twin), self.device)
            tracker = _tracker(twin, optimizer, shape.sharded)
            with tracker:
                # Copied under the tracker, which sees only what an op makes: the batch is held through the step.
                fake = map_batch_tensors(move_to_device(map_batch_tensors(batch, mode.from_tensor), self.device),
                                         torch.clone)
                piece = split_batch(fake, shape.split)[0][0] if shape.split > 1 else fake  # the first is the largest
                _make_optimizer_state(twin, optimizer)
                tracker.measure_from_here()
                for index in range(passes):
                    tracker.reset_mod_stats()  # its per-module figures are per forward; a module runs once in each
                    if shape.sharded:
                        twin.set_requires_gradient_sync(index == passes - 1)  # type: ignore[operator]
                    with probe.counting_saved_tensors() as saved, precision.autocast():
                        loss = self.loss_of(twin, piece)
                    most["activations"] = max(most["activations"], saved.bytes)
                    most["gathered"] = max(most["gathered"], probe.gathered_at_once(saved.gathered_by_unit))
                    loss.backward()
                most["gradients"] = probe.gradients_bytes()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            most["parameters"], most["optimizer"] = probe.held_bytes(optimizer)
            return most, tracker.peak_by_category(self.device)


def stretched(batch: Any, longest: Sequence[Sequence[int]] | None) -> Any:
    """``batch`` with each tensor as long as the one in its place in ``longest`` (the shapes of the run's longest
    batch): each dimension but the first (the samples: as many as drawn, the batch size predicted) the larger of the
    two. As it is where the two do not pair up (another number of tensors, or of dimensions), and for a tensor of one
    dimension (a label a sample). A longer tensor is made empty: only its fake twin runs, whose values are never read."""
    if longest is None:
        return batch
    tensors = batch_tensors(batch)
    if len(tensors) != len(longest):
        return batch
    longer: dict[int, torch.Tensor] = {}
    for tensor, seen in zip(tensors, longest):
        if tensor.dim() < 2 or tensor.dim() != len(seen):
            continue
        shape = (tensor.shape[0], *(max(drawn, size) for drawn, size in zip(tensor.shape[1:], seen[1:])))
        if shape != tuple(tensor.shape):
            longer[id(tensor)] = torch.empty(shape, dtype=tensor.dtype)
    return map_batch_tensors(batch, lambda tensor: longer.get(id(tensor), tensor)) if longer else batch


def _stepping_as_the_run_would(optimizer: torch.optim.Optimizer, device: torch.device) -> torch.optim.Optimizer:
    """The twin's optimizer stepping as the run's would. Left to choose (``foreach=None``), torch steps real CUDA
    tensors with its foreach kernels, whose temporaries hold a copy of every parameter's at once, and fake tensors one
    by one (a FakeTensor is not a type it runs foreach on): the forecast would miss that peak on a GPU. The choice is
    made here as torch makes it for the run's own tensors, on its device."""
    from torch.utils._foreach_utils import _get_foreach_kernels_supported_devices

    for group in optimizer.param_groups:
        if group.get("foreach", False) is None and not group.get("fused") and not group.get("differentiable"):
            group["foreach"] = device.type in _get_foreach_kernels_supported_devices()
    return optimizer


def _make_optimizer_state(twin: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """The optimizer's state, made as its first step makes it (Adam's moments), on gradients of zeros: what the
    measured step holds through its forward and backward, for half the cost of a first step of its own."""
    for parameter in twin.parameters():
        if parameter.requires_grad:
            parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _tracker(twin: torch.nn.Module, optimizer: torch.optim.Optimizer, sharded: bool) -> _PeakOfTheStep:
    if sharded:
        return _ShardedStepTracker(twin, optimizer)
    tracker = _StepTracker()
    tracker.track_external(twin, optimizer)
    return tracker


class _PeakOfTheStep:
    """MemTracker's peak of the measured step. Its own ``_update_peak_stats`` also keeps each module's peak, walking
    every module the step ran at every op (60 % of a prediction of a 12-block GPT): here only the step's."""

    def measure_from_here(self) -> None:
        """Forget the first step's peak: the second is the one measured."""
        self._peak_mem, self._peak_mem_snap = {}, {}  # MemTracker's own, as it sets them on entry

    def _update_peak_stats(self, peak_state: Any) -> None:
        for device, snapshot in self._curr_mem_snap.items():  # type: ignore[attr-defined]
            if self._peak_mem.get(device, 0) < snapshot[_TOTAL]:
                self._peak_mem[device] = snapshot[_TOTAL]
                self._peak_mem_snap[device] = dict(snapshot)

    def _pre_fw_hook(self, module: torch.nn.Module, inputs: Any) -> None:
        """MemTracker's, for a module that runs itself inside its own forward too (a LightningModule's
        ``training_step`` calls ``self(x)`` inside the forward the engine calls), which it takes for the next
        iteration and refuses. Its per-module figures are all it would keep of that call; the step's are whole."""
        try:
            super()._pre_fw_hook(module, inputs)  # type: ignore[misc]
        except NotImplementedError as refused:
            if "multiple iterative calls" not in str(refused):
                raise

    def peak_by_category(self, device: torch.device) -> dict[str, int]:
        snapshot = self._peak_mem_snap.get(device, {})
        return {getattr(category, "value", category): value for category, value in snapshot.items()}


class _StepTracker(_PeakOfTheStep, MemTracker):
    pass


class _ShardedStepTracker(_PeakOfTheStep, FSDPMemTracker):
    pass


@contextlib.contextmanager
def _fake_process_group(shape: StepShape, device: torch.device) -> Iterator[Any]:
    """For FSDP2: a process group of ``world_size`` fake ranks (this process is rank 0; its collectives do nothing)
    and the mesh over it, made before any fake tensor exists (the mesh reads its ranks). Refused where this process is
    a rank of a real group: the forecast of a live run with ranks runs in a process of its own."""
    if not shape.sharded:
        yield None
        return
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise ForecastError("FSDP2's memory is predicted on a fake process group, and this process is a rank of a "
                            "real one; predict it from a process of its own.")
    hook = sys.excepthook  # init_process_group prefixes every later traceback with "[rank0]:"; the group is gone after
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=shape.world_size)
    try:
        yield init_device_mesh(device.type, (shape.world_size,))
    finally:
        dist.destroy_process_group()
        sys.excepthook = hook


def _ddp_buckets(twin: torch.nn.Module) -> int:
    """DDP's gradient buckets (its Reducer, ``gradient_as_bucket_view`` off as the ranks run it): a flat copy of
    every trainable parameter's gradient, held from the wrap on (``parameters()`` gives a tied one once)."""
    return sum(parameter.numel() * parameter.element_size() for parameter in twin.parameters() if parameter.requires_grad)


def _no_scaler(device: torch.device) -> Callable[[], torch.amp.GradScaler]:
    """fp16's loss scaling costs a scalar: the forecast autocasts as fp16 does and scales nothing."""
    return lambda: torch.amp.GradScaler(device.type, enabled=False)


def _refused(shape: StepShape, why: str, seconds: float) -> MemoryPrediction:
    return MemoryPrediction(settings=shape.settings(), peak_bytes=0, at_peak={}, parameters_bytes=0, gradients_bytes=0,
                            optimizer_bytes=0, activations_bytes=0, gathered_bytes=0, seconds=seconds, refused=why)


#: What an op that needs the data is, in the user's terms.
_OPS_IN_WORDS = {
    "aten._local_scalar_dense.default": "a tensor's value read in Python (.item(), float(t), if t > 0: ...)",
    "aten.nonzero.default": "nonzero (a shape that depends on the values: boolean indexing, torch.where(mask))",
}


def _cannot_run(error: Exception) -> str:
    """Why the step could not run on fake tensors, in a sentence naming the op and the user's line that called it."""
    op = str(getattr(error, "func", None) or type(error).__name__)
    frame = own_frame(error.__traceback__)
    where = f" at {frame.filename}:{frame.lineno} in {frame.name}()" if frame is not None else ""
    why = ("which fake tensors have no rule for" if isinstance(error, UnsupportedOperatorException)
           else "whose result depends on the data")
    return (f"the memory forecast runs a step on fake tensors (shapes, no data), and this model's step needs "
            f"{_OPS_IN_WORDS.get(op, op)}{where}, {why}: its memory cannot be predicted, only measured (train with "
            f"--memory-every 1 and read the memory view).")
