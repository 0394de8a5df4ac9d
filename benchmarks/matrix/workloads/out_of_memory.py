"""Each model kind of the matrix, run on a device too small for its batch: a forward in training with more than half
the samples the run's first training forward had runs out of memory (``torch.OutOfMemoryError``, as CUDA's
allocator raises it), so the OOM rescue must split the batch (or checkpoint) for the run to go on.

    torchlab-tui benchmarks/matrix/workloads/out_of_memory.py:convnet

The limit is the device's, not the process's: it is kept in the file ``TORCHLAB_MATRIX_OOM_LIMIT_FILE`` names (the
first forward of the run writes it), so a resume, a rank and a rank started again by the rescue meet the same one.
Without that variable each process finds its own limit at its first forward.
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


def _samples(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return value.shape[0]
    return 0


class _Limit:
    """The most samples a training forward may take: half the first one's, shared through the file where one is
    named."""

    def __init__(self) -> None:
        self.samples: int | None = None
        self.path = Path(os.environ[LIMIT_FILE]) if os.environ.get(LIMIT_FILE) else None

    def of(self, first_forward: int) -> int:
        if self.samples is None and self.path is not None and self.path.exists():
            self.samples = int(self.path.read_text())
        if self.samples is None:
            self.samples = max(1, first_forward // 2)
            if self.path is not None:
                try:
                    with open(self.path, "x") as written:  # the first rank to get here sets it; the others read it
                        written.write(str(self.samples))
                except FileExistsError:
                    self.samples = int(self.path.read_text())
        return self.samples

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
        workload.model.register_forward_pre_hook(_Limit(), with_kwargs=True)
        return workload

    factory.__name__ = factory.__qualname__ = kind
    factory.__doc__ = f"The matrix's {kind} model on a device that holds half its batch."
    return factory


for _kind in MODELS:
    globals()[_kind] = _on_a_small_device(_kind)
