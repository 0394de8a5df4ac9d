"""Memory by kind, measured on the tensors themselves: the same figures on a CPU as on CUDA.

The process RSS cannot say what an option did to memory: it only grows (a profiler snapshot took a
trainer from 0.4 to 1.5 GiB for good), and it counts Python, libraries and the allocator's cache.
On a sampled step ``MemoryProbe`` counts what training holds, each storage once (a view, a tied
weight, a tensor saved twice all count once):

- parameters (and buffers), gradients, optimizer state: the storages behind them, after backward;
- activations saved for backward: every tensor autograd saves in the forward, as a
  ``torch.autograd.graph.saved_tensors_hooks`` pack hook sees it (the hook returns the tensor itself:
  nothing changes but the count), parameters left out. Inside a block under activation checkpointing
  the checkpoint's own hooks take the tensors (they are recomputed, not kept), so they are not counted;
  the block's inputs, which the recompute keeps, are. Under autocast the low-precision copies of the
  weights that the ops save are counted: they are held for backward too.
- parameters gathered whole (``parallel=fsdp``): a sharded block's parameters, all-gathered for its forward, that
  its ops save for backward, are not activations: they are counted as ``gathered_bytes``, as much as is held at
  once. With ``reshard_after_forward`` (the default) each block's are freed after its forward and gathered again
  for its backward, so one block's at a time (the largest), with the root's, which FSDP2 never frees between
  forward and backward; without it, every block's, from its forward to its backward.

Each activation byte is charged to the innermost module of the model running when it was saved
(global module forward hooks, present only on the measured forward: registering a pair on each module
cost 0.4 ms for 25 modules, the global pair ~0.25 ms in all), ``(loss_fn)`` outside the model. With
gradient accumulation one micro-batch's forward is measured: the next one's activations are made
after the previous backward freed them. Under torch.compile the model runs as compiled graphs whose
modules no hook sees: what the graphs save (the compiled model's activations, fewer than eager's) is
charged to the model as a whole, ``(root)``.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterable, Iterator

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from torchlab.core.engine.parallel.sharding import is_shard, local, sharded_units
from torchlab.core.engine.measure.probes import ROOT_MODULE_NAME
from torchlab.core.wire.payloads import MemoryBreakdown, ModuleBytes

#: Where the workload's own code (its ``loss_fn`` around the model) saved tensors.
OUTSIDE_THE_MODEL = "(loss_fn)"
#: ``--memory-every auto``: a sampled step at most this often, so its hooks cost a fixed share of a second.
AUTO_MEMORY_INTERVAL_S = 1.0
#: torch warns that global module hooks also fire for the wrapper torch.compile returns. Here they do, and charge
#: nothing to it: the wrapper is no module of the model, what is saved inside it goes to the model's modules.
_COMPILED_WRAPPER_WARNING = r"Using `torch.compile\(module\)` when there are global hooks on modules"


class MemoryCadence:
    """Decides on which steps memory is measured: every ``every`` steps (0 = never), or ``"auto"``: the first
    step after ``AUTO_MEMORY_INTERVAL_S`` has passed since the last measured one. A measured step costs the
    hooks' Python, ~1 us per saved tensor and module (``benchmarks/memory_cost.py``): once a second that is
    a share of a second whatever the step time, where every N steps would cost most on the fastest steps."""

    def __init__(self, every: int | str, clock: Callable[[], float] = time.monotonic) -> None:
        self.fixed = None if every == "auto" else int(every)
        self._clock = clock
        self._last_at = -float("inf")

    def due(self, step: int) -> bool:
        if self.fixed is not None:
            return self.fixed > 0 and step % self.fixed == 0
        return self._clock() - self._last_at >= AUTO_MEMORY_INTERVAL_S

    def measured(self) -> None:
        self._last_at = self._clock()


class SavedTensorCount:
    """The bytes saved for backward during one forward, by the innermost module running."""

    def __init__(self, not_counted: set[int], modules: dict[torch.nn.Module, str], keeps_inputs: set[torch.nn.Module]) -> None:
        self.bytes = 0
        self.by_module: dict[str, int] = {}
        #: sharded (FSDP2): the gathered parameters' storages (by address) -> the module that gathered them, as each
        #: gathers (``gathered_by``); and what each module's ops saved of them
        self.gathered: dict[int, str] = {}
        self.gathered_by_unit: dict[str, int] = {}
        self._seen = set(not_counted)  # storages (by address) counted already, or not to count: the parameters'
        self._modules = modules
        self._keeps_inputs = keeps_inputs
        self._running: list[str] = []

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        self._count(tensor)
        return tensor

    def enter(self, module: torch.nn.Module, args: tuple) -> None:
        # A module outside the model (a loss module in the workload's code) is charged to what runs it.
        self._running.append(self._modules.get(module) or (self._running[-1] if self._running else OUTSIDE_THE_MODEL))
        if module in self._keeps_inputs:  # checkpointed: its inputs are what the recompute keeps
            for value in args:
                if isinstance(value, torch.Tensor):
                    self._count(value)

    def leave(self, module: torch.nn.Module, args: tuple, output: object) -> None:
        self._running.pop()

    def gathered_by(self, unit: torch.nn.Module, args: tuple) -> None:
        """After FSDP2 gathered ``unit``'s parameters for its forward: they are its plain (not DTensor) parameters
        until it frees them (those of the blocks inside it are still shards)."""
        name = self._modules.get(unit, ROOT_MODULE_NAME)
        for parameter in unit.parameters():
            if not is_shard(parameter):
                self.gathered[storage_key(parameter.untyped_storage())] = name

    def released_by(self, unit: torch.nn.Module, args: tuple, output: object) -> None:
        """After ``unit``'s forward: what its ops saved of its gathered parameters is counted, and the addresses of
        those it frees (resharded) go back to the allocator. An activation given one of them later is no parameter:
        left in ``gathered`` it was counted as one (a 32-byte tensor now and then, as the allocator chose)."""
        name = self._modules.get(unit, ROOT_MODULE_NAME)
        for address in [address for address, owner in self.gathered.items() if owner == name]:
            del self.gathered[address]

    def _count(self, tensor: torch.Tensor) -> None:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # no storage of its own (sparse, some tensor subclasses)
            return
        address, size = storage_key(storage), storage.nbytes()
        if size == 0 or address in self._seen:
            return
        self._seen.add(address)
        unit = self.gathered.get(address)
        if unit is not None:
            self.gathered_by_unit[unit] = self.gathered_by_unit.get(unit, 0) + size
            return
        owner = self._running[-1] if self._running else OUTSIDE_THE_MODEL
        self.bytes += size
        self.by_module[owner] = self.by_module.get(owner, 0) + size


class MemoryProbe:
    """Counts a sampled step's memory by kind (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, checkpointed_blocks: Callable[[], Iterable[torch.nn.Module]],
                 reshard_after_forward: bool = True) -> None:
        self.model = model
        self._modules = {module: name or ROOT_MODULE_NAME for name, module in model.named_modules()}
        self._sharded_units = sharded_units(model)
        self._reshard_after_forward = reshard_after_forward
        # Walked once: ``model.parameters()`` walks every module again (0.5 ms a call on a 25-module CNN).
        self._parameters = list(model.parameters())
        self._model_tensors = self._parameters + list(model.buffers())
        self._checkpointed_blocks = checkpointed_blocks

    @contextlib.contextmanager
    def counting_saved_tensors(self) -> Iterator[SavedTensorCount]:
        """Around one forward: counts what it saves for backward. Its hooks are gone when it exits."""
        count = SavedTensorCount(_storages(self._model_tensors), self._modules, set(self._checkpointed_blocks()))
        entering = register_module_forward_pre_hook(count.enter)
        # after FSDP2's own pre-forward hook, registered when it sharded the unit: the parameters are gathered then
        gathering = [unit.register_forward_pre_hook(count.gathered_by) for unit in self._sharded_units]
        gathering += [unit.register_forward_hook(count.released_by, always_call=True) for unit in self._sharded_units]
        try:
            leaving = register_module_forward_hook(count.leave, always_call=True)
            try:
                with torch.autograd.graph.saved_tensors_hooks(count.pack, _unpack), warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=_COMPILED_WRAPPER_WARNING, category=UserWarning)
                    yield count
            finally:
                leaving.remove()
        finally:
            entering.remove()
            for hook in gathering:
                hook.remove()

    def breakdown(self, step: int, saved: SavedTensorCount, gradients_bytes: int, optimizer: torch.optim.Optimizer,
                  device: torch.device, longest_batch: bool) -> MemoryBreakdown:
        """The step's figures, once its optimizer step is taken (its state exists from the first); ``longest_batch``:
        measured on a batch as long as the longest the run has taken (``MemoryBreakdown.longest_batch``)."""
        parameters_bytes, optimizer_bytes = self.held_bytes(optimizer)
        return MemoryBreakdown(
            step=step,
            parameters_bytes=parameters_bytes,
            gradients_bytes=gradients_bytes,
            optimizer_bytes=optimizer_bytes,
            activations_bytes=saved.bytes,
            gathered_bytes=self.gathered_at_once(saved.gathered_by_unit),
            allocator_peak_bytes=torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
            by_module=[ModuleBytes(name, size) for name, size in sorted(saved.by_module.items(), key=lambda item: -item[1])],
            longest_batch=longest_batch,
        )

    def gathered_at_once(self, by_unit: dict[str, int]) -> int:
        """Of the gathered parameters saved for backward, what is held at once (see the module docstring)."""
        if not self._reshard_after_forward:
            return sum(by_unit.values())
        blocks = [size for unit, size in by_unit.items() if unit != ROOT_MODULE_NAME]
        return by_unit.get(ROOT_MODULE_NAME, 0) + max(blocks, default=0)

    def held_bytes(self, optimizer: torch.optim.Optimizer) -> tuple[int, int]:
        """``held_bytes`` of this model (its tensors walked once, when the probe was made)."""
        return held_bytes(self._model_tensors, optimizer)

    def gradients_bytes(self) -> int:
        """The gradients' storages, read after backward and before they are set to None."""
        return sum(_storages(p.grad for p in self._parameters if p.grad is not None).values())


def held_bytes(model_tensors: Iterable[torch.Tensor], optimizer: torch.optim.Optimizer) -> tuple[int, int]:
    """What lives across steps, in bytes: the model's tensors (its parameters and buffers), and the optimizer's
    state, not counting a storage the model holds."""
    parameters = _storages(model_tensors)
    optimizer_tensors = (value for state in optimizer.state.values() for value in state.values() if isinstance(value, torch.Tensor))
    return sum(parameters.values()), sum(size for address, size in _storages(optimizer_tensors).items() if address not in parameters)


def _storages(tensors: Iterable[torch.Tensor]) -> dict[int, int]:
    """Each distinct storage behind ``tensors``: its address -> its bytes."""
    found: dict[int, int] = {}
    for tensor in tensors:
        storage = local(tensor).untyped_storage()  # sharded (FSDP2): this rank's shard, what it holds
        found[storage_key(storage)] = storage.nbytes()
    return found


def storage_key(storage: torch.UntypedStorage) -> int:
    """A storage's identity while it lives: its StorageImpl (``_cdata``, what torch's own ``StorageWeakRef`` keys on),
    the same for every view of it. Not its ``data_ptr``: a fake tensor's is 0 for all (the memory forecast counts
    with this probe too, core/engine/forecast/)."""
    return storage._cdata


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocation that failed: CUDA's ``torch.OutOfMemoryError``, or the CPU allocator's
    RuntimeError ("DefaultCPUAllocator: can't allocate memory"), which torch does not type."""
    return isinstance(error, torch.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and "can't allocate memory" in str(error)
    )
