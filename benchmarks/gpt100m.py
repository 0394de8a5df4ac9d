"""The GPU-bound workload of the GPU pass (issue 17): the sample GPT at GPT-2 small's shape, ~92M parameters.

12 blocks of width 768 with 12 heads, a 4,096-token vocabulary and 256-token sequences, batch 32 (8,192
tokens a step, about 4.5 TFLOP of training): on an H100 a step keeps the GPU busy for tens of
milliseconds, so what the engine adds on the host hides behind the kernels unless it synchronises. Its
launch-bound counterpart is ``tiny_gpt`` (a step of a few milliseconds of small kernels).

    torchlab-tui benchmarks/gpt100m.py:workload --device cuda --headless --steps 200
    python benchmarks/probe_overhead.py --device cuda --workload benchmarks/gpt100m.py:workload

``TORCHLAB_GPT100M_BATCH`` sets the batch (to fill a smaller or larger GPU). ``TORCHLAB_GPT100M_SMALL=1``
makes it a 2-block, width-128 model: ``gpu_pass.sh`` sets it when it checks itself on a CPU
(``DEVICE=cpu``), where the full model takes seconds a step; no figure is ever taken from that size.
"""

from __future__ import annotations

import os

from torchlab.core.workload import Workload
from torchlab.sample_models.tiny_gpt import make_workload

#: How the benchmarks name this workload to the engine (``--workload gpt100m`` in host_syncs.py and
#: lightning_overhead.py).
SPEC = f"{__file__}:workload"
FULL = {"d_model": 768, "n_layers": 12, "n_heads": 12}
SMALL = {"d_model": 128, "n_layers": 2, "n_heads": 4}


def workload() -> Workload:
    shape = SMALL if os.environ.get("TORCHLAB_GPT100M_SMALL") == "1" else FULL
    return make_workload(
        vocab_size=4096,
        context_length=256,
        dropout=0.0,  # the kernels, not the dropout masks' random numbers, are what the pass measures
        num_train=1024,  # 32 batches an epoch: the data only has to keep the kernels fed
        num_val=32,
        batch_size=int(os.environ.get("TORCHLAB_GPT100M_BATCH", "32")),
        **shape,
    )
