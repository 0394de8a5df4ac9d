"""The run's forecaster (core/engine/forecast/forecaster.py and forecaster_process.py): a process of its own that
predicts the settings in force and each change worth weighing, each once, as ``torchlab-tui plan`` would; its
answers come back as protocol events; a workload it cannot load is said for every setting asked."""

from __future__ import annotations

import dataclasses
import os
import threading
import time

import pytest
import torch

from metrics_rows import metrics_row
from processes import alive
from trainers import TINY, WORKLOADS
from torchlab.core.engine.forecast.forecaster import Forecaster, worth_asking
from torchlab.core.engine.forecast.forecasting import Forecasting
from torchlab.core.engine.forecast.step_shape import StepShape
from torchlab.core.options import MEMORY_SHAPING, LiveOptions
from torchlab.core.records.config import build_config
from torchlab.core.wire.events import TENSORS, LongestBatch, MemoryPredicted, PredictionChecked, RunStarted
from torchlab.core.wire.payloads import MemoryBreakdown
from torchlab.core.wire.protocol import OptionApplied

BATCH = 32
#: The tests run beside others that keep both cores busy, where the idle class (the default) would wait for them.
LOW = "low"


class Answers:
    """What the forecaster emits, and a wait for the next few (no sleeps: a condition, with a generous timeout)."""

    def __init__(self) -> None:
        self.events: list = []
        self._changed = threading.Condition()

    def __call__(self, event) -> None:
        with self._changed:
            self.events.append(event)
            self._changed.notify_all()

    def wait_for(self, count: int, timeout: float = 120.0) -> list:
        with self._changed:
            assert self._changed.wait_for(lambda: len(self.events) >= count, timeout), (
                f"{len(self.events)} of {count} answers came: {self.events}")
            return list(self.events)


def run_started(options: LiveOptions) -> RunStarted:
    return RunStarted(step=3, device="cpu", batch_size=BATCH, steps=100, options=options.as_dict(), modules=[],
                      module_params=[], checkpoint_blocks=[], world_size=options.world_size, ranks=None)


def test_the_options_that_shape_memory_are_the_settings_a_prediction_is_made_for():
    """One definition: the live options marked ``shapes_memory`` are a ``StepShape``'s settings, less the batch and
    FSDP2's resharding, which are the run's, not live."""
    settings = {field.name for field in dataclasses.fields(StepShape)} - {"batch_size", "reshard_after_forward"}
    assert set(MEMORY_SHAPING) == settings


def test_the_forecaster_predicts_in_its_own_process_what_plan_predicts_each_setting_once(tmp_path):
    config = build_config({}, {"workload": TINY, "forecast_priority": LOW})
    answers = Answers()
    forecaster = Forecaster(config, set(), tmp_path, answers, gpus=lambda: None)
    forecaster.start()  # before the run started: nothing is asked until the settings in force are known
    forecaster.observe(run_started(LiveOptions()))
    asked = worth_asking(LiveOptions(), BATCH, config.reshard_after_forward, None)
    first = answers.wait_for(len(asked))
    pid = forecaster._process.pid
    assert [event.change for event in first] == [change for change, _ in asked]
    assert all(isinstance(event, MemoryPredicted) and event.step == 3 for event in first)
    in_force = first[0]
    assert in_force.settings == dataclasses.asdict(asked[0][1]) and in_force.verdict == "yes"
    here = Forecasting.load(config, set()).predict(asked[0][1])[0]
    assert in_force.prediction.peak_bytes == here.peak_bytes and in_force.prediction.at_peak == here.at_peak
    assert next(event for event in first if event.change == "amp=fp16").prediction.refused  # fp16 on a CPU

    forecaster.observe(OptionApplied(option="amp", value="bf16", previous="off", step=9))
    forecaster.observe(OptionApplied(option="lr_scale", value=0.5, previous=1.0, step=10))  # shapes no memory: nothing asked
    new = [shape for _, shape in worth_asking(LiveOptions(amp="bf16"), BATCH, True, None)
           if shape not in {shape for _, shape in asked}]
    after = answers.wait_for(len(asked) + len(new))[len(asked):]
    assert [StepShape(**event.settings) for event in after] == new
    assert after[0].step == 9

    # Checked once the run trained with it: on a CPU, the tensors' total against the kinds predicted; 6 % more
    # measured than predicted corrects every prediction from now on, and those made before are asked again
    bf16 = next(event for event in first if event.change == "amp=bf16").prediction  # in force now
    held = round(bf16.total_bytes * 1.06)
    memory = MemoryBreakdown(step=0, parameters_bytes=held, gradients_bytes=0, optimizer_bytes=0, activations_bytes=0,
                             allocator_peak_bytes=None, by_module=[])
    options = LiveOptions(amp="bf16", lr_scale=0.5)
    forecaster.observe_row(metrics_row(10, options=options))
    forecaster.observe_row(metrics_row(11, options=options, memory=memory))  # the change's first steps: not yet
    assert not [event for event in answers.events if isinstance(event, PredictionChecked)]
    forecaster.observe_row(metrics_row(12, options=options, memory=memory))
    forecaster.observe_row(metrics_row(13, options=options, memory=memory))  # checked once a setting
    [check] = [event for event in answers.events if isinstance(event, PredictionChecked)]
    assert (check.step, check.measure, check.predicted_bytes, check.measured_bytes) == (12, TENSORS, bf16.total_bytes, held)
    assert check.error == held / bf16.total_bytes - 1 and check.ratio == held / bf16.total_bytes
    asked_again = worth_asking(options, BATCH, True, None)
    corrected = answers.wait_for(len(asked) + len(new) + 1 + len(asked_again))[-len(asked_again):]
    assert corrected[0].settings == check.settings and corrected[0].ratio == check.ratio
    assert corrected[0].corrected_peak_bytes == round(bf16.peak_bytes * check.ratio)
    forecaster.close()
    assert not alive(pid)


def test_with_batches_of_varying_length_every_setting_is_predicted_with_the_longest_batch_the_run_has_taken(tmp_path):
    """The dataset's first samples are its shortest (4 tokens), the run's batches up to 64: the questions asked before
    the run's longest batch was known are dropped as they come back, each setting is asked again with it, and a
    memory step checks a prediction only where it was measured on a batch as long."""
    config = build_config({}, {"workload": f"{WORKLOADS / 'tiny.py'}:varying_lengths", "forecast_priority": LOW})
    answers = Answers()
    forecaster = Forecaster(config, set(), tmp_path, answers, gpus=lambda: None)
    forecaster.observe(dataclasses.replace(run_started(LiveOptions()), batch_size=8))
    forecaster.start()  # asked with the dataset's first samples: the forecaster is still loading torch
    forecaster.observe(LongestBatch(step=1, shapes=[[8, 61], [8]], elements=496))
    asked = worth_asking(LiveOptions(), 8, True, None)
    first = answers.wait_for(len(asked))
    assert [event.change for event in first] == [change for change, _ in asked]  # each once: none of the dropped
    assert {event.longest_batch_elements for event in first} == {496}
    forecaster.observe(LongestBatch(step=3, shapes=[[8, 64], [8]], elements=520, previous_elements=496))
    forecaster.observe(LongestBatch(step=3, shapes=[[8, 60], [8]], elements=488))  # no longer (a replayed record)
    longer = answers.wait_for(2 * len(asked))[len(asked):]
    assert {event.longest_batch_elements for event in longer} == {520}
    in_force = longer[0].prediction
    assert in_force.activations_bytes > first[0].prediction.activations_bytes
    here = Forecasting.load(config, set()).predict(asked[0][1], [[8, 64], [8]])[0]
    assert in_force == dataclasses.replace(here, seconds=in_force.seconds)

    shorter = MemoryBreakdown(step=0, parameters_bytes=in_force.total_bytes // 2, gradients_bytes=0, optimizer_bytes=0,
                              activations_bytes=0, allocator_peak_bytes=None, by_module=[], longest_batch=False)
    for step in (4, 5, 6):  # measured on shorter batches: no check, which would read them as the forecast's error
        forecaster.observe_row(metrics_row(step, memory=dataclasses.replace(shorter, step=step)))
    assert not [event for event in answers.events if isinstance(event, PredictionChecked)]
    forecaster.observe_row(metrics_row(7, memory=dataclasses.replace(shorter, step=7, longest_batch=True)))
    [check] = [event for event in answers.events if isinstance(event, PredictionChecked)]
    assert check.step == 7 and check.predicted_bytes == in_force.total_bytes
    forecaster.close()


def test_a_workload_the_forecaster_cannot_load_is_said_for_each_setting_and_the_run_goes_on(tmp_path):
    config = build_config({}, {"workload": f"{WORKLOADS / 'tiny.py'}:factory_raises", "forecast_priority": LOW})
    answers = Answers()
    forecaster = Forecaster(config, set(), tmp_path, answers, gpus=lambda: None)
    forecaster.observe(run_started(LiveOptions()))
    forecaster.start()
    asked = worth_asking(LiveOptions(), BATCH, True, None)
    events = answers.wait_for(len(asked))
    assert {event.error for event in events} == {
        f"the forecaster could not load the workload: {WORKLOADS / 'tiny.py'}:129 in factory_raises(): the factory "
        f"factory_raises() raised ValueError: dataset path /data/missing not found"}
    assert all(event.prediction is None for event in events)
    forecaster.close()
    assert (tmp_path / "forecaster.log").exists()


def test_a_link_left_as_its_log_is_not_written_through_and_nothing_is_predicted(tmp_path):
    """Another user's run directory may hold ``forecaster.log`` as a link to a file of yours: the forecaster is not
    started, the log says why, and the file the link names is untouched."""
    yours = tmp_path / "yours.txt"
    yours.write_text("keep me")
    run = tmp_path / "run"
    run.mkdir()
    (run / "forecaster.log").symlink_to(yours)
    answers = Answers()
    forecaster = Forecaster(build_config({}, {"workload": TINY}), set(), run, answers, gpus=lambda: None)
    forecaster.observe(run_started(LiveOptions()))
    forecaster.start()
    [said] = answers.events
    assert said.level == "warning" and said.text.startswith("what fits: the forecaster was not started (")
    assert forecaster._process is None and yours.read_text() == "keep me"
    forecaster.close()


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's idle class")
def test_by_default_the_forecaster_runs_in_the_idle_class(tmp_path):
    """What fits costs training nothing measurable in the idle class (benchmarks/forecast_cost.py). (The OOM rescue's
    predictions, which the ranks wait for, run niced: the ranks' rescue test, beside a loaded suite, waited for an
    idle-class forecaster until it gave up.)"""
    forecaster = Forecaster(build_config({}, {"workload": TINY}), set(), tmp_path, Answers(), gpus=lambda: None)
    forecaster.start()
    try:
        policy = wait_for_policy(forecaster._process.pid, os.SCHED_IDLE)
        assert policy == os.SCHED_IDLE
    finally:
        forecaster._process.kill()  # loading the workload, which this test does not wait for
        forecaster.close()


def wait_for_policy(pid: int, wanted: int, timeout: float = 30.0) -> int:
    """The process's scheduling policy once it is ``wanted`` (set as it reads its first line), or as it is at ``timeout``."""
    deadline = time.monotonic() + timeout
    while (policy := os.sched_getscheduler(pid)) != wanted and time.monotonic() < deadline:
        time.sleep(0.05)  # polling another process's state: no event to wait on
    return policy


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.gpu
def test_on_a_gpu_the_forecaster_reads_the_memory_through_nvml_makes_no_cuda_context_and_asks_for_each_gpu(tmp_path):
    """Its capacity is the GPU's, and it holds none of it: a CUDA context would take hundreds of MiB of the GPU the
    run trains on (NVML lists the processes that hold GPU memory)."""
    from torchlab.core.engine.measure.nvml import Nvml

    config = build_config({}, {"workload": TINY, "device": "cuda", "forecast_priority": LOW})
    answers = Answers()
    gpus = torch.cuda.device_count()
    forecaster = Forecaster(config, set(), tmp_path, answers, gpus=lambda: gpus)
    forecaster.observe(run_started(LiveOptions()))
    forecaster.start()
    asked = worth_asking(LiveOptions(), BATCH, True, gpus)
    events = answers.wait_for(len(asked))
    nvml = Nvml()
    [gpu, *_] = nvml.sample([forecaster._process.pid])
    nvml.close()
    forecaster.close()
    assert not gpu.this_run_memory_bytes, f"the forecaster holds {gpu.this_run_memory_bytes} bytes of the GPU"
    assert events[0].capacity_bytes == torch.cuda.get_device_properties(0).total_memory
    assert "by NVML" in events[0].capacity
