"""Where the time goes, as a verdict (core/analysis/bottleneck.py): each phase's share of the steps, the bound a share
that large names with the change that tests it, and a verdict said once a kind, afresh after a change of settings."""

from __future__ import annotations

import pytest

from metrics_rows import metrics_row
from torchlab.core.analysis.bottleneck import MIN_STEPS, BottleneckWatch, phase_shares, verdict
from torchlab.core.options import LiveOptions
from torchlab.core.wire.payloads import StepPhases


def phases(data=0.0, copy=0.0, forward=0.010, backward=0.020, optimizer=0.002, communication=0.0, probes=0.0,
           other=0.001, steps=5, **counted) -> StepPhases:
    return StepPhases(data, copy, forward, backward, optimizer, communication, probes, other, steps=steps, **counted)


def test_each_phase_is_a_share_of_the_steps_weighted_by_the_steps_a_row_stands_for_and_the_probes_left_out():
    shares = phase_shares([phases(data=0.030, forward=0.010, backward=0.0, optimizer=0.0, other=0.0, probes=1.0, steps=1),
                           phases(data=0.0, forward=0.010, backward=0.0, optimizer=0.0, other=0.0, steps=2)])
    assert shares == {"data": 0.5, "copy": 0.0, "forward": 0.5, "backward": 0.0, "optimizer": 0.0,
                      "communication": 0.0, "other": 0.0}


def test_the_bound_named_is_the_phase_a_user_can_change_with_its_figure_and_key():
    assert verdict([phases(data=0.008, steps=MIN_STEPS - 1)]) is None  # too few steps to say
    input_bound = verdict([phases(data=0.021, forward=0.010, backward=0.015, optimizer=0.004, other=0.0)] * 2)
    assert input_bound.kind == "input-bound" and input_bound.phase == "data" and input_bound.trial == "workers=2"
    assert verdict([phases(data=0.021)] * 2, LiveOptions(workers=3)).trial == "workers=6"  # what T offers
    assert input_bound.text == "input-bound: 42 % of each step waits for data → W to raise the loader's workers (T to trial it)"
    copy_bound = verdict([phases(copy=0.012)] * 2)
    assert copy_bound.kind == "copy-bound" and "→ n to pin memory (T to trial it)" in copy_bound.text
    assert copy_bound.trial == "pin_memory=on"
    exposed = verdict([phases(communication=0.015)] * 2, LiveOptions(accum=2))
    assert exposed.kind == "communication-exposed" and exposed.trial == "accum=4"
    compute = verdict([phases(data=0.003)] * 2)
    assert compute.kind == "compute" and compute.phase == "backward" and compute.trial is None
    assert compute.text == "compute: forward 28 %, backward 56 %, optimizer 6 % of each step (89 % in all); data 8 %"


def test_a_verdict_is_said_when_its_kind_changes_and_again_for_other_settings_from_their_second_row():
    watch = BottleneckWatch()
    slow = phases(data=0.030)
    said = [watch.add(metrics_row(step, phases=slow)) for step in (5, 10, 15)]
    assert [found.kind if found else None for found in said] == [None, None, "input-bound"]  # the first opens it
    assert watch.add(metrics_row(18)) is None  # a row without phases: nothing
    after = [watch.add(metrics_row(step, workers=2, phases=row)) for step, row in ((20, slow), (25, phases()), (30, phases()))]
    assert [found.kind if found else None for found in after] == [None, None, "compute"]  # the change's start left out


def test_forward_and_backward_in_ops_as_short_as_an_ops_own_cost_are_launch_bound_else_compute_with_its_mfu():
    """1,000 ops a step in 30 ms of forward and backward: 30 us each, launch-bound (C compiles them into fewer); 100
    of 300 us each: compute, with the share of the device's peak the steps reached (MFU)."""
    counted = dict(flops=3e7, flops_per_s=3e7 / 0.033, peak_flops_per_s=1e11)
    launch = verdict([phases(ops=1000, **counted)] * 2)
    assert launch.kind == "launch-bound" and launch.trial == "compile=on" and launch.mfu == pytest.approx(0.0091, rel=0.01)
    assert launch.text == ("launch-bound: 1,000 ops a step of 30 µs each on average (an op's own cost on the host is a "
                           "few µs), 0.91 % of the device's peak FLOP/s → C to compile them into fewer (T to trial it)")
    compute = verdict([phases(ops=100, **counted)] * 2)
    assert compute.kind == "compute" and compute.text.endswith("; 0.91 % of the device's peak FLOP/s (MFU)")
    assert verdict([phases(ops=1000, **counted)] * 2, LiveOptions(compile=True)).kind == "compute"  # its ops were eager's
    assert verdict([phases()] * 2).mfu is None  # not counted (a CUDA run, for now): no MFU claimed

