"""The impact table: each option change starts a segment, compared with the one before."""

from __future__ import annotations

import json

import pytest

from trainers import TINY
from torchlab.core.launch.arguments import EXIT_OK
from torchlab.core.launch.cli import main
from torchlab.core.wire.events import ProfileStarted, RunStarted
from torchlab.core.wire.impact import ImpactTracker
from torchlab.core.wire.payloads import AllocatorSample, HostSample, TelemetrySample
from torchlab.core.wire.protocol import ProfileReady


def record(step, step_time, loss, **options):
    base = {"amp": "off", "checkpointing": False, "clip": None, "accum": 1, "lr_scale": 1.0, "world_size": 1}
    return {"step": step, "step_time_s": step_time, "samples_per_s": 32 / step_time, "loss": loss, **base, **options}


def sample(peak_allocated_bytes, trainer_rss_bytes):
    """A telemetry sample with the two figures the impact table reads."""
    return TelemetrySample(
        time=1.0, step=1, gpus=[], gpu_status="no GPU", torch=AllocatorSample("cpu", None, None, peak_allocated_bytes),
        host=HostSample(cpu_percent=10.0, cpu_count=2, trainer_cpu_percent=90.0, ram_used_bytes=1, ram_total_bytes=2,
                        trainer_rss_bytes=trainer_rss_bytes, trainer_processes=1),
    )


def test_a_change_starts_a_segment_with_its_speed_memory_and_slope():
    tracker = ImpactTracker()
    for step in range(1, 11):
        tracker.on_metrics(record(step, 0.10, 3.0 - 0.01 * step))
        tracker.on_telemetry(sample(1000, 5000))
    for step in range(11, 21):
        tracker.on_metrics(record(step, 0.05, 2.9 - 0.02 * step, amp="bf16"))
        tracker.on_telemetry(sample(600, 5000))
    first, second = tracker.table()
    assert (first.change, first.first_step, first.last_step) == ("start", 1, 10)
    assert (second.change, second.first_step, second.last_step) == ("amp=bf16", 11, 20)
    assert second.speedup == pytest.approx(2.0) and second.memory_change == pytest.approx(-0.4)
    assert second.loss_slope_per_100_steps == pytest.approx(-2.0)
    assert second.verdict == "amp=bf16: 2.00x faster, -40 % memory"


def test_without_cuda_the_memory_figure_is_the_trainer_rss():
    tracker = ImpactTracker()
    tracker.on_metrics(record(1, 0.1, 1.0))
    tracker.on_telemetry(sample(None, 2000))
    tracker.on_metrics(record(2, 0.1, 1.0, checkpointing=True))
    tracker.on_telemetry(sample(None, 1500))
    assert tracker.table()[1].verdict == "checkpointing=on: 1.00x faster, -25 % memory"


def test_segments_appear_in_the_run_directory_after_an_at_change(tmp_path):
    assert main([TINY, "--headless", "--steps", "12", "--run-dir", str(tmp_path / "run"),
                 "--at", "5:clip=0.5", "--at", "9:accum=2", "--telemetry-interval", "0"]) == EXIT_OK
    table = json.loads((tmp_path / "run" / "impact.json").read_text())
    assert list(table[0]) == [  # the format scripts read (README, "What a run leaves")
        "change", "options", "first_step", "last_step", "median_step_time_s", "median_samples_per_s", "peak_allocated_bytes",
        "peak_rss_bytes", "loss_slope_per_100_steps", "speedup", "memory_change", "verdict"]
    assert [(row["change"], row["first_step"], row["last_step"]) for row in table] == [
        ("start", 1, 4), ("clip=0.5", 5, 8), ("accum=2", 9, 12)]
    assert table[2]["speedup"] is not None and table[2]["median_samples_per_s"] > 0


def test_profiled_steps_stay_out_of_the_medians():
    tracker = ImpactTracker()
    for step in range(1, 5):
        tracker.on_metrics(record(step, 0.10, 1.0))
    tracker.on_event(ProfileStarted(step=5, steps=7))
    for step in range(5, 13):  # under the profiler, then beside the table build: 10x slower, most of the segment
        tracker.on_metrics(record(step, 1.0, 1.0))
    tracker.on_event(ProfileReady(first_step=6, last_step=12, dir="profiles/0000005"))
    for step in range(13, 15):
        tracker.on_metrics(record(step, 0.10, 1.0))
    [segment] = tracker.table()
    assert segment.median_step_time_s == pytest.approx(0.10) and segment.last_step == 14


def test_a_fresh_processes_first_steps_stay_out_of_the_medians():
    """After a relaunch the new ranks' first steps are slow: the segment must not look slow for it."""
    tracker = ImpactTracker()
    for step in range(1, 21):
        tracker.on_metrics(record(step, 0.10, 1.0))
    tracker.on_event(RunStarted(step=20, device="cpu", batch_size=32, steps=100, options={}, modules=[], module_params=[],
                                checkpoint_blocks=[], world_size=2, ranks=None))  # relaunched with two ranks
    for step in range(21, 30):
        tracker.on_metrics(record(step, 2.0 if step < 26 else 0.05, 1.0, world_size=2))
    first, second = tracker.table()
    assert second.median_step_time_s == pytest.approx(0.05)
    assert second.verdict.startswith("world_size=2: 2.00x faster")
