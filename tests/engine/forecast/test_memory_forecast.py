"""The memory forecast (core/engine/forecast/): a step's memory predicted on fake tensors, against the memory the
trainer measures on the real tensors of the same step (core/engine/measure/memory.py)."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.distributed as dist

from trainers import TINY, WORKLOADS, make_trainer
from torchlab.core.engine.adapters.loading import load_workload
from torchlab.core.engine.forecast.fake_twin import parameters_on_meta
from torchlab.core.engine.forecast.for_workload import largest_batch, workload_forecast
from torchlab.core.engine.forecast.memory_forecast import KINDS
from torchlab.core.engine.forecast.step_shape import StepShape, candidate_shapes, configured_shape
from torchlab.core.wire.payloads import MemoryPrediction
from torchlab.core.errors import ForecastError
from torchlab.core.records.config import build_config

RESIDUAL_CNN = f"{WORKLOADS / 'tiny.py'}:residual_cnn"  # BatchNorm in its blocks
TIED_BATCHNORM = f"{WORKLOADS / 'tied_batchnorm.py'}:workload"  # an embedding tied to the head, BatchNorm1d
VARYING = f"{WORKLOADS / 'tiny.py'}:varying_lengths"  # text padded per batch, the dataset's first samples its shortest


def forecast_of(spec: str, on_meta: bool = False):
    config = build_config({}, {"workload": spec})
    if on_meta:
        with parameters_on_meta():
            workload = load_workload(spec)
    else:
        workload = load_workload(spec)
    return workload, workload_forecast(workload, config, torch.device("cpu"))


@pytest.mark.parametrize("spec", [RESIDUAL_CNN, TIED_BATCHNORM])
@pytest.mark.parametrize("options", [{}, {"amp": "bf16"}, {"checkpointing": True}, {"split": 2}, {"accum": 2}],
                         ids=["off", "bf16", "checkpointing", "split2", "accum2"])
def test_each_kind_predicted_is_what_the_trainer_measures_on_the_same_step(spec, options):
    trainer, seen = make_trainer(spec, steps=2, memory_every=1, options=options)
    trainer.run()
    measured = seen.metrics[-1].memory
    _, forecast = forecast_of(spec, on_meta=True)
    shape = StepShape(batch_size=trainer.parts.batch_size, **{"checkpointing": False, **options})
    predicted = forecast.predict(shape)
    for kind in KINDS:
        real, fake = getattr(measured, f"{kind}_bytes"), getattr(predicted, f"{kind}_bytes")
        assert fake == pytest.approx(real, rel=0.02, abs=64), kind
    assert predicted.peak_bytes == sum(predicted.at_peak.values())
    assert predicted.peak_bytes > predicted.parameters_bytes + predicted.optimizer_bytes


@pytest.mark.parametrize("spec", [f"{WORKLOADS / 'hf_trainer.py'}:workload", f"{WORKLOADS / 'lightning_module.py'}:module"],
                         ids=["transformers_trainer", "lightning_module"])
def test_a_model_written_for_another_trainer_is_predicted_as_the_engine_trains_it(spec):
    """A transformers Trainer (its factory moves the model: built whole, not on meta) and a LightningModule (its
    training_step calls the module inside its own forward), each with its own optimizer, batch and settings."""
    trainer, seen = make_trainer(spec, steps=2, memory_every=1)
    trainer.run()
    measured = seen.metrics[-1].memory
    config = build_config({}, {"workload": spec})
    workload = load_workload(spec)
    options = {**(workload.settings or {})}
    shape = StepShape(batch_size=trainer.parts.batch_size, accum=options.get("accum", 1))
    predicted = workload_forecast(workload, config, torch.device("cpu")).predict(shape)
    for kind in KINDS:
        real, fake = getattr(measured, f"{kind}_bytes"), getattr(predicted, f"{kind}_bytes")
        assert fake == pytest.approx(real, rel=0.03, abs=64), kind


def test_a_model_built_on_meta_is_never_given_storage_and_stays_as_it_was():
    workload, forecast = forecast_of(TIED_BATCHNORM, on_meta=True)
    assert {parameter.device.type for parameter in workload.model.parameters()} == {"meta"}
    assert workload.model.head.weight is workload.model.embed.weight  # still tied: one parameter
    forecast.predict(StepShape(batch_size=16))
    assert {parameter.device.type for parameter in workload.model.parameters()} == {"meta"}
    assert torch.nn.Module.register_parameter.__name__ == "register_parameter"  # put back


def test_a_live_models_weights_are_not_touched_by_a_prediction():
    workload, forecast = forecast_of(TINY)
    before = {name: tensor.clone() for name, tensor in workload.model.state_dict().items()}
    forecast.predict(StepShape(batch_size=16, amp="bf16", checkpointing=True))
    assert all(torch.equal(before[name], tensor) for name, tensor in workload.model.state_dict().items())
    assert all(parameter.grad is None for parameter in workload.model.parameters())


def test_the_twin_of_a_live_model_leaves_the_engines_hooks_and_checkpointing_behind_and_keeps_the_models_own():
    """A live model may carry a probe's hooks and checkpointing's forward (a closure over the live block): the twin
    of one whose step ran out of memory (the OOM rescue's forecast) must not write into the live run's figures or
    run the live block."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from torchlab.core.engine.activation_checkpointing import ActivationCheckpointing
    from torchlab.core.engine.forecast.fake_twin import fake_twin
    from torchlab.core.engine.measure.probes import ActivationStatsProbe

    workload = load_workload(TINY)
    model = workload.model
    ActivationCheckpointing(model, None).enable()
    stats = ActivationStatsProbe(model, ["stem", "head"])
    stats.attach()
    own = model.head.register_forward_hook(lambda module, args, output: None)  # the model's own: part of its memory
    twin = fake_twin(model, FakeTensorMode(), torch.device("cpu"))
    assert not any("forward" in vars(block) for block in twin.body)  # unwrapped: the forecast wraps per prediction
    assert len(twin.stem._forward_hooks) == 0 and list(twin.head._forward_hooks) == [own.id]
    assert all("forward" in vars(block) for block in model.body) and len(model.stem._forward_hooks) == 1  # untouched
    stats.detach()


def test_a_tied_weight_is_counted_once():
    workload, forecast = forecast_of(TIED_BATCHNORM, on_meta=True)
    unique = sum(parameter.numel() * 4 for parameter in workload.model.parameters())  # parameters() yields it once
    buffers = sum(buffer.numel() * buffer.element_size() for buffer in workload.model.buffers())
    assert forecast.predict(StepShape(batch_size=16)).parameters_bytes == unique + buffers


def test_fsdp_on_two_ranks_is_predicted_on_a_fake_process_group_that_is_gone_afterwards():
    _, forecast = forecast_of(TIED_BATCHNORM, on_meta=True)
    hook = sys.excepthook
    one = forecast.predict(StepShape(batch_size=16))
    sharded = forecast.predict(StepShape(batch_size=16, world_size=2, parallel="fsdp"))
    assert sharded.parameters_bytes < 0.6 * one.parameters_bytes  # each rank holds its shards (and the buffers whole)
    assert sharded.optimizer_bytes == pytest.approx(one.optimizer_bytes / 2, rel=0.05)
    assert sharded.activations_bytes < 0.6 * one.activations_bytes  # half the batch on each rank
    assert sharded.gathered_bytes > 0
    assert not dist.is_initialized() and sys.excepthook is hook


def test_ddp_ranks_hold_their_gradient_buckets_beside_the_gradients():
    workload, forecast = forecast_of(TIED_BATCHNORM, on_meta=True)
    split, ddp = forecast.predict(StepShape(batch_size=16, split=2)), forecast.predict(StepShape(batch_size=16, world_size=2))
    trainable = sum(parameter.numel() * 4 for parameter in workload.model.parameters())
    assert ddp.at_peak["other"] >= trainable
    assert ddp.activations_bytes == pytest.approx(split.activations_bytes, rel=0.01)  # 8 samples a piece, or a rank


def test_a_setting_this_device_cannot_run_is_refused_with_the_reason_and_no_figures():
    _, forecast = forecast_of(TINY)
    prediction = forecast.predict(StepShape(batch_size=16, amp="fp16"))
    assert "fp16 needs CUDA" in prediction.refused and prediction.peak_bytes == 0


def test_a_batch_larger_than_the_dataset_is_no_prediction_of_fewer_samples():
    _, forecast = forecast_of(TINY)
    with pytest.raises(ForecastError, match="a batch of 1000 samples a rank: the dataset gives at most 256"):
        forecast.predict(StepShape(batch_size=1000))


def test_the_largest_batch_is_where_the_line_through_two_predictions_meets_the_limit():
    configured = StepShape(batch_size=32, world_size=2)  # 16 a rank
    at, twice = (MemoryPrediction(settings={}, peak_bytes=peak, at_peak={}, parameters_bytes=0, gradients_bytes=0,
                                  optimizer_bytes=0, activations_bytes=0, gathered_bytes=0, seconds=0.0)
                 for peak in (1000 + 16 * 10, 1000 + 32 * 10))  # 1000 bytes and 10 a sample
    assert largest_batch(configured, at, twice, limit=1000 + 100 * 10 + 9) == 200  # 100 a rank, both ranks
    assert largest_batch(configured, at, twice, limit=1005) is None  # not one sample a rank


def test_each_shape_is_predicted_once():
    _, forecast = forecast_of(TINY)
    assert forecast.predict(StepShape(batch_size=16)) is forecast.predict(StepShape(batch_size=16))


def test_a_step_that_reads_a_tensors_value_cannot_be_predicted_and_the_error_names_the_op():
    _, forecast = forecast_of(f"{WORKLOADS / 'tiny.py'}:reads_its_loss")
    with pytest.raises(ForecastError, match=r"value read in Python \(\.item\(\).*tiny.py:\d+ in checked_mse\(\).*depends on the data.*--memory-every 1"):
        forecast.predict(StepShape(batch_size=16))


def test_the_candidates_are_each_change_once_and_the_least_memory_last():
    config = build_config({}, {"workload": "mlp", "options": {"amp": "bf16"}})
    configured = configured_shape(config.options, 32, config.reshard_after_forward)
    listed = candidate_shapes(configured, gpus=4)
    changes = [change for change, _ in listed]
    assert changes == ["as configured", "amp=off", "amp=fp16", "checkpointing=on", "split=2", "batch_size=64",
                       "world_size=4, parallel=ddp", "world_size=4, parallel=fsdp",
                       "checkpointing=on, world_size=4, parallel=fsdp"]
    assert len({shape for _, shape in listed}) == len(listed)


def test_a_prediction_with_the_longest_batchs_shapes_is_what_a_step_on_it_measures():
    """The forecast's batch is the dataset's first samples (4 tokens each here); with the shapes of the run's longest
    batch it is stretched to them, and its kinds are what the trainer measured on a step of that batch."""
    trainer, seen = make_trainer(VARYING, steps=24, memory_every=1)
    trainer.run()
    longest = seen.of("longest_batch")[-1]
    measured = next(row.memory for row in reversed(seen.metrics) if row.memory.longest_batch)
    _, forecast = forecast_of(VARYING, on_meta=True)
    shape = StepShape(batch_size=trainer.parts.batch_size)
    first_samples = forecast.predict(shape)
    predicted = forecast.predict(shape, longest["shapes"])
    assert predicted.activations_bytes > 4 * first_samples.activations_bytes
    for kind in KINDS:
        assert getattr(predicted, f"{kind}_bytes") == pytest.approx(getattr(measured, f"{kind}_bytes"), rel=0.02, abs=64), kind
    doubled = forecast.predict(StepShape(batch_size=2 * trainer.parts.batch_size), longest["shapes"])
    assert doubled.activations_bytes == pytest.approx(2 * predicted.activations_bytes, rel=0.02)  # samples as asked
    assert forecast.predict(shape, [[8, 4], [8]]) is first_samples  # no longer than the first samples: the same answer
    assert forecast.predict(shape, [[8, 4, 1]]) is first_samples  # another batch's tensors: the batch as drawn

