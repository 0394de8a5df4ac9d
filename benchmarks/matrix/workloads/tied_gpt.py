"""The sample GPT with its head's weight tied to the token embedding (as GPT-2's), small enough for a matrix cell:
both ends of the tie live in the root, outside the checkpoint blocks, so FSDP2 shards it as one unit.

    torchlab-tui benchmarks/matrix/workloads/tied_gpt.py:workload
"""

from __future__ import annotations

from torchlab.core.workload import Workload
from torchlab.sample_models.tiny_gpt import make_workload


def workload() -> Workload:
    return make_workload(vocab_size=32, context_length=16, d_model=32, n_layers=2, n_heads=2, tie_weights=True,
                         num_train=512, num_val=64, batch_size=8)
