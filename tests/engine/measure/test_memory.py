"""Memory by kind, counted on the tensors (core/engine/measure/memory.py): what checkpointing and AMP change, on a CPU."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from trainers import WORKLOADS, make_trainer
from torchlab.core.engine.adapters.loading import load_workload
from torchlab.core.engine.measure.memory import OUTSIDE_THE_MODEL, MemoryCadence, MemoryProbe, SavedTensorCount
from torchlab.core.wire.payloads import MemoryBreakdown

RESIDUAL_CNN = f"{WORKLOADS / 'tiny.py'}:residual_cnn"


def measured(options: dict, steps: int = 3, **settings) -> MemoryBreakdown:
    trainer, seen = make_trainer(RESIDUAL_CNN, steps=steps, memory_every=1, options=options, **settings)
    trainer.run()
    return seen.metrics[-1].memory


def test_parameters_gradients_and_optimizer_state_are_their_storages_counted_once():
    memory = measured({})
    model = load_workload(RESIDUAL_CNN).model
    parameter_bytes = sum(p.numel() * 4 for p in model.parameters())
    assert memory.parameters_bytes == parameter_bytes + sum(b.numel() * b.element_size() for b in model.buffers())
    assert memory.gradients_bytes == parameter_bytes
    assert memory.optimizer_bytes == 2 * parameter_bytes + 4 * len(list(model.parameters()))  # AdamW: two moments, a step each
    assert memory.allocator_peak_bytes is None  # no CUDA allocator on a CPU


def test_checkpointing_lowers_the_activations_saved_and_keeps_the_blocks_inputs():
    plain, checkpointed = measured({}), measured({"checkpointing": True})
    assert checkpointed.activations_bytes < 0.8 * plain.activations_bytes
    by_module = {entry.module: entry.bytes for entry in checkpointed.by_module}
    # A checkpointed block saves nothing inside; what it keeps is its input for the recompute.
    assert by_module["blocks.1"] == 32 * 16 * 16 * 16 * 4
    assert not any(name.startswith("blocks.1.") for name in by_module)
    assert {entry.module: entry.bytes for entry in plain.by_module}.keys() & {"blocks.1.bn1", "blocks.1.bn2"}


def test_bf16_autocast_saves_fewer_activation_bytes():
    assert measured({"amp": "bf16"}).activations_bytes < 0.7 * measured({}).activations_bytes


def test_what_the_loss_fn_saves_outside_the_model_is_its_own_entry_and_the_modules_are_largest_first():
    memory = measured({})
    names = [entry.module for entry in memory.by_module]
    assert OUTSIDE_THE_MODEL in names  # cross_entropy's log-softmax, saved in the workload's own code
    sizes = [entry.bytes for entry in memory.by_module]
    assert sizes == sorted(sizes, reverse=True) and sum(sizes) == memory.activations_bytes


def test_a_tensor_saved_twice_or_a_view_of_a_parameter_is_not_counted_again():
    model = nn.Linear(8, 8)
    probe = MemoryProbe(model, lambda: [])
    x = torch.randn(4, 8, requires_grad=True)
    with probe.counting_saved_tensors() as saved:
        y = (x * x).sum() + (x * model.weight.t()[0]).sum()  # x saved twice; a view of the weight saved
    assert saved.bytes == x.numel() * 4  # x once; the weight is a parameter, not an activation
    y.backward()


def test_the_hooks_are_gone_after_the_measured_forward():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with MemoryProbe(model, lambda: []).counting_saved_tensors():
        model(torch.randn(2, 4))
    from torch.nn.modules import module as torch_module

    assert not torch_module._global_forward_hooks and not torch_module._global_forward_pre_hooks


def test_measured_steps_follow_the_cadence_and_are_written_in_metrics(tmp_path):
    trainer, seen = make_trainer(RESIDUAL_CNN, steps=6, memory_every=3)
    trainer.run()
    assert [record.step for record in seen.metrics if record.memory is not None] == [3, 6]


def test_memory_is_not_measured_under_the_profiler(tmp_path):
    trainer, seen = make_trainer(RESIDUAL_CNN, steps=6, memory_every=1, profile_at=[2], profile_steps=2,
                                 profiles_dir=tmp_path)
    trainer.run()
    profiled = {record.step for record in seen.metrics if record.memory is None}
    assert profiled and 1 not in profiled  # the profiler's steps, and only those, are left out


def test_auto_measures_at_most_once_a_second():
    now = [0.0]
    cadence = MemoryCadence("auto", clock=lambda: now[0])
    assert cadence.due(1)
    cadence.measured()
    now[0] = 0.9
    assert not cadence.due(2)
    now[0] = 1.0
    assert cadence.due(3)


def test_the_breakdown_round_trips_through_the_protocol():
    from torchlab.core.wire import protocol

    memory = measured({}, steps=1)
    line = protocol.Memory(breakdown=memory).json_text()
    assert protocol.decode(line) == protocol.Memory(breakdown=memory)
    assert json.loads(line)["breakdown"]["by_module"][0].keys() == {"module", "bytes"}


@pytest.mark.parametrize("bad", [{"activations_bytes": "lots"}, {"by_module": [{"module": "x"}]}])
def test_a_malformed_breakdown_is_refused_with_its_path(bad):
    from torchlab.core.wire import protocol

    fields = json.loads(protocol.Memory(breakdown=measured({}, steps=1)).json_text())
    fields["breakdown"].update(bad)
    with pytest.raises(protocol.ProtocolError, match="memory.breakdown"):
        protocol.decode(json.dumps(fields))


def test_an_activation_at_the_address_of_a_unit_freed_parameters_is_counted_as_an_activation():
    """FSDP2 frees a block's gathered parameters after its forward, and the allocator may give their address to an
    activation saved later: counted as a gathered parameter of that block, it made the gathered bytes of a bf16
    step 608 where half of fp32's, 576, was right (tests/process/test_fsdp.py, now and then)."""
    unit = torch.nn.Linear(4, 4, bias=False)
    count = SavedTensorCount(set(), {unit: "body.0"}, set())
    count.gathered_by(unit, ())
    count.released_by(unit, (), None)
    later = torch.empty(0).set_(unit.weight.detach().untyped_storage())  # another tensor at the freed address
    count.pack(later)
    assert count.gathered_by_unit == {} and count.bytes == 64
