"""System telemetry: host figures always, GPU figures from NVML where there is a GPU, 'no GPU' where not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
import pytest
import torch

from trainers import make_trainer
from torchlab.core.engine.measure.nvml import Nvml
from torchlab.core.engine.measure.telemetry import TelemetrySampler
from torchlab.core.engine.parallel.distributed import RANK_MODULE
from torchlab.core.wire import protocol


def test_a_sample_has_host_figures_and_says_why_there_is_no_gpu():
    sampler = TelemetrySampler(torch.device("cpu"), on_sample=lambda s: None, current_step=lambda: 7)
    sample = sampler.sample()
    sampler.stop()
    assert sample.step == 7
    host = sample.host
    assert host.ram_total_bytes > host.ram_used_bytes > 0
    assert host.trainer_rss_bytes > 50 * 2**20  # this process imported torch
    assert 0 <= host.cpu_percent <= 100 * host.cpu_count
    if not torch.cuda.is_available():
        assert sample.gpus == [] and sample.gpu_status.startswith("no GPU: ")
        assert sample.torch.allocated_bytes is None


def test_the_trainers_cpu_counts_its_children_as_its_rss_does():
    """A DataLoader worker's CPU was counted as another process's: the impact table, which now holds back a
    speed verdict where other processes' load moved, would have held back every verdict on ``workers``."""
    sampler = TelemetrySampler(torch.device("cpu"), on_sample=lambda s: None, current_step=lambda: 7)
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # a busy worker of this "trainer"
    try:
        sampler.sample()  # the child's first reading only starts its measurement
        busy = psutil.Process(child.pid)
        started = sum(busy.cpu_times()[:2])
        deadline = time.monotonic() + 60
        while sum(busy.cpu_times()[:2]) - started < 0.5:  # until it has burned half a second of CPU
            assert time.monotonic() < deadline, "the busy child got no CPU"
            time.sleep(0.05)
        host = sampler.sample().host
    finally:
        child.kill()
        child.wait()
        sampler.stop()
    assert host.trainer_processes >= 2 and host.trainer_cpu_percent > 20


def test_a_real_sample_is_what_the_protocol_reads():
    """What psutil and NVML give fits the sample's declared types: the app decodes the sampler's samples as sent."""
    sampler = TelemetrySampler(torch.device("cpu"), on_sample=lambda s: None, current_step=lambda: 7)
    sample = sampler.sample()
    sampler.stop()
    message = protocol.Telemetry(sample=sample)
    assert protocol.decode(message.encode()) == message


def test_samples_arrive_while_training_and_land_in_system_jsonl(tmp_path):
    from torchlab.core.records.rundir import RunDirectory

    directory = RunDirectory(tmp_path / "run")
    trainer, seen = make_trainer(steps=10**6, telemetry_interval=0.1)
    trainer.observers.append(directory)

    class StopAfterTwoSamples(type(seen)):
        def on_telemetry(self, sample):
            super().on_telemetry(sample)
            if len(self.telemetry) >= 2:
                trainer.request_stop("enough samples")

    watcher = StopAfterTwoSamples()
    trainer.observers.append(watcher)
    assert trainer.run().status == "stopped"
    directory.close()
    lines = [json.loads(line) for line in (tmp_path / "run" / "system.jsonl").read_text().splitlines()]
    assert len(lines) >= 2 and all(line["host"]["trainer_rss_bytes"] > 0 for line in lines)
    assert lines[-1]["step"] >= lines[0]["step"]


def test_telemetry_can_be_switched_off():
    trainer, seen = make_trainer(steps=3, telemetry_interval=0)
    trainer.run()
    assert seen.telemetry == []


def test_nvml_without_a_driver_reports_the_reason_instead_of_raising():
    nvml = Nvml()
    if nvml.unavailable is None:
        pytest.skip("this machine has a working NVML")
    assert nvml.sample([1, 2]) == []
    assert "NVML" in nvml.unavailable or "NVIDIA" in nvml.unavailable or "nvidia" in nvml.unavailable


@pytest.mark.gpu
def test_nvml_gives_real_numbers_on_a_gpu():
    sampler = TelemetrySampler(torch.device("cuda"), on_sample=lambda s: None, current_step=lambda: 0)
    torch.ones(1024, 1024, device="cuda")
    sample = sampler.sample()
    sampler.stop()
    [first, *_] = sample.gpus
    assert first.memory_total_bytes > first.memory_used_bytes > 0
    assert 0 <= first.utilization_percent <= 100 and first.temperature_c > 0
    assert first.name and sample.torch.allocated_bytes >= 4 * 1024 * 1024
    message = protocol.Telemetry(sample=sample)
    assert protocol.decode(message.encode()) == message


def test_a_run_shorter_than_the_interval_has_a_sample_from_its_start_and_one_from_its_end():
    """``torchlab-tui mlp --headless --steps 5`` (0.3 s) left system.jsonl empty: no host row in export or compare."""
    samples = []
    sampler = TelemetrySampler(torch.device("cpu"), on_sample=samples.append, current_step=lambda: 5, interval_s=1.0)
    sampler.start()
    deadline = time.monotonic() + 30
    while not samples:  # the start's sample, long before the interval
        assert time.monotonic() < deadline, "no sample at the start"
        time.sleep(0.01)
    sampler.stop()
    assert len(samples) == 2 and samples[-1].step == 5


def test_the_machines_cpu_is_measured_from_the_samplers_own_reading():
    """psutil.cpu_percent(None) keeps one baseline per process: a caller in between left the sampler's first figure
    at 'cpu 0 % of 2 · trainer 65 %', the machine less busy than the trainer on it."""
    sampler = TelemetrySampler(torch.device("cpu"), on_sample=lambda s: None, current_step=lambda: 0)
    started = time.process_time()
    while time.process_time() - started < 0.3:  # this process busy for 0.3 s of CPU
        pass
    psutil.cpu_percent(None)  # another caller moves psutil's baseline to now
    host = sampler.sample().host
    sampler.stop()
    assert host.trainer_cpu_percent > 20
    assert host.cpu_percent * (host.cpu_count or 1) >= 0.8 * host.trainer_cpu_percent


def test_a_sample_has_each_cores_load_and_each_of_the_runs_processes_with_its_cpu_memory_and_disk_writes(tmp_path):
    """The full-size system view (``t``) of a CPU run was five lines of figures and ~45 blank rows: a sample held the
    machine's CPU as one figure and the run's processes as one RSS. It now holds each core's load, and each process
    of the run with its CPU, RSS and disk reads and writes, so the view can show them."""
    written = tmp_path / "written"
    # A worker of this "trainer" that writes 8 MiB to disk once told to, then keeps one core busy.
    script = (f"import os, sys\nsys.stdin.readline()\nwith open({str(written)!r}, 'wb') as f:\n"
              "    f.write(os.urandom(8 << 20)); f.flush(); os.fsync(f.fileno())\nwhile True: pass")
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE)
    sampler = TelemetrySampler(torch.device("cpu"), on_sample=lambda s: None, current_step=lambda: 7)
    try:
        sampler.sample()  # the child's first reading: what it does from now on is measured
        child.stdin.write(b"go\n")
        child.stdin.flush()
        busy = psutil.Process(child.pid)
        deadline = time.monotonic() + 60
        while not (written.exists() and written.stat().st_size == 8 << 20 and sum(busy.cpu_times()[:2]) > 0.5):
            assert time.monotonic() < deadline, "the child neither wrote nor ran"
            time.sleep(0.05)
        host = sampler.sample().host
    finally:
        child.kill()
        child.wait()
        sampler.stop()
    cores = host.cpu_percent_per_core
    assert len(cores) == len(psutil.cpu_times(percpu=True)) and all(0 <= load <= 100 for load in cores)
    assert sum(cores) / len(cores) == pytest.approx(host.cpu_percent, abs=0.1)  # the machine's figure is their mean
    trainer, *others = host.processes
    assert trainer.pid == os.getpid() and trainer.name == "trainer" and trainer.rss_bytes > 50 * 2**20
    [worker] = [process for process in others if process.pid == child.pid]
    assert worker.cpu_percent > 20 and worker.rss_bytes > 0
    if worker.write_bytes_per_s is None:
        pytest.skip("this machine does not let a process read its children's /proc/<pid>/io")
    assert worker.write_bytes_per_s > 0 and host.io_write_bytes_per_s >= worker.write_bytes_per_s


def test_a_rank_is_named_by_its_rank_and_a_data_loader_worker_as_one():
    """What the view lists beside each process: 'rank 1' for a rank the launcher started (its RANK), 'data worker'
    for a DataLoader's worker (torch names those pt_data_worker)."""
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m", RANK_MODULE],
                            env={**os.environ, "RANK": "1"})
    worker = subprocess.Popen([sys.executable, "-c", "import ctypes, time\nctypes.CDLL(None).prctl(15, b'pt_data_worker')\n"
                               "time.sleep(60)"])  # PR_SET_NAME, as torch names its DataLoader workers
    sampler = TelemetrySampler(torch.device("cpu"), on_sample=lambda s: None, current_step=lambda: 0)
    try:
        deadline = time.monotonic() + 30
        while psutil.Process(worker.pid).name() != "pt_data_worker":
            assert time.monotonic() < deadline, "the worker never named itself"
            time.sleep(0.05)
        names = {process.pid: process.name for process in sampler.sample().host.processes}
    finally:
        for child in (rank, worker):
            child.kill()
            child.wait()
        sampler.stop()
    assert names[os.getpid()] == "trainer" and names[rank.pid] == "rank 1" and names[worker.pid] == "data worker"


def test_a_line_of_system_jsonl_written_before_cores_and_processes_were_sampled_is_still_read():
    from torchlab.core.wire.payloads import TelemetrySample

    line = json.loads(
        '{"time":1795622294.89,"step":0,"host":{"cpu_percent":99.2,"cpu_count":2,"trainer_cpu_percent":96.8,'
        '"ram_used_bytes":1088856064,"ram_total_bytes":25276510208,"trainer_rss_bytes":343916544,"trainer_processes":1},'
        '"gpus":[],"gpu_status":"no GPU: no NVIDIA driver (NVML library not found)","torch":{"device":"cpu",'
        '"allocated_bytes":null,"reserved_bytes":null,"peak_allocated_bytes":null}}')
    sample = protocol.read_payload(TelemetrySample, line, "system.jsonl")
    assert sample.host.trainer_rss_bytes == 343916544
    assert sample.host.cpu_percent_per_core == [] and sample.host.processes == []
    assert sample.host.io_read_bytes_per_s is None and sample.host.io_write_bytes_per_s is None
