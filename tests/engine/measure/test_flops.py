"""A step's FLOPs and the device's peak (core/engine/measure/flops.py): counted with torch's formulas on a training
step once for each kind of step, equal to a hand count, recompute under checkpointing counted as such and left out of
the MFU; by module and by op; the MFU they give on the probe's rows."""

from __future__ import annotations

import pytest
import torch

from trainers import TINY, WORKLOADS, make_trainer
from torchlab.core.analysis.bottleneck import BOUND_SHARE, LAUNCH_MFU, LAUNCH_US_PER_OP, BottleneckWatch, use_of_the_device
from torchlab.core.engine.measure.flops import StepFlops, measured_cpu_peak

#: TinyNet (tests/workloads/tiny.py), a batch of 16: a Linear 8→16, three Linear 16→16 blocks, a Linear 16→1.
BATCH, LAYERS = 16, [(8, 16), (16, 16), (16, 16), (16, 16), (16, 1)]
FORWARD = sum(2 * BATCH * fan_in * fan_out for fan_in, fan_out in LAYERS)
#: backward: each layer's weight gradient, and its input's but the first's (the batch needs none)
BACKWARD = FORWARD + sum(2 * BATCH * fan_in * fan_out for fan_in, fan_out in LAYERS[1:])
BLOCKS_FORWARD = sum(2 * BATCH * fan_in * fan_out for fan_in, fan_out in LAYERS[1:4])


@pytest.mark.parametrize("checkpointing, recomputed", [(False, 0), (True, BLOCKS_FORWARD)], ids=["off", "checkpointing"])
def test_an_mlps_step_counts_what_a_hand_count_says_with_checkpointings_recompute(checkpointing, recomputed):
    trainer, seen = make_trainer(TINY, steps=20, probe_every=5, options={"checkpointing": checkpointing})
    trainer.run()
    measured = [row.phases for row in seen.metrics if row.phases is not None]
    assert {phases.flops for phases in measured} == {FORWARD + BACKWARD}  # the model's: its MFU leaves recompute out
    [event] = seen.of("flops_counted")
    assert (event["flops"], event["recomputed"]) == (FORWARD + BACKWARD, recomputed)
    assert measured[0].steps == 4  # the counted step is left out of the step times: it ran through Python's dispatch
    for phases in measured:
        assert phases.flops_per_s == pytest.approx(phases.flops / (sum(phases.seconds().values()) - phases.probes_s), rel=0.01)
        assert 0 < phases.mfu < 0.01  # a model this small keeps a CPU's matrix units idle


@pytest.mark.parametrize("checkpointing", [False, True], ids=["off", "checkpointing"])
def test_each_modules_flops_are_its_own_ops_forward_backward_and_recomputed(checkpointing):
    """TinyNet's by module, as a hand count says: a block's Linear 2·B·16·16 forward, twice that backward (its weight's
    gradient and its input's), the stem's backward only its weight's (the batch needs no gradient); under
    checkpointing each block's forward once more, as recompute. One event a kind of step, by op too."""
    trainer, seen = make_trainer(TINY, steps=6, options={"checkpointing": checkpointing})
    trainer.run()
    [event] = seen.of("flops_counted")
    block = 2 * BATCH * 16 * 16
    by_module = {entry.module: (entry.forward, entry.backward, entry.recompute) for entry in event["by_module"]}
    assert by_module == {"stem": (2 * BATCH * 8 * 16, 2 * BATCH * 8 * 16, 0),
                         **{f"body.{index}.0": (block, 2 * block, block if checkpointing else 0) for index in range(3)},
                         "head": (2 * BATCH * 16, 4 * BATCH * 16, 0)}
    ran = event["flops"] + event["recomputed"]
    assert sum(entry.total for entry in event["by_module"]) == ran == sum(entry.flops for entry in event["by_op"])
    assert event["recomputed"] == (3 * block if checkpointing else 0)
    assert event["step"] == 1 and event["settings"] == {"checkpointing": checkpointing, "split": 1, "accum": 1}
    assert {entry.op for entry in event["by_op"]} == {"aten::mm", "aten::addmm"}


def test_a_model_taking_gradients_in_its_forward_is_counted_by_module_without_backward_hooks():
    """The gradient penalty (autograd.grad with create_graph inside forward): each module's forward as TinyNet's,
    the penalty's gradients charged to the modules whose nodes they ran (more than their own backward), and it trains."""
    trainer, seen = make_trainer(f"{WORKLOADS / 'tiny.py'}:gradient_penalty", steps=4)
    assert trainer.run().status == "finished"
    [event] = seen.of("flops_counted")
    by_module = {entry.module: entry for entry in event["by_module"]}
    assert by_module["net.body.0.0"].forward == 2 * BATCH * 16 * 16
    assert by_module["net.body.0.0"].backward > 2 * 2 * BATCH * 16 * 16  # its backward, and the penalty's through it


def test_a_transformer_blocks_attention_is_counted_on_a_cpu_as_torch_counts_it_on_cuda():
    """torch's table has CUDA's attention kernels; a CPU's (flash attention for the CPU) are counted alike: forward
    two products, backward four and the scores again (flash recomputes them)."""
    torch.manual_seed(0)
    width, heads, ff, batch, length = 32, 4, 64, 4, 16
    layer = torch.nn.TransformerEncoderLayer(width, heads, ff, dropout=0.0, batch_first=True)
    tokens = batch * length
    linears = [(width, 3 * width), (width, width), (width, ff), (ff, width)]
    linear_forward = sum(2 * tokens * fan_in * fan_out for fan_in, fan_out in linears)
    linear_backward = 2 * linear_forward - 2 * tokens * width * 3 * width  # the input's gradient is not taken
    product = 2 * batch * length * length * width  # one of attention's products, all heads together
    hand = linear_forward + linear_backward + (2 + 4 + 1) * product
    flops = StepFlops(layer, torch.device("cpu"))
    with flops.counting() as counted:
        layer(torch.randn(batch, length, width)).sum().backward()
    assert counted().flops == pytest.approx(hand, rel=0.02) and counted().ops > 50


def test_a_cpus_peak_is_measured_for_each_dtype_once():
    flops = StepFlops(torch.nn.Linear(1, 1), torch.device("cpu"))
    peak = flops.peak(torch.float32)
    assert 1e8 < peak < 1e14 and flops.peak(torch.float32) == peak  # measured once
    assert flops.peak(torch.bfloat16) > 0 and torch.bfloat16 in flops._peaks
    assert measured_cpu_peak() > 1e8


def test_a_model_too_small_to_keep_the_cpu_busy_is_launch_bound_and_a_convnet_is_not():
    """TinyNet's matrices are 16 wide: each op is the host's own cost of an op (a few µs idle, tens beside a loaded
    suite) and its FLOP/s a ten-thousandth of the CPU's peak; the residual convnet's ops take milliseconds. What is
    named follows the rule (core/analysis/bottleneck.py) from the figures; the figures' order is what holds on any
    load."""
    uses = {}
    for spec in (TINY, f"{WORKLOADS / 'tiny.py'}:residual_cnn"):
        trainer, seen = make_trainer(spec, steps=30, probe_every=5)
        trainer.run()
        watch = BottleneckWatch()
        for row in seen.metrics:
            watch.add(row)
        use = use_of_the_device(list(watch.measured))
        launch_bound = use.op_us <= LAUNCH_US_PER_OP and use.mfu < LAUNCH_MFU
        # beside a suite keeping both cores busy, TinyNet's loading (Python's own work) reached 22 % of its step: the
        # rule names what the user can change first, the loader (seen with two busy loops beside the test)
        expected = ("input-bound" if watch.current.shares["data"] >= BOUND_SHARE
                    else "launch-bound" if launch_bound else "compute")
        assert watch.current.kind == expected, watch.current.text
        uses[spec] = use
    tiny, convnet = uses.values()
    assert tiny.mfu < 0.01 and convnet.op_us > 4 * tiny.op_us and convnet.mfu > 3 * tiny.mfu
    assert not (convnet.op_us <= LAUNCH_US_PER_OP and convnet.mfu < LAUNCH_MFU)  # tens of us an op at a fifth of the peak


def test_a_model_taking_autograd_grad_in_its_forward_trains_with_its_flops_counted():
    """A gradient penalty (a WGAN-GP critic) calls autograd.grad(create_graph=True) inside forward: FlopCounterMode's
    module tracking broke its first step ("A leaf node was passed to _will_engine_execute_node"); the count that only
    reads counts it, the penalty's products too."""
    trainer, seen = make_trainer(f"{WORKLOADS / 'tiny.py'}:gradient_penalty", steps=10, probe_every=5)
    outcome = trainer.run()
    assert outcome.status == "finished"
    assert [row.phases.flops for row in seen.metrics if row.phases is not None][0] > FORWARD + BACKWARD


def test_a_peak_given_to_the_run_is_what_its_mfu_is_held_to():
    """``--peak-tflops``: for a device the table lacks (a GPU not in it, a MIG slice), and in place of a CPU's measure."""
    trainer, seen = make_trainer(TINY, steps=10, probe_every=5, peak_tflops="0.001")
    trainer.run()
    measured = [row.phases for row in seen.metrics if row.phases is not None]
    assert measured and {phases.peak_flops_per_s for phases in measured} == {1e9}
    assert measured[-1].mfu == pytest.approx(measured[-1].flops_per_s / 1e9)


def test_where_the_devices_peak_is_not_known_the_mfu_is_left_out_and_said_once():
    trainer, seen = make_trainer(TINY, steps=15, probe_every=5)
    trainer.instruments.step_flops.peak = lambda dtype, convolutions=0.0: None  # a GPU the table lacks
    trainer.run()
    measured = [row.phases for row in seen.metrics if row.phases is not None]
    assert len(measured) == 3 and all(phases.flops_per_s > 0 and phases.mfu is None for phases in measured)
    said = [log["text"] for log in seen.of("log") if "MFU is left out" in log["text"]]
    assert len(said) == 1 and "--peak-tflops" in said[0], said
