"""The longest batch a run has taken: the one whose tensors hold the most elements.

With batches of varying length (text padded to each batch's longest sequence, images of varying size) a step's
activations vary with its batch, and the longest batch is the one that must fit. The run's forecaster predicts with
its shapes (core/engine/forecast/forecaster.py: the trainer announces each longer one, ``longest_batch``), and a
prediction is checked only against figures measured on a batch as long (``MemoryBreakdown.longest_batch``): a
shorter step measured against a longer step predicted would read as the forecast's error, and "correct" the next
prediction by it. The longest is kept in the checkpoint's data state, so that a resumed run predicts with it from
its first step. A batch's length is counted on the host (its tensors' shapes): nothing is read from the device.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from torchlab.core.engine.batch_split import batch_tensors

#: How many of the last batches taken keep their length: a step's first batch is among them.
_RECENT = 64


@dataclass(frozen=True)
class BatchLength:
    """A batch's tensors' shapes, in the batch's order (``batch_tensors``), and their elements together."""

    elements: int
    shapes: tuple[tuple[int, ...], ...]

    def as_dict(self) -> dict[str, Any]:
        return {"elements": self.elements, "shapes": [list(shape) for shape in self.shapes]}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> BatchLength:
        return cls(int(state["elements"]), tuple(tuple(int(size) for size in shape) for shape in state["shapes"]))


class LongestBatch:
    """Follows the batches a rank takes (``took``): the longest so far, which of the recent ones were as long, and the
    recent ones' shapes."""

    def __init__(self) -> None:
        self.longest: BatchLength | None = None
        #: Batches taken by this process.
        self.taken = 0
        #: The ``taken`` count when a batch as long as the longest was last taken; 0: none in this process (a resumed
        #: run's longest may have been taken before it).
        self.longest_taken_at = 0
        #: The ``taken`` count when the CUDA allocator's peak was last reset (option_hooks.py: each option's segment).
        self.peak_reset_at = 0
        self._recent: deque[int] = deque(maxlen=_RECENT)  # the elements of the last batches taken
        self._recent_shapes: deque[tuple] = deque(maxlen=_RECENT)  # and their tensors' shapes

    def took(self, batch: Any) -> None:
        """Count ``batch``, taken for training: a walk over its tensors' shapes, each step's batches once."""
        tensors = batch_tensors(batch)
        elements = sum(tensor.numel() for tensor in tensors)
        self.taken += 1
        shapes = tuple(tensor.shape for tensor in tensors)
        self._recent.append(elements)
        self._recent_shapes.append(shapes)
        if self.longest is None or elements > self.longest.elements:
            self.longest = BatchLength(elements, tuple(map(tuple, shapes)))
        if elements == self.longest.elements:
            self.longest_taken_at = self.taken

    def was_longest(self, taken: int) -> bool:
        """Whether the ``taken``-th batch (1: this process's first) is as long as the longest so far. False where it
        is not among the recent ones, or not taken yet."""
        back = self.taken - taken
        if self.longest is None or not 0 <= back < len(self._recent):
            return False
        return self._recent[-1 - back] == self.longest.elements

    def shapes_of(self, taken: int) -> tuple | None:
        """The tensors' shapes of the ``taken``-th batch (1: this process's first), where it is a recent one: what a
        step's FLOPs depend on (measure/flops.py)."""
        back = self.taken - taken
        return self._recent_shapes[-1 - back] if 0 <= back < len(self._recent_shapes) else None

    def measured_on_longest(self, taken_before_step: int, allocator_peak: bool) -> bool:
        """Whether a memory step's figures were measured on a batch as long as the longest so far: the allocator's
        peak (CUDA) on any taken since it was reset; the tensors' count (a CPU's figures) on the step's first batch,
        the ``taken_before_step + 1``-th, whose forward's saved tensors are the ones counted (instruments.py)."""
        if allocator_peak:
            return self.longest_taken_at > self.peak_reset_at
        return self.was_longest(taken_before_step + 1)

    def state_dict(self) -> dict[str, Any] | None:
        return self.longest.as_dict() if self.longest is not None else None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """The longest a checkpoint knew, where longer than this one's: what the run has seen is not undone by a
        restore (a trial's arm, a rollback), whose batches it took all the same."""
        if state is None:
            return
        restored = BatchLength.from_dict(state)
        if self.longest is None or restored.elements > self.longest.elements:
            self.longest = restored
