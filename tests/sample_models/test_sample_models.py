"""The built-in sample workloads: they learn, their data is fixed, and their structure fits the engine.

Each sample is built at a small size through ``make_workload(...)`` so the whole file runs in seconds
on a 2-core CPU; the default sizes are what the CLI trains and are only built, never trained, here.
"""

from __future__ import annotations

import itertools
from types import ModuleType

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, default_collate

from torchlab.core.workload import Workload
from torchlab.sample_models import convnet, mlp, tiny_gpt

SMALL_SIZES: dict[str, dict] = {
    "mlp": dict(hidden_dim=64, num_blocks=2, num_train=1024, num_val=128, batch_size=64),
    "convnet": dict(stem_channels=8, stage_channels=(16, 16), num_train=1024, num_val=128, batch_size=64),
    "tiny_gpt": dict(
        d_model=32, n_layers=2, n_heads=2, context_length=16, num_train=512, num_val=64, batch_size=16
    ),
}
SAMPLES: dict[str, ModuleType] = {"mlp": mlp, "convnet": convnet, "tiny_gpt": tiny_gpt}
# The tiny GPT needs more steps than the others to get past the unigram statistics.
TRAIN_STEPS: dict[str, int] = {"mlp": 80, "convnet": 80, "tiny_gpt": 120}
LEARNING_RATE = 3e-3


def _small_workload(name: str) -> Workload:
    return SAMPLES[name].make_workload(**SMALL_SIZES[name])


def _stacked(dataset: Dataset) -> tuple[torch.Tensor, ...]:
    """Every item of a map-style dataset, collated into one tuple of tensors."""
    return tuple(default_collate([dataset[index] for index in range(len(dataset))]))


def _train_losses(workload: Workload, steps: int) -> list[float]:
    """Plain AdamW loop, the way a user would train the workload without torchlab."""
    model = workload.model
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.01)
    loader = DataLoader(workload.dataset, batch_size=workload.batch_size, shuffle=True, drop_last=True)
    batches = itertools.chain.from_iterable(itertools.repeat(loader))
    losses = []
    for batch in itertools.islice(batches, steps):
        loss = workload.loss_fn(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _largest_block_container(model: nn.Module) -> str:
    """The name the engine's default checkpointing picks: the largest ModuleList/Sequential by params."""
    containers = {
        name: sum(p.numel() for p in module.parameters())
        for name, module in model.named_modules()
        if isinstance(module, (nn.ModuleList, nn.Sequential))
    }
    return max(containers, key=containers.__getitem__)


@pytest.mark.parametrize("name", SAMPLES)
def test_small_sample_learns(name: str) -> None:
    torch.manual_seed(0)
    losses = _train_losses(_small_workload(name), TRAIN_STEPS[name])
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert all(torch.isfinite(torch.tensor(losses)))
    assert last < 0.7 * first, f"{name}: loss went from {first:.3f} to only {last:.3f}"


@pytest.mark.parametrize("name", SAMPLES)
def test_data_ignores_the_training_seed(name: str) -> None:
    torch.manual_seed(0)
    first = _small_workload(name)
    torch.manual_seed(12345)
    torch.rand(7)  # move the global RNG further on, in case only the seed were compared
    second = _small_workload(name)
    for split in ("dataset", "val_dataset"):
        for a, b in zip(_stacked(getattr(first, split)), _stacked(getattr(second, split)), strict=True):
            assert torch.equal(a, b), f"{name}.{split} changed with the global seed"


@pytest.mark.parametrize("name", SAMPLES)
def test_data_seed_changes_the_data(name: str) -> None:
    first = SAMPLES[name].make_workload(**SMALL_SIZES[name], data_seed=0)
    second = SAMPLES[name].make_workload(**SMALL_SIZES[name], data_seed=1)
    assert not torch.equal(_stacked(first.dataset)[0], _stacked(second.dataset)[0])


@pytest.mark.parametrize("name", SAMPLES)
def test_val_set_is_held_out(name: str) -> None:
    workload = _small_workload(name)
    assert workload.val_dataset is not None
    train_inputs, *_ = _stacked(workload.dataset)
    val_inputs, *_ = _stacked(workload.val_dataset)
    assert len(val_inputs) == SMALL_SIZES[name]["num_val"]
    assert val_inputs.shape[1:] == train_inputs.shape[1:] and val_inputs.dtype == train_inputs.dtype
    train_rows = {row.numpy().tobytes() for row in train_inputs.flatten(1)}
    shared = sum(row.numpy().tobytes() in train_rows for row in val_inputs.flatten(1))
    assert shared == 0, f"{name}: {shared} validation samples also appear in the training set"


@pytest.mark.parametrize("name", SAMPLES)
def test_batches_are_tuples_of_tensors(name: str) -> None:
    workload = _small_workload(name)
    batch = next(iter(DataLoader(workload.dataset, batch_size=4)))
    assert isinstance(batch, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in batch)
    assert workload.loss_fn(workload.model, batch).dim() == 0


@pytest.mark.parametrize("name", SAMPLES)
def test_zero_argument_factory_gives_a_complete_workload(name: str) -> None:
    workload = SAMPLES[name].workload()
    assert isinstance(workload, Workload)
    assert workload.val_dataset is not None and len(workload.val_dataset) > 0
    assert workload.batch_size is not None
    # A module-level function, so error messages can name it.
    assert workload.loss_fn.__name__ != "<lambda>"
    assert getattr(SAMPLES[name], workload.loss_fn.__name__) is workload.loss_fn


@pytest.mark.parametrize(
    ("name", "container"), [("mlp", "blocks"), ("convnet", "stages"), ("tiny_gpt", "blocks")]
)
def test_default_checkpointing_picks_the_repeated_blocks(name: str, container: str) -> None:
    assert _largest_block_container(_small_workload(name).model) == container


def test_mlp_has_an_in_place_relu() -> None:
    # The engine's backward hooks must cope with in-place activations; this sample is its witness.
    modules = _small_workload("mlp").model.modules()
    assert any(isinstance(module, nn.ReLU) and module.inplace for module in modules)


def test_convnet_stage_modules_have_stable_names() -> None:
    modules = dict(_small_workload("convnet").model.named_modules())
    assert isinstance(modules["stages.0.conv1"], nn.Conv2d)
    assert isinstance(modules["stages.0.bn1"], nn.BatchNorm2d)
    assert isinstance(modules["stages.1.bn2"], nn.BatchNorm2d)


def test_tiny_gpt_blocks_are_a_module_list() -> None:
    model = _small_workload("tiny_gpt").model
    assert isinstance(model.blocks, nn.ModuleList)
    assert len(model.blocks) == SMALL_SIZES["tiny_gpt"]["n_layers"]


def test_tiny_gpt_is_causal() -> None:
    torch.manual_seed(0)
    workload = _small_workload("tiny_gpt")
    model = workload.model.eval()
    tokens, _ = workload.dataset[0]
    changed = tokens.clone()
    changed[10] = (changed[10] + 1) % model.tok_emb.num_embeddings
    with torch.no_grad():
        before, after = model(tokens[None]), model(changed[None])
    assert torch.equal(before[0, :10], after[0, :10]), "a position saw a later token"
    assert not torch.allclose(before[0, 10:], after[0, 10:])


def test_tiny_gpt_targets_are_inputs_shifted_by_one() -> None:
    dataset = _small_workload("tiny_gpt").dataset
    inputs, targets = dataset[3]
    assert inputs.shape == targets.shape == (SMALL_SIZES["tiny_gpt"]["context_length"],)
    assert torch.equal(inputs[1:], targets[:-1])


def test_tiny_gpt_dropout_is_configurable() -> None:
    default = tiny_gpt.make_workload(**SMALL_SIZES["tiny_gpt"]).model
    without = tiny_gpt.make_workload(**SMALL_SIZES["tiny_gpt"], dropout=0.0).model
    assert {m.p for m in default.modules() if isinstance(m, nn.Dropout)} == {0.1}
    assert {m.p for m in without.modules() if isinstance(m, nn.Dropout)} == {0.0}
