"""Each built-in sample learns when trained by the engine (small sizes, so the suite stays fast)."""

from __future__ import annotations

import pytest

from trainers import make_trainer
from torchlab.core.engine.seeding import seed_everything
from torchlab.sample_models import convnet, mlp, tiny_gpt

SMALL = {
    "mlp": (mlp, dict(hidden_dim=64, num_blocks=2, num_train=2048, num_val=256), dict(lr=3e-3, batch_size=64)),
    "convnet": (convnet, dict(stem_channels=8, stage_channels=(16, 16), num_train=1024, num_val=256), dict(lr=3e-3, batch_size=32)),
    "tiny_gpt": (tiny_gpt, dict(d_model=48, n_layers=2, n_heads=2, context_length=32, num_train=1024, num_val=128), dict(lr=3e-3, batch_size=16)),
}


@pytest.mark.parametrize("name", list(SMALL))
def test_sample_learns_under_the_engine(name):
    module, sizes, settings = SMALL[name]
    seed_everything(0)
    workload = module.make_workload(**sizes)
    trainer, seen = make_trainer(name, workload=workload, steps=60, eval_every=60, **settings)
    assert trainer.run().status == "finished"
    losses = [record.loss for record in seen.metrics]
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.7 * first, f"{name}: loss {first:.3f} -> {last:.3f}"
    assert seen.metrics[-1].val_loss < first
