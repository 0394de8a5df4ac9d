"""What core/engine/parallel/sharding.py decides before any process group: a model FSDP2 cannot shard is refused, naming why.
Sharding itself runs in rank processes: tests/process/test_fsdp.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torchlab.core.engine.parallel.sharding import is_shard, shard
from torchlab.core.errors import ConfigError


def test_a_parameter_two_checkpoint_blocks_share_is_refused_by_name():
    shared = nn.Linear(4, 4)
    model = nn.Sequential(nn.Sequential(shared, nn.ReLU()), nn.Sequential(shared, nn.ReLU()), nn.Linear(4, 1))
    optimizer = torch.optim.AdamW(model.parameters())
    with pytest.raises(ConfigError, match=r"1\.0\.weight is also a parameter of 0; .*--parallel ddp"):
        shard(model, [model[0], model[1]], optimizer, True, None)
    assert not any(is_shard(parameter) for parameter in model.parameters())  # refused before anything was sharded


@pytest.fixture
def group_of_one(tmp_path):
    """A gloo process group of this process alone: FSDP2 shards over one rank as over many (tests/process/test_fsdp.py
    runs real ranks)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("factory", ["cnn_with_batchnorm", "scaled_by_buffer"])
def test_bf16_on_a_sharded_model_trains_as_autocast_trains_the_whole_model(group_of_one, factory):
    """A BatchNorm (running statistics) and a float buffer stay fp32 under autocast; FSDP2's bf16 must leave them so
    (they failed its first step: 'expected scalar type BFloat16 but found Float', 'mat1 and mat2 must have the same
    dtype'), and give autocast's numbers: a unit is gathered in bf16 only where autocast casts every parameter."""
    from torchlab.core.engine.precision import make_precision
    from workloads import mixed_precision

    def build():
        torch.manual_seed(0)
        workload = getattr(mixed_precision, factory)()
        model = workload.model
        return workload, model, torch.optim.AdamW(model.parameters(), lr=1e-2)

    device = torch.device("cpu")
    workload, whole_model, whole_optimizer = build()
    _, sharded_model, sharded_optimizer = build()
    blocks = list(next(child for child in sharded_model.children() if isinstance(child, nn.Sequential)))
    precision = make_precision("bf16", device, lambda: None, sharded=True)
    shard(sharded_model, blocks, sharded_optimizer, True, precision.param_dtype)
    autocast = make_precision("bf16", device, lambda: None)

    batches = torch.utils.data.DataLoader(workload.dataset, batch_size=16)
    for batch, _ in zip(batches, range(3)):
        losses = []
        for model, optimizer, mode in ((whole_model, whole_optimizer, autocast), (sharded_model, sharded_optimizer, precision)):
            with mode.autocast():
                loss = workload.loss_fn(model, batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        assert losses[0] == losses[1]
    for (name, whole), sharded in zip(whole_model.state_dict().items(), sharded_model.state_dict().values()):
        assert torch.equal(whole, sharded.full_tensor() if is_shard(sharded) else sharded), name
