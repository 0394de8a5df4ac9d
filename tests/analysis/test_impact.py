"""The impact table: each option change starts a segment, compared with the one before."""

from __future__ import annotations

import json
import math
import random
import re
from collections import deque

import pytest

from metrics_rows import metrics_row
from trainers import TINY
from torchlab.core.analysis.impact import WARMUP_STEPS, ImpactTracker, Segment
from torchlab.core.analysis.step_times import IN_TURN, median_interval, noise_words
from torchlab.core.errors import EXIT_OK
from torchlab.core.launch.cli import main
from torchlab.core.wire.events import ProfileStarted, RunStarted
from torchlab.core.wire.payloads import AllocatorSample, GpuSample, HostSample, MemoryBreakdown, TelemetrySample
from torchlab.core.wire.protocol import ProfileReady


def record(step, step_time, loss, **given):
    """A row of ``step_time`` and ``loss``; ``given``: options (``amp="bf16"``) or its other fields (no data wait unless given)."""
    return metrics_row(step, step_time_s=step_time, samples_per_s=32 / step_time, loss=loss, **{"data_wait_s": None, **given})


def sample(peak_allocated_bytes, trainer_rss_bytes, gpus=()):
    """A telemetry sample with the figures the impact table reads (and the RSS, which it must not)."""
    return TelemetrySample(
        time=1.0, step=1, gpus=list(gpus), gpu_status="no GPU", torch=AllocatorSample("cpu", None, None, peak_allocated_bytes),
        host=HostSample(cpu_percent=10.0, cpu_count=2, trainer_cpu_percent=90.0, ram_used_bytes=1, ram_total_bytes=2,
                        trainer_rss_bytes=trainer_rss_bytes, trainer_processes=1),
    )


def test_a_change_starts_a_segment_with_its_speed_memory_and_slope():
    tracker = ImpactTracker()
    for step in range(1, 21):
        tracker.on_metrics(record(step, 0.10, 3.0 - 0.01 * step))
        tracker.on_telemetry(sample(1000, 5000))
    for step in range(21, 41):
        tracker.on_metrics(record(step, 0.05, 2.9 - 0.02 * step, amp="bf16"))
        tracker.on_telemetry(sample(600, 5000))
    first, second = tracker.table()
    assert (first.change, first.first_step, first.last_step) == ("start", 1, 20)
    assert (second.change, second.first_step, second.last_step) == ("amp=bf16", 21, 40)
    assert second.speedup == pytest.approx(2.0) and second.memory_change == pytest.approx(-0.4)
    assert second.loss_slope_per_100_steps == pytest.approx(-2.0)
    assert second.verdict == "amp=bf16: 2.00x faster, memory -40 %"  # the allocator's peak (a CUDA run)


def test_with_ranks_memory_is_said_per_rank():
    """Rank 0's figures: two ranks each hold less than one process did, while the run as a whole holds more."""
    tracker = ImpactTracker()
    for step in range(1, 21):
        tracker.on_metrics(record(step, 0.10, 3.0))
        tracker.on_telemetry(sample(1000, 5000))
    for step in range(21, 41):
        tracker.on_metrics(record(step, 0.06, 2.9, world_size=2))
        tracker.on_telemetry(sample(700, 5000))
    _, second = tracker.table()
    assert second.verdict == "world_size=2: 1.67x faster, memory per rank -30 %"


def loaded(machine_percent, trainer_percent):
    """A CPU box's telemetry: the machine's CPU use (of 100) and the run's own (of one CPU, two CPUs here)."""
    return TelemetrySample(
        time=1.0, step=1, gpus=[], gpu_status="no GPU", torch=AllocatorSample("cpu", None, None, None),
        host=HostSample(cpu_percent=machine_percent, cpu_count=2, trainer_cpu_percent=trainer_percent, ram_used_bytes=1,
                        ram_total_bytes=2, trainer_rss_bytes=1, trainer_processes=1),
    )


@pytest.mark.parametrize("neighbour", ["stopped", "steady"])
def test_a_speed_difference_while_other_processes_load_changed_is_not_a_verdict(neighbour):
    """Seen in tmux: "checkpointing=on: 3.42x faster" on a 2-core box while a test suite beside the run stopped.
    Both segments' intervals were tight; what changed was the machine. Where it held steady, the verdict stands."""
    tracker = ImpactTracker()
    for step in range(1, 41):  # a neighbour takes a whole core (50 of the machine's 100) beside the run's one
        tracker.on_metrics(record(step, 0.30, 2.0))
        tracker.on_telemetry(loaded(100.0, 100.0))
    for step in range(41, 81):
        tracker.on_metrics(record(step, 0.10, 2.0, checkpointing=True))
        tracker.on_telemetry(loaded(50.0, 100.0) if neighbour == "stopped" else loaded(100.0, 100.0))
    first, second = tracker.table()
    assert first.others_cpu_percent == pytest.approx(50.0)
    if neighbour == "stopped":
        assert second.others_cpu_percent == pytest.approx(0.0) and second.speedup is None
        assert second.verdict == "checkpointing=on: speed not judged: other processes' CPU use went 50 % → 0 %"
    else:
        assert second.speedup == pytest.approx(3.0) and second.verdict == "checkpointing=on: 3.00x faster"


def test_the_trainers_cpu_counts_its_data_loader_workers_so_they_are_not_other_processes():
    from torchlab.core.wire.payloads import HostSample as Host

    host = Host(cpu_percent=100.0, cpu_count=2, trainer_cpu_percent=200.0, ram_used_bytes=1, ram_total_bytes=2,
                trainer_rss_bytes=1, trainer_processes=3)
    assert host.others_cpu_percent == 0.0  # the main process and two workers take both CPUs


def test_a_change_of_the_runs_length_begins_no_segment():
    """Seen as a user: ``e`` (steps) gave "steps=150: no clear difference (±768 %)", a verdict on a change that
    does nothing to a step; the segment goes on, and the next real change is compared with all of it."""
    tracker = ImpactTracker()
    for step in range(1, 61):
        options = {"steps": 200 if step <= 20 else 150}
        if step > 40:
            options["clip"] = 1.0
        tracker.on_metrics(record(step, 0.1, 1.0, **options))
    first, second = tracker.table()
    assert (first.change, first.first_step, first.last_step) == ("start", 1, 40) and "steps" not in first.options
    assert second.change == "clip=1.0"


def memory(step, activations, others=1000, allocator_peak=None):
    """A memory step's breakdown: ``others`` bytes each of parameters, gradients and optimizer state."""
    return MemoryBreakdown(step=step, parameters_bytes=others, gradients_bytes=others, optimizer_bytes=others,
                           activations_bytes=activations, allocator_peak_bytes=allocator_peak, by_module=[])


def test_without_cuda_memory_is_the_tensors_and_never_the_rss_which_a_profile_inflates():
    tracker = ImpactTracker()
    for step in range(1, 11):
        tracker.on_metrics(record(step, 0.1, 1.0, memory=memory(step, 4000) if step % 5 == 0 else None))
        tracker.on_telemetry(sample(None, 400 << 20))
    tracker.on_event(ProfileStarted(step=11, steps=2))  # a profiler snapshot in the middle of the next segment
    for step in range(11, 21):
        if step == 14:
            tracker.on_event(ProfileReady(first_step=12, last_step=13, dir="profiles/0000011"))
        tracker.on_metrics(record(step, 0.1, 1.0, checkpointing=True, memory=memory(step, 1000) if step % 5 == 0 else None))
        tracker.on_telemetry(sample(None, 1500 << 20))  # the RSS after a profile: up by 1.1 GiB, for good
    first, second = tracker.table()
    assert (first.activations_bytes, first.tensor_bytes) == (4000, 7000)
    assert (second.activations_bytes, second.tensor_bytes) == (1000, 4000)
    assert second.verdict == "checkpointing=on: too few steps to judge, activations -75 %, memory -43 %"


def test_an_option_that_moves_no_tensor_says_same_memory():
    tracker = ImpactTracker()
    for step in range(1, 41):
        options = {"lr_scale": 0.5} if step > 20 else {}
        tracker.on_metrics(record(step, 0.1, 1.0, **options, memory=memory(step, 4000)))
    assert tracker.table()[1].verdict.endswith(", same memory") and tracker.table()[1].memory_change == 0.0


def test_segments_appear_in_the_run_directory_after_an_at_change(tmp_path):
    assert main([TINY, "--headless", "--steps", "12", "--run-dir", str(tmp_path / "run"),
                 "--at", "5:clip=0.5", "--at", "9:accum=2", "--telemetry-interval", "0"]) == EXIT_OK
    table = json.loads((tmp_path / "run" / "impact.json").read_text())
    assert list(table[0]) == [  # the format scripts read (docs/run-files.md, "What a run leaves")
        "change", "options", "first_step", "last_step", "median_step_time_s", "step_time_low_s", "step_time_high_s",
        "median_samples_per_s", "median_data_wait_s", "peak_allocated_bytes", "nvml_run_bytes", "others_cpu_percent", "activations_bytes", "tensor_bytes",
        "loss_slope_per_100_steps",
        "speedup", "memory_change", "activations_change", "verdict", "baseline_step", "predicted_bytes", "prediction_error"]
    assert [(row["change"], row["first_step"], row["last_step"]) for row in table] == [
        ("start", 1, 4), ("clip=0.5", 5, 8), ("accum=2", 9, 12)]
    assert table[2]["median_samples_per_s"] > 0
    # Four steps a segment are too few for an interval, so nothing is said about speed.
    assert table[2]["step_time_low_s"] is None and table[2]["speedup"] is None
    assert table[2]["verdict"].startswith("accum=2: too few steps to judge")


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
    for step in range(21, 41):
        tracker.on_metrics(record(step, 2.0 if step < 26 else 0.05, 1.0, world_size=2))
    first, second = tracker.table()
    assert second.median_step_time_s == pytest.approx(0.05)
    assert second.verdict.startswith("world_size=2: 2.00x faster")


# ---------------------------------------------------------------------- verdicts with their noise


def drifting_step_times(rng, steps, *, first=0, period=150, drift=0.15, jitter=0.05, base_s=0.010):
    """Step times of a busy machine: the speed drifts slowly (±``drift``, one cycle every ``period`` steps)
    and each step jitters around it; neighbouring steps are alike, so they are not independent draws."""
    return [base_s * (1 + drift * math.sin(2 * math.pi * (first + i) / period)) * math.exp(rng.gauss(0, jitter))
            for i in range(steps)]


def two_segments(before, after, **change):
    """The tracker after ``before``'s steps, then ``after``'s under the changed option."""
    tracker = ImpactTracker()
    for step, step_time in enumerate(before + after, start=1):
        tracker.on_metrics(record(step, step_time, 1.0, **(change if step > len(before) else {})))
    return tracker.table()


@pytest.mark.parametrize("seed", range(10))
def test_a_segment_from_the_same_drifting_machine_is_no_clear_difference(seed):
    """An option that does nothing, on a machine whose speed drifts: the medians differ, the verdict must not."""
    step_times = drifting_step_times(random.Random(seed), 400)
    first, second = two_segments(step_times[:200], step_times[200:], clip=1.0)
    assert second.speedup is None
    assert re.fullmatch(r"clip=1\.0: no clear difference \(±\d+ %, segments ran in turn, so load changes sway it, try a trial\)",
                        second.verdict)
    if seed == 4:  # the drift leaves the medians 6 % apart: by medians alone, "1.07x faster"
        assert first.median_step_time_s / second.median_step_time_s > 1.05


def test_a_real_change_of_one_and_a_half_times_is_slower():
    rng = random.Random(1)
    before = drifting_step_times(rng, 200, period=100)
    after = [1.5 * step_time for step_time in drifting_step_times(rng, 200, first=200, period=100)]
    first, second = two_segments(before, after, checkpointing=True)
    assert second.speedup == pytest.approx(1 / 1.5, rel=0.03)
    slower = re.fullmatch(r"checkpointing=on: (\d\.\d\d)x slower", second.verdict)
    assert slower and float(slower.group(1)) == pytest.approx(1.5, rel=0.03)
    assert second.step_time_low_s > first.step_time_high_s


def test_a_burst_of_slow_steps_in_the_middle_widens_the_interval():
    """A neighbour process slows 40 % of the segment by half: the median hardly moves, the interval must."""
    steady = drifting_step_times(random.Random(2), 300, drift=0)
    burst = [1.5 * step_time if 100 <= index < 220 else step_time for index, step_time in enumerate(steady)]
    before, quiet = two_segments(steady, steady, clip=1.0)
    _, noisy = two_segments(steady, burst, clip=1.0)

    def relative_width(segment):
        return (segment.step_time_high_s - segment.step_time_low_s) / segment.median_step_time_s

    assert relative_width(quiet) < 0.05
    assert relative_width(noisy) > 0.3
    assert noisy.median_step_time_s < 1.1 * quiet.median_step_time_s
    assert noisy.step_time_low_s <= noisy.median_step_time_s <= noisy.step_time_high_s
    assert noisy.speedup is None and "no clear difference" in noisy.verdict


def test_too_few_timed_steps_give_no_interval_and_no_speed_verdict():
    """Ten timed steps are the least: eleven steps after a change, the first two left out as warm-up, are too few."""
    tracker = ImpactTracker()
    for step in range(1, 31):
        tracker.on_metrics(record(step, 0.10, 1.0))
    for step in range(31, 42):
        tracker.on_metrics(record(step, 0.05, 1.0, clip=1.0))
    _, short = tracker.table()
    assert (short.step_time_low_s, short.step_time_high_s, short.speedup) == (None, None, None)
    assert short.median_step_time_s == pytest.approx(0.05)
    assert short.verdict == "clip=1.0: too few steps to judge"
    tracker.on_metrics(record(42, 0.05, 1.0, clip=1.0))
    assert tracker.table()[1].verdict == "clip=1.0: 2.00x faster"


def test_every_warm_up_step_after_a_change_stays_out_of_the_medians():
    """The first ``WARMUP_STEPS`` steps of a segment pay one-off costs: none of them is timed, the first included.
    A segment made only of them has no step time at all rather than a warm-up step's."""
    tracker = ImpactTracker()
    for step in range(1, 21):
        tracker.on_metrics(record(step, 0.10, 1.0))
    for step in range(21, 21 + WARMUP_STEPS):  # the allocator's first blocks, a first autotune: 5x slower
        tracker.on_metrics(record(step, 0.50, 1.0, amp="bf16"))
    assert tracker.table()[1].median_step_time_s is None and tracker.table()[1].median_samples_per_s is None
    for step in range(21 + WARMUP_STEPS, 31):
        tracker.on_metrics(record(step, 0.05, 1.0, amp="bf16"))
    assert tracker.segments[1].step_times == deque([0.05] * (10 - WARMUP_STEPS))
    assert tracker.table()[1].median_step_time_s == pytest.approx(0.05)


def test_the_interval_runs_between_inner_block_medians():
    """100 steps make 20 blocks of 5; the 90 % interval of their median runs from the 6th to the 15th."""
    step_times = [float(1 + index // 5) for index in range(100)]  # block b's steps all take b + 1
    random.Random(3).shuffle(blocks := [step_times[start:start + 5] for start in range(0, 100, 5)])
    assert median_interval([time for block in blocks for time in block]) == (6.0, 15.0)
    assert median_interval(step_times[:9]) is None
    assert median_interval(step_times[:10]) == (1.0, 2.0)  # 5 blocks of 2: their whole range


def test_checkpointing_on_a_residual_cnn_shows_fewer_activation_bytes_and_a_profile_between_changes_nothing(tmp_path):
    run = tmp_path / "run"
    residual_cnn = TINY.replace(":workload", ":residual_cnn")
    assert main([residual_cnn, "--headless", "--steps", "16", "--run-dir", str(run), "--at", "5:checkpointing=on",
                 "--memory-every", "2", "--profile-at", "10", "--profile-steps", "2"]) == EXIT_OK
    start, checkpointed = json.loads((run / "impact.json").read_text())
    assert checkpointed["change"] == "checkpointing=on"
    assert checkpointed["activations_bytes"] < 0.8 * start["activations_bytes"]
    assert "activations -" in checkpointed["verdict"] and checkpointed["activations_change"] < -0.2
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    before_the_profile = {row["memory"]["activations_bytes"] for row in rows if "memory" in row and 5 <= row["step"] < 10}
    assert before_the_profile == {checkpointed["activations_bytes"]}  # the segment's figure, profile or not


def test_the_verdict_says_how_the_data_wait_moved_where_it_moved_by_a_share_of_a_step():
    tracker = ImpactTracker()
    for step in range(1, 21):
        tracker.on_metrics(record(step, 0.020, 1.0, data_wait_s=0.0042))
    for step in range(21, 41):
        tracker.on_metrics(record(step, 0.016, 1.0, workers=2, data_wait_s=0.0001))
    for step in range(41, 61):
        tracker.on_metrics(record(step, 0.016, 1.0, workers=3, data_wait_s=0.0003))
    start, two, three = tracker.table()
    assert start.median_data_wait_s == 0.0042 and two.median_data_wait_s == 0.0001
    assert two.verdict == "workers=2: 1.25x faster, data wait 4.2 → 0.1 ms"
    assert three.verdict.startswith("workers=3: no clear difference")  # 0.2 ms: under 5 % of a 16 ms step


def test_a_spread_of_100_percent_or_more_reads_as_a_ratio_of_step_times():
    """"±400 %" is true but reads as nothing: from ±100 % on, the verdict says how far apart the step times may be."""
    steady = [0.10] * 20
    noisy = [0.10] * WARMUP_STEPS + [0.05] * 20 + [0.50] * 20  # 20 blocks: the 6th to the 15th span 0.05 to 0.5
    _, segment = two_segments(steady, noisy, clip=1.0)
    assert segment.speedup is None
    assert segment.verdict == "clip=1.0: no clear difference (step times varied up to 5.0x, " + IN_TURN + ")"
    assert noise_words(0.995) == "±100 %" and noise_words(1.0) == "step times varied up to 2.0x"
    assert noise_words(50.4) == "step times varied up to 51x"


def test_a_closed_segment_is_summarised_once_and_its_row_stays_what_a_fresh_summary_gives(monkeypatch):
    """The app asks for the table every second on the training thread: only the newest segment is summarised again."""
    tracker = ImpactTracker()
    summarised = []
    summary = Segment.summary
    monkeypatch.setattr(Segment, "summary", lambda self, *args, **named: summarised.append(self.change) or summary(self, *args, **named))
    for step in range(1, 61):
        options = {"clip": 1.0} if 20 < step <= 40 else {"clip": 1.0, "accum": 2} if step > 40 else {}
        tracker.on_metrics(record(step, 0.10 if step <= 20 else 0.05, 3.0 - 0.01 * step, **options))
        tracker.table()
    # Each segment: once per table() while it is the newest (20 reports), once more when the next one began.
    assert [summarised.count(change) for change in ("start", "clip=1.0", "accum=2")] == [21, 21, 20]
    fresh = []
    for segment in tracker.segments:
        fresh.append(summary(segment, fresh[-1] if fresh else None))
    assert tracker.table() == fresh and fresh[1].verdict == "clip=1.0: 2.00x faster"


def nvml_gpu(index, this_run_memory_bytes):
    """A GPU as core/engine/measure/nvml.py reports it; ``this_run_memory_bytes`` None where NVML lists no processes."""
    return GpuSample(index=index, name="GPU", memory_used_bytes=50 << 30, memory_total_bytes=80 << 30, utilization_percent=90.0,
                     temperature_c=60.0, power_w=300.0, power_limit_w=700.0, sm_clock_mhz=1980.0,
                     this_run_memory_bytes=this_run_memory_bytes)


def test_on_cuda_a_segment_carries_what_nvml_sees_of_the_run_and_without_nvml_nothing_rather_than_zero():
    tracker = ImpactTracker()
    for step in range(1, 11):
        tracker.on_metrics(record(step, 0.1, 1.0))
        # two GPUs of a two-rank run, NVML's figure moving as the allocator's cache grows
        tracker.on_telemetry(sample(3 << 30, 1 << 30, gpus=[nvml_gpu(0, (4 << 30) + step), nvml_gpu(1, 4 << 30)]))
    tracker.on_metrics(record(11, 0.1, 1.0, amp="bf16"))
    tracker.on_telemetry(sample(2 << 30, 1 << 30, gpus=[nvml_gpu(0, None), nvml_gpu(1, None)]))  # a container hides them
    first, second = tracker.table()
    assert first.nvml_run_bytes == (8 << 30) + 10 and second.nvml_run_bytes is None
    assert second.peak_allocated_bytes == 2 << 30 and second.memory_change == pytest.approx(-1 / 3)  # judged by the allocator
    cpu = ImpactTracker()
    cpu.on_metrics(record(1, 0.1, 1.0))
    cpu.on_telemetry(sample(None, 1 << 30))  # no NVIDIA driver: no GPU at all
    assert cpu.table()[0].nvml_run_bytes is None


# ---------------------------------------------------------------------- the segment a verdict compares with


def test_a_segment_too_short_to_judge_is_skipped_over_and_the_next_verdict_says_what_it_compares_with():
    """Issue 29: a one-step ``accum=2`` segment left the next change "too few steps to judge". The next segment is
    compared with the nearest one before it that has enough timed steps, and says which."""
    tracker = ImpactTracker()
    for step in range(1, 21):
        tracker.on_metrics(record(step, 0.10, 1.0, memory=memory(step, 4000) if step == 20 else None))
    tracker.on_metrics(record(21, 0.20, 1.0, accum=2))  # one step: no interval
    for step in range(22, 42):
        tracker.on_metrics(record(step, 0.05, 1.0, accum=2, clip=1.0, memory=memory(step, 2000) if step == 41 else None))
    for step in range(42, 62):
        tracker.on_metrics(record(step, 0.05, 1.0, accum=2, clip=1.0, lr_scale=0.5))
    start, accum, clip, lr = tracker.table()
    assert accum.verdict == "accum=2: too few steps to judge" and accum.baseline_step == 1
    assert clip.speedup == pytest.approx(4.0) and clip.baseline_step == 1  # half the time for twice the samples
    assert clip.verdict == ("clip=1.0: 4.00x faster per sample, activations -50 %, memory -29 % "
                           "(vs the start, changed since: clip=1.0, accum=2)")
    assert lr.baseline_step == 22 and lr.verdict.startswith("lr_scale=0.5: no clear difference")  # the one before: not named
    assert "(vs " not in lr.verdict and start.baseline_step is None and start.verdict == "start"


def test_a_change_of_accumulation_is_judged_by_the_time_of_a_sample_not_of_a_step():
    """Seen as a user at 160x48: 'accum=2: 1.69x slower' while samples/s went 8,337 -> 9,894: a step of accum=2
    trains twice the samples. Its time per sample is what says whether the change made training faster."""
    tracker = ImpactTracker()
    for step in range(1, 21):
        tracker.on_metrics(record(step, 0.030 * (1 + 0.01 * (step % 3)), 1.0))
    for step in range(21, 41):
        tracker.on_metrics(record(step, 0.051 * (1 + 0.01 * (step % 3)), 1.0, accum=2))
    for step in range(41, 61):
        tracker.on_metrics(record(step, 0.031 * (1 + 0.01 * (step % 3)), 1.0, accum=1))
    _, accum, back = tracker.table()
    assert accum.speedup == pytest.approx(2 * 0.030 / 0.051, rel=0.02)
    assert accum.verdict.startswith("accum=2: 1.18x faster per sample")
    assert back.verdict.startswith("accum=1: 1.22x slower per sample")


def test_a_long_segment_after_short_ones_is_judged_by_the_last_long_enough_or_says_none_before_it_is():
    """Issue 45: at 160x48 a 127-step segment read "too few steps to judge" because the segment before had 2 steps.
    It is judged by the last segment before it with enough timed steps, named; where every one before it is too
    short, it says that, not that it is."""
    tracker = ImpactTracker()
    for step in range(1, 5):  # a start of 4 steps: too short
        tracker.on_metrics(record(step, 0.10, 1.0))
    for step in range(5, 7):
        tracker.on_metrics(record(step, 0.10, 1.0, accum=2))  # 2 steps
    for step in range(7, 134):
        tracker.on_metrics(record(step, 0.05, 1.0, accum=2, clip=1.0))  # 127 steps
    for step in range(134, 136):
        tracker.on_metrics(record(step, 0.05, 1.0, accum=2, clip=1.0, lr_scale=0.5))  # 2 steps
    for step in range(136, 263):
        tracker.on_metrics(record(step, 0.10, 1.0, accum=2, clip=1.0, lr_scale=0.5, amp="bf16"))  # 127 steps
    _, accum, clip, lr, amp = tracker.table()
    assert accum.verdict == "accum=2: too few steps to judge"  # short itself
    assert clip.verdict == "clip=1.0: not judged: no segment before it has 10 timed steps" and clip.speedup is None
    assert lr.verdict == "lr_scale=0.5: too few steps to judge"
    assert amp.baseline_step == 7 and amp.speedup == pytest.approx(0.5)
    assert amp.verdict == "amp=bf16: 2.00x slower (vs clip=1.0 at step 7, changed since: amp=bf16, lr_scale=0.5)"


def test_a_row_compared_with_any_other_is_judged_from_the_two_rows_figures_as_the_trainer_judges_it():
    """The app's chosen baseline: ``compare_segments`` on two rows gives what the tracker gave from the steps."""
    from dataclasses import replace

    from torchlab.core.analysis.impact import compare_segments

    tracker = ImpactTracker()
    for step in range(1, 61):
        options = {"clip": 1.0} if 20 < step <= 40 else {"clip": 1.0, "amp": "bf16"} if step > 40 else {}
        tracker.on_metrics(record(step, 0.10 if step <= 20 else 0.05 if step <= 40 else 0.025, 1.0, **options))
    start, clip, bf16 = tracker.table()
    assert compare_segments(clip, start) == clip  # the trainer's own row, again
    against_start = compare_segments(bf16, start, name_baseline=True)
    assert against_start.speedup == pytest.approx(4.0) and against_start.baseline_step == 1
    assert against_start.verdict == "amp=bf16: 4.00x faster (vs the start, changed since: amp=bf16, clip=1.0)"
    assert compare_segments(start, bf16).verdict == "start: 4.00x slower"  # an earlier row against a later baseline
    assert compare_segments(replace(bf16, verdict="anything"), None).verdict == "amp=bf16"


def test_an_impact_json_row_from_before_baseline_step_is_read():
    """impact.json gained ``baseline_step`` (protocol 10): a row written before it still reads, as compared with none."""
    from dataclasses import asdict

    from torchlab.core.wire.payloads import ImpactSegment
    from torchlab.core.wire.typed_json import read_object

    tracker = ImpactTracker()
    for step in range(1, 21):
        tracker.on_metrics(record(step, 0.10, 1.0))
    old = {key: value for key, value in asdict(tracker.table()[0]).items() if key != "baseline_step"}
    assert read_object(ImpactSegment, old, "impact.json[0]", nested=False).baseline_step is None


def test_the_load_a_segment_is_judged_under_is_the_load_beside_its_timed_steps_not_its_seconds():
    """Seen in tmux: "clip=1.0: 5.50x slower" while a neighbour's tests loaded one core of two. The start's steps had
    run on a quiet machine (hundreds of fast steps), then the neighbour started during a trial at the start's end:
    a median over the start's telemetry samples (most of them from the trial's seconds, which add no step) said the
    load was as high as in the clip segment, so the neighbour's slowdown was judged the option's."""
    tracker = ImpactTracker()
    for step in range(1, 301):  # the quiet start: a sample every 10 fast steps
        tracker.on_metrics(record(step, 0.02, 2.0))
        if step % 10 == 0:
            tracker.on_telemetry(loaded(96.0, 190.0))
    for _ in range(40):  # a trial's seconds under the neighbour's load: telemetry, no row
        tracker.on_telemetry(loaded(100.0, 100.0))
    for step in range(301, 361):  # clip=1.0 under the neighbour's load
        tracker.on_metrics(record(step, 0.11, 2.0, clip=1.0))
        if step % 5 == 0:
            tracker.on_telemetry(loaded(100.0, 100.0))
    start, clip = tracker.table()
    assert start.others_cpu_percent == pytest.approx(1.0)
    assert clip.others_cpu_percent == pytest.approx(50.0) and clip.speedup is None
    assert clip.verdict == "clip=1.0: speed not judged: other processes' CPU use went 1 % → 50 %"


def test_a_segment_the_oom_rescue_began_says_so():
    from torchlab.core.wire.events import OomRescued

    tracker = ImpactTracker()
    for step in range(1, 20):
        tracker.on_metrics(record(step, 0.10, 2.0))
    tracker.on_event(OomRescued(step=21, option="split", value=2, previous=1, error="CUDA out of memory."))
    tracker.on_metrics(record(20, 0.10, 2.0))  # a measured step's row, held for its update figures: after the event
    for step in range(21, 41):
        tracker.on_metrics(record(step, 0.12, 2.0, split=2))
    for step in range(41, 61):  # the user's own change later is the user's
        tracker.on_metrics(record(step, 0.12, 2.0, split=4))
    assert [row.change for row in tracker.table()] == ["start", "split=2 (OOM rescue)", "split=4"]


def test_a_segment_whose_settings_were_predicted_shows_the_prediction_beside_its_memory_and_keeps_it_on_resume(tmp_path):
    """The forecaster's check of a setting (``prediction_checked``, the journal's ``prediction``) is the row's
    predicted memory; a resumed run rebuilds its table from the journals with it."""
    from torchlab.core.records.rundir import RunDirectory
    from torchlab.core.wire.events import TENSORS, PredictionChecked, ResumedFromCheckpoint

    memory = MemoryBreakdown(step=0, parameters_bytes=1000, gradients_bytes=1000, optimizer_bytes=2000,
                             activations_bytes=6000, allocator_peak_bytes=None, by_module=[])
    run = tmp_path / "run"
    run.mkdir()
    journal, tracker = RunDirectory(run), ImpactTracker()
    rows = [record(step, 0.1, 1.0, memory=memory, **({"checkpointing": True} if step > 20 else {})) for step in range(1, 41)]
    checked = PredictionChecked(step=23, settings={"checkpointing": True}, measure=TENSORS, predicted_bytes=9500,
                                measured_bytes=10_000, error=10_000 / 9500 - 1, ratio=10_000 / 9500)
    for row in rows:
        for observer in (journal, tracker):
            observer.on_metrics(row)
            if row.step == checked.step:
                observer.on_event(checked)
    journal.close()
    start, change = tracker.table()
    assert (start.predicted_bytes, start.prediction_error) == (None, None)  # not predicted: "–" in the app
    assert (change.change, change.predicted_bytes, change.prediction_error) == ("checkpointing=on", 9500, checked.error)
    resumed = ImpactTracker(run / "impact.json")
    resumed.on_event(ResumedFromCheckpoint(step=40))
    assert resumed.table()[-1].predicted_bytes == 9500 and resumed.table()[-1].prediction_error == pytest.approx(checked.error)
