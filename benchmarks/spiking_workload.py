"""A workload whose loss spikes at chosen steps, for benchmarks/stress_kills.py (``spiking_workload.py:workload``).

A small regression (a few ms a step on a CPU) whose loss is multiplied by ``SPIKE_FACTOR`` on every step that is a
multiple of ``SPIKE_EVERY`` from ``FIRST_SPIKE`` on: far above its window, so the spike guard acts on each (with
``--spike-guard rollback``, a rollback every ``SPIKE_EVERY`` steps, whose events land between the checkpoints of a
short ``--checkpoint-every``). The spikes follow the step the engine trains (``before_step``), not a count of
calls, so a resumed run spikes at the same steps as the run it continues. Isolated spikes: never the
``SHIFT_STEPS`` in a row that the guard takes for a new level.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from torchlab.core.workload import Workload

#: The loss of a spiking step is this many times its own (the guard's threshold is a few deviations).
SPIKE_FACTOR = 100.0
#: Every this many steps, from the first after the guard's window has filled (core/engine/guards/spike_guard.py's
#: MIN_HISTORY is 20).
SPIKE_EVERY = 17
FIRST_SPIKE = 34


def workload() -> Workload:
    generator = torch.Generator().manual_seed(11)
    inputs = torch.randn(512, 8, generator=generator)
    targets = torch.tanh(inputs @ torch.randn(8, 1, generator=generator))
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    step_trained = [0]

    def before_step(step: int, epoch: int) -> None:
        step_trained[0] = step

    def loss_fn(model: nn.Module, batch) -> torch.Tensor:
        features, wanted = batch
        loss = nn.functional.mse_loss(model(features), wanted)
        step = step_trained[0]
        return loss * SPIKE_FACTOR if step >= FIRST_SPIKE and step % SPIKE_EVERY == 0 else loss

    return Workload(model=model, dataset=TensorDataset(inputs, targets), loss_fn=loss_fn, batch_size=16,
                    before_step=before_step)
