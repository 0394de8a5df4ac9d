"""What core/engine/sharding.py decides before any process group: a model FSDP2 cannot shard is refused, naming why.
Sharding itself runs in rank processes: tests/process/test_fsdp.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torchlab.core.engine.sharding import is_shard, shard
from torchlab.core.errors import ConfigError


def test_a_parameter_two_checkpoint_blocks_share_is_refused_by_name():
    shared = nn.Linear(4, 4)
    model = nn.Sequential(nn.Sequential(shared, nn.ReLU()), nn.Sequential(shared, nn.ReLU()), nn.Linear(4, 1))
    optimizer = torch.optim.AdamW(model.parameters())
    with pytest.raises(ConfigError, match=r"1\.0\.weight is also a parameter of 0; .*--parallel ddp"):
        shard(model, [model[0], model[1]], optimizer, True, None)
    assert not any(is_shard(parameter) for parameter in model.parameters())  # refused before anything was sharded
