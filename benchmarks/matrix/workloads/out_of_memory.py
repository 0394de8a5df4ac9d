"""Each model kind of the matrix, run on a device too small for its batch: a forward in training with more than half
the samples one forward takes at the run's start (``PIECES``) runs out of memory (``torch.OutOfMemoryError``, as
CUDA's allocator raises it), so the OOM rescue must split the batch (or checkpoint) for the run to go on.

    torchlab-tui benchmarks/matrix/workloads/out_of_memory.py:convnet

The limit is the device's, not the process's: it is kept in the file ``TORCHLAB_MATRIX_OOM_LIMIT_FILE`` names (the
run's first process writes it), so a resume, a rank, and ranks started again for a rescue or another world size meet
the same one. A workload that names no batch size (or a run without PIECES) takes half its first training
forward's samples instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the matrix's list of model kinds, from the checkout
from benchmarks.matrix.factors import MODELS  # noqa: E402
from torchlab.core.engine.adapters.loading import load_workload  # noqa: E402
from torchlab.core.workload import Workload  # noqa: E402

LIMIT_FILE = "TORCHLAB_MATRIX_OOM_LIMIT_FILE"
#: The pieces a batch is cut into at the run's start (ranks × split): a forward then takes batch_size / PIECES.
PIECES = "TORCHLAB_MATRIX_OOM_PIECES"


def _samples(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return value.shape[0]
    return 0


class _Limit:
    """The most samples a training forward may take, shared through the file where one is named."""

    def __init__(self, batch_size: int | None) -> None:
        self.path = Path(os.environ[LIMIT_FILE]) if os.environ.get(LIMIT_FILE) else None
        self.samples: int | None = None
        if batch_size and os.environ.get(PIECES):  # half of what one forward takes at the start
            self.samples = self._shared(max(1, batch_size // int(os.environ[PIECES]) // 2))

    def _shared(self, samples: int) -> int:
        """``samples``, or the limit an earlier process of the run set."""
        if self.path is None:
            return samples
        mine = self.path.with_name(f"{self.path.name}.{os.getpid()}")
        mine.write_text(str(samples))
        try:  # the first process to get here sets it, whole (a link is made at once); the others read it
            os.link(mine, self.path)
            return samples
        except FileExistsError:
            return int(self.path.read_text())
        finally:
            mine.unlink()

    def of(self, first_forward: int) -> int:
        if self.samples is None:
            self.samples = self._shared(max(1, first_forward // 2))
        return self.samples

    @torch.compiler.disable  # the device's limit is the real tensors', not what dynamo's tracing would make of them
    def __call__(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not torch.is_grad_enabled():
            return  # an evaluation's forward keeps no activations: it fits
        samples = _samples(args, kwargs)
        limit = self.of(samples)
        if samples > limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB for {samples} samples "
                                         f"(the matrix's device holds {limit})")


def _on_a_small_device(kind: str):
    def factory() -> Workload:
        workload = load_workload(MODELS[kind][0])
        workload.model.register_forward_pre_hook(_Limit(workload.batch_size), with_kwargs=True)
        return workload

    factory.__name__ = factory.__qualname__ = kind
    factory.__doc__ = f"The matrix's {kind} model on a device that holds half its batch."
    return factory


for _kind in MODELS:
    globals()[_kind] = _on_a_small_device(_kind)
