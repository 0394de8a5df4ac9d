"""A copy of training state in host memory, taken without stalling the step: what the spike guard rolls back to.

A trial's snapshot (core/engine/checkpointer.py ``snapshot``) clones on the device, for a trial's few seconds. The
spike guard keeps its copies for the whole run, so they live in host memory, where they cost the GPU nothing, and
are refilled in place every few steps (no allocation after the first). On CUDA the buffers are page-locked and
the parameters and optimizer state go to them on a side stream, while the next step's forward and backward run;
only that step's optimizer update, which writes those tensors in place, waits for the copy, on the device
(``before_update``: the host never waits). A module's buffers (BatchNorm's running statistics) change in the
forward itself: they are copied on the step's own stream, before it. On the CPU the copy is a ``copy_`` in place.
"""

from __future__ import annotations

from typing import Any

import psutil
import torch

from torchlab.core.engine.measure.memory import held_bytes
from torchlab.core.engine.nested_state import map_state
from torchlab.core.engine.parts import TrainingParts
from torchlab.core.engine.parallel.sharding import is_shard
from torchlab.core.options import OptionChangeError

#: The share of the host's available memory that rollback's two copies may take.
HOST_MEMORY_SHARE = 0.5


class HostCopy:
    """One copy of a state (a nest of dicts, lists and tensors, as ``state_dict`` returns) in host memory."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.step: int | None = None  #: the step whose end it holds
        self._buffers: list[torch.Tensor] = []
        self._state: Any = None
        self._copied: torch.cuda.Event | None = None
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    @property
    def bytes(self) -> int:
        return sum(buffer.numel() * buffer.element_size() for buffer in self._buffers)

    def capture(self, state: Any, step: int, on_step_stream: set[int] = frozenset()) -> None:
        """Copy ``state`` (the end of ``step``) into the buffers, the same ones each time its tensors keep their
        shapes. ``on_step_stream``: the ``data_ptr`` of tensors that the next step's forward changes (buffers)."""
        tensors: list[torch.Tensor] = []

        def slot(tensor: torch.Tensor) -> _Slot:
            tensor = tensor.detach()
            if is_shard(tensor):  # sharded (FSDP2): this rank's shard is what it copies, and gets back
                tensors.append(tensor.to_local())
                return _Slot(len(tensors) - 1, _ShardOf(tensor))
            tensors.append(tensor)
            return _Slot(len(tensors) - 1)

        skeleton = map_state(state, lambda value: isinstance(value, torch.Tensor), slot)
        if [(t.shape, t.dtype) for t in tensors] != [(b.shape, b.dtype) for b in self._buffers]:
            pin = self._stream is not None
            self._buffers = [torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin) for t in tensors]
        if self._stream is None:
            for buffer, tensor in zip(self._buffers, tensors):
                buffer.copy_(tensor)
        else:
            current = torch.cuda.current_stream(self.device)
            self._stream.wait_stream(current)  # the tensors as the step left them
            for buffer, tensor in zip(self._buffers, tensors):
                if tensor.data_ptr() in on_step_stream:
                    buffer.copy_(tensor, non_blocking=True)
            with torch.cuda.stream(self._stream):
                for buffer, tensor in zip(self._buffers, tensors):
                    if tensor.data_ptr() not in on_step_stream:
                        buffer.copy_(tensor, non_blocking=True)
            self._copied = self._stream.record_event()
        self._state, self.step = skeleton, step

    def before_update(self) -> None:
        """Before an optimizer step changes the tensors in place: the device waits for the copy (a no-op on CPU)."""
        if self._copied is not None:
            torch.cuda.current_stream(self.device).wait_event(self._copied)
            self._copied = None

    def state(self) -> Any:
        """The state as captured, for a part's ``load_state_dict``: a copy, so that an optimizer that keeps the
        tensors it loads (on the CPU it does) cannot change the buffers."""
        if self._copied is not None:
            self._copied.synchronize()  # captured at the boundary just before: its copy may still be on its way
            self._copied = None
        buffers = self._buffers

        def tensor(slot: _Slot) -> torch.Tensor:
            copied = buffers[slot.index].clone()
            return copied if slot.shard is None else slot.shard.made_from(copied)

        return map_state(self._state, lambda value: isinstance(value, _Slot), tensor)


class _ShardOf:
    """What makes a shard's copy a DTensor again, as the sharded tensor it was copied from (core/engine/parallel/sharding.py)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.mesh, self.placements = tensor.device_mesh, tensor.placements
        self.shape, self.stride, self.device = tensor.shape, tensor.stride(), tensor.to_local().device

    def made_from(self, local: torch.Tensor) -> torch.Tensor:
        """On its device: a DTensor's shards are where its mesh is (for a rollback, a shard's copy on the GPU a while)."""
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(local.to(self.device), self.mesh, self.placements, run_check=False, shape=self.shape,
                                  stride=self.stride)


class _Slot:
    """The place of the n-th tensor in a skeleton; ``shard``: it was this rank's shard of a DTensor."""

    __slots__ = ("index", "shard")

    def __init__(self, index: int, shard: _ShardOf | None = None) -> None:
        self.index, self.shard = index, shard


def check_rollback_fits(parts: TrainingParts, copies: int = 2) -> None:
    """OptionChangeError where the spike guard's ``copies`` host copies of the model and optimizer state would take more
    than ``HOST_MEMORY_SHARE`` of the host's available memory (AdamW's two moments assumed where the optimizer has
    made no state yet)."""
    model = parts.model.model
    model_bytes, optimizer_bytes = held_bytes([*model.parameters(), *model.buffers()], parts.optimization.optimizer)
    optimizer_bytes = optimizer_bytes if parts.optimization.optimizer.state else 2 * model_bytes
    needed = copies * (model_bytes + optimizer_bytes)
    available = psutil.virtual_memory().available
    if needed > HOST_MEMORY_SHARE * available:
        raise OptionChangeError(
            f"rollback keeps {copies} copies of the model and optimizer state in host memory, {needed / 2**30:.1f} GiB, "
            f"and this machine has {available / 2**30:.1f} GiB available: spike_guard=skip holds a spike's update back "
            f"without a copy"
        )
