"""FSDP2 for the ranks (``parallel=fsdp``): the model sharded block by block, the optimizer moved onto the shards,
and whole tensors gathered where a checkpoint needs them.

``fully_shard`` (torch.distributed.fsdp, per-parameter DTensor sharding, as torchtitan applies it) goes on each of
the workload's checkpoint blocks, then on the root: a block's parameters are all-gathered just before its forward
and its gradients reduce-scattered after its backward, so no more than one block is ever whole on a rank. It is
applied last, as DDP is, to a model that resumed, took its options and had its optimizer built as a single
process would: the optimizer built before it still holds the parameters it replaced, so ``shard`` moves each group's
parameters and their state (Adam's moments) onto the shards, by the parameter's name. Everything else is the same
code for DDP and FSDP, and the losses are the same, in full precision and in bf16 (autocast for both; ``unit_policy``
gathers in bf16 only what autocast would cast): tests/process/test_fsdp.py.

Checkpoints hold whole tensors gathered on rank 0 (``gathered_whole``), in the same file as a DDP run's or a single
process's, not torch.distributed.checkpoint's sharded folder: a run changes world size and strategy while it
trains, and a file every world size and either strategy loads as it is keeps one resume path for all of them
(the model is loaded into the unsharded model, then sharded: ``ModelForms.wrap_for_ranks``). Gathering costs one
all-gather per tensor at a checkpoint, and holds one whole tensor at a time on each rank.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import torch

from torchlab.core.engine.nested_state import map_state
from torchlab.core.errors import ConfigError

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy


def is_shard(tensor: Any) -> bool:
    """Whether ``tensor`` is a DTensor (a shard of a parameter, or of its state). DTensor is imported only where a
    model is sharded (its import takes ~0.8 s of every trainer's start): where it is not loaded, nothing is one."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(tensor, module.DTensor)


def sharded_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules of ``model`` that FSDP2 sharded (each gathers its parameters for its forward), or none."""
    module = sys.modules.get("torch.distributed.fsdp")
    return [] if module is None else [unit for unit in model.modules() if isinstance(unit, module.FSDPModule)]


def shard(model: torch.nn.Module, blocks: list[torch.nn.Module], optimizer: torch.optim.Optimizer,
          reshard_after_forward: bool, param_dtype: torch.dtype | None) -> FSDPModule:
    """The model sharded (``shard_units``) once every rank holds rank 0's weights, and the optimizer's parameters and
    state moved onto the shards; the root, whose ``set_requires_gradient_sync`` holds the reduction back between
    micro-batches."""
    refuse_shared_across_blocks(blocks, model)
    _broadcast_from_rank_0(model)
    before = {id(parameter): name for name, parameter in model.named_parameters(remove_duplicate=False)}
    sharded = shard_units(model, blocks, reshard_after_forward, param_dtype)
    _move_optimizer(optimizer, before, dict(model.named_parameters(remove_duplicate=False)))
    return sharded


def shard_units(model: torch.nn.Module, blocks: list[torch.nn.Module], reshard_after_forward: bool,
                param_dtype: torch.dtype | None, mesh: Any = None) -> FSDPModule:
    """``fully_shard`` on each block, then on the root: the units and their mixed precision, the one definition the
    ranks train with and the memory forecast (core/engine/forecast/) predicts with, on its own ``mesh`` (a fake
    process group's). ``reshard_after_forward`` False keeps each block's parameters whole from its forward to its
    backward (one all-gather a step instead of two, the whole model's parameters held meanwhile). ``param_dtype``
    (amp=bf16, which autocasts as in one process: core/engine/precision.py ``ShardedBF16Precision``): where autocast
    would cast every parameter of a unit to it at every use, the unit's parameters are gathered in it
    (``unit_policy``)."""
    from torch.distributed.fsdp import fully_shard

    owners = _owner_types(model)
    in_blocks = {id(parameter) for block in blocks for parameter in block.parameters()}
    root_own = [parameter for parameter in model.parameters() if id(parameter) not in in_blocks]
    try:
        for block in blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward,
                        mp_policy=unit_policy(list(block.parameters()), owners, param_dtype))
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward,
                    mp_policy=unit_policy(root_own, owners, param_dtype))
    except Exception as error:  # a tied parameter in two blocks, a parameter FSDP cannot shard
        raise ConfigError(f"parallel (--parallel) fsdp: FSDP2 could not shard this model: {error}".rstrip(".") + ". "
                          "Train it with --parallel ddp.") from None
    return model  # type: ignore[return-value]  # fully_shard made the model an FSDPModule in place


#: The modules whose every parameter autocast casts to its dtype at each use: linear layers and convolutions are on
#: its list of lower-precision ops, on the CPU as on CUDA. Exact types: a subclass may use its weight elsewhere.
CAST_AT_EVERY_USE = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d,
                     torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d)


def unit_policy(parameters: list[torch.nn.Parameter], owners: dict[int, set[type]],
                param_dtype: torch.dtype | None) -> MixedPrecisionPolicy:
    """The mixed precision of one unit FSDP2 shards. Under amp the forward runs in autocast, as in one process and
    under DDP, so the losses are theirs: a unit whose parameters are all owned by ``CAST_AT_EVERY_USE`` modules is
    gathered in ``param_dtype`` (the numbers autocast's own cast would give, half the gathered bytes of fp32), its
    gradients reduced and accumulated in fp32, its inputs left as autocast hands them; any other unit (a norm's
    weights, an embedding, a parameter used as it is) is gathered as it is, and autocast keeps what it keeps. Never
    FSDP2's whole-forward bf16: a BatchNorm's running statistics and a float buffer stay fp32 (buffers are never
    cast), and an op mixing them with bf16 parameters fails (``expected scalar type BFloat16 but found Float``)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if param_dtype is None or not parameters or not all(
            owners[id(parameter)] <= set(CAST_AT_EVERY_USE) for parameter in parameters):
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32, cast_forward_inputs=False)


def _owner_types(model: torch.nn.Module) -> dict[int, set[type]]:
    """Each parameter's owning modules' types, by the parameter's id (a tied weight has several owners)."""
    owners: dict[int, set[type]] = {}
    for module in model.modules():
        for parameter in module.parameters(recurse=False):
            owners.setdefault(id(parameter), set()).add(type(module))
    return owners


def _broadcast_from_rank_0(model: torch.nn.Module) -> None:
    """Every rank's parameters and buffers made rank 0's, as DDP makes them when it wraps a model: each rank shards
    its own copy, and a model whose initialisation is not seeded alike on every rank (numpy's generator, a file
    read per rank) would otherwise be sharded into pieces of different models. A resumed model is the checkpoint's
    on every rank already; one broadcast per tensor, once, at the start."""
    import torch.distributed as dist

    seen: set[int] = set()
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.data_ptr() not in seen:  # a tied weight once
                seen.add(tensor.data_ptr())
                dist.broadcast(tensor.data, src=0)


def refuse_shared_across_blocks(blocks: list[torch.nn.Module], model: torch.nn.Module) -> None:
    """A ConfigError naming a parameter two blocks share (a tied weight): FSDP2 shards each block's parameters as a
    unit of their own, and fails on one held by two with a message that names nothing. Asked at the start, and before
    a live change to FSDP2 relaunches the ranks (which would refuse it at their start, and end the run)."""
    block_names = {id(module): name for name, module in model.named_modules()}
    owner: dict[int, str] = {}
    for block in blocks:
        name = block_names.get(id(block), "?")
        for parameter_name, parameter in block.named_parameters():
            first = owner.setdefault(id(parameter), name)
            if first != name:
                raise ConfigError(
                    f"parallel (--parallel) fsdp: {name}.{parameter_name} is also a parameter of {first}; FSDP2 shards "
                    f"each checkpoint block's parameters on their own, and cannot shard one two blocks share. Name "
                    f"blocks that share none in Workload.checkpoint_blocks, or train with --parallel ddp."
                )


def _move_optimizer(optimizer: torch.optim.Optimizer, before: dict[int, str],
                    after: dict[str, torch.nn.Parameter]) -> None:
    """Each parameter the optimizer holds replaced by the shard ``fully_shard`` put in its place (same name), and its
    state tensors of the parameter's shape sharded alike (from this rank's whole copy: every rank holds the same,
    so nothing is sent); scalars (Adam's ``step``) stay as they are."""
    moved: dict[torch.Tensor, torch.nn.Parameter] = {}
    for group in optimizer.param_groups:
        for index, parameter in enumerate(group["params"]):
            name = before.get(id(parameter))
            if name is None:
                raise ConfigError("parallel (--parallel) fsdp: the workload's optimizer holds a tensor that is not one "
                                  "of the model's parameters, which FSDP2 cannot shard; train it with --parallel ddp.")
            moved[parameter] = group["params"][index] = after[name]
    state = {}
    for parameter, values in optimizer.state.items():
        sharded = moved[parameter]
        state[sharded] = {key: _sharded_like(value, parameter, sharded) for key, value in values.items()}
    optimizer.state.clear()
    optimizer.state.update(state)


def _sharded_like(value: Any, whole: torch.Tensor, sharded: torch.Tensor) -> Any:
    from torch.distributed.tensor import distribute_tensor

    if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape != whole.shape:
        return value
    return distribute_tensor(value.to(sharded.device), sharded.device_mesh, sharded.placements, src_data_rank=None)


def gathered_whole(value: Any, keep: bool) -> Any:
    """``value`` (a state dict, nested) with each DTensor gathered whole: one all-gather per tensor, which every rank
    calls in the same order. ``keep``: this rank keeps the result, on the CPU, one tensor at a time (rank 0, which
    writes the checkpoint); the others drop each as it is gathered (None in its place)."""
    def gathered(shard: torch.Tensor) -> torch.Tensor | None:
        full = shard.full_tensor()  # an all-gather: every rank calls it, whether it keeps the result or not
        return full.cpu() if keep else None

    return map_state(value, is_shard, gathered, rest=lambda item: item)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of ``tensor`` (the tensor itself where it is not sharded): what lives in its memory."""
    return tensor._local_tensor if is_shard(tensor) else tensor
