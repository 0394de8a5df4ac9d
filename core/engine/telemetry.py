"""System telemetry: a sampler thread in the trainer, about once a second.

Each sample is a ``TelemetrySample`` (core/wire/payloads.py): ``time``, ``step``, ``host`` (CPU %, RAM,
the RSS of the trainer and its children, such as DataLoader workers), ``gpus`` (from NVML; empty with
``gpu_status`` saying why), and ``torch`` (the CUDA caching allocator: allocated, reserved, and the peak
since the last reset, which the trainer does at each option change). The thread only reads; the
training thread never waits for it, and NVML calls do not synchronise CUDA.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import psutil
import torch

from torchlab.core.engine.nvml import Nvml
from torchlab.core.wire.payloads import AllocatorSample, HostSample, TelemetrySample, no_gpu_status


#: The first sample of a run comes this soon after its start (or at the interval, if that is sooner).
FIRST_SAMPLE_AFTER_S = 0.2


class TelemetrySampler:
    def __init__(
        self,
        device: torch.device,
        on_sample: Callable[[TelemetrySample], None],
        current_step: Callable[[], int],
        interval_s: float = 1.0,
    ) -> None:
        self.device = device
        self.on_sample = on_sample
        self.current_step = current_step
        self.interval_s = interval_s
        self.nvml = Nvml()
        self._process = psutil.Process()
        #: (a clock, the machine's busy CPU seconds, the run's CPU seconds) at the last sample: the next one says
        #: what each used since. The machine's is our own reading: psutil.cpu_percent(None) keeps one baseline for
        #: the whole process, which any other caller moves.
        self._cpu_then = (time.monotonic(), machine_busy_seconds(), run_cpu_seconds(run_processes(self._process)))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="torchlab-telemetry", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling; a sampler that was started takes one last sample, so that a run of a fraction of a
        second has figures from its end too."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
        if self._thread.ident is not None:
            self.on_sample(self.sample())
        self.nvml.close()

    def _loop(self) -> None:
        # A first sample soon after the start (a 0.3 s run had none), once the CPU figures cover enough time to mean
        # something: over a few milliseconds a busy CPU reads as 0 % or 100 %.
        if not self._stop.wait(min(FIRST_SAMPLE_AFTER_S, self.interval_s)):
            self.on_sample(self.sample())
        while not self._stop.wait(self.interval_s):
            self.on_sample(self.sample())

    def sample(self) -> TelemetrySample:
        processes = run_processes(self._process)
        gpus = self.nvml.sample(p.pid for p in processes)
        return TelemetrySample(
            time=time.time(),
            step=self.current_step(),
            host=self._host(processes),
            gpus=gpus,
            gpu_status=no_gpu_status(self.nvml.unavailable) if self.nvml.unavailable else f"{len(gpus)} GPU(s)",
            torch=self._allocator(),
        )

    def _host(self, processes: list[psutil.Process]) -> HostSample:
        memory = psutil.virtual_memory()
        rss = 0
        for process in processes:
            try:
                rss += process.memory_info().rss
            except psutil.Error:  # a DataLoader worker that just exited
                continue
        machine_percent, run_percent = self._cpu_percents(processes)
        return HostSample(
            cpu_percent=machine_percent,
            cpu_count=psutil.cpu_count(),
            trainer_cpu_percent=run_percent,
            ram_used_bytes=memory.total - memory.available,
            ram_total_bytes=memory.total,
            trainer_rss_bytes=rss,
            trainer_processes=len(processes),
        )

    def _cpu_percents(self, processes: list[psutil.Process]) -> tuple[float, float]:
        """Since the last sample: the machine's CPU in % of the whole machine (0-100), and what the run's processes
        used, all of them together, in % of one CPU. The machine's less the run's is what other processes took
        (the impact table's verdicts need to know)."""
        then, busy_then, run_then = self._cpu_then
        now, busy, run = time.monotonic(), machine_busy_seconds(), run_cpu_seconds(processes)
        self._cpu_then = (now, busy, run)
        if now <= then:
            return 0.0, 0.0
        machine = 100 * (busy - busy_then) / ((now - then) * (psutil.cpu_count() or 1))
        return min(100.0, max(0.0, machine)), max(0.0, 100 * (run - run_then) / (now - then))

    def _allocator(self) -> AllocatorSample:
        if self.device.type != "cuda":
            return AllocatorSample(device=str(self.device), allocated_bytes=None, reserved_bytes=None, peak_allocated_bytes=None)
        return AllocatorSample(
            device=str(self.device),
            allocated_bytes=torch.cuda.memory_allocated(self.device),
            reserved_bytes=torch.cuda.memory_reserved(self.device),
            peak_allocated_bytes=torch.cuda.max_memory_allocated(self.device),
        )


def run_processes(root: psutil.Process) -> list[psutil.Process]:
    """``root`` and its children and theirs (DataLoader workers, ranks, compile workers, the profile-table builder)."""
    try:
        pids = _descendant_pids(root.pid)
    except OSError:  # no /proc to read (not Linux): psutil finds them its own way
        try:
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return [root]
    children = []
    for pid in pids:
        try:
            children.append(psutil.Process(pid))
        except psutil.Error:  # exited since
            continue
    return [root, *children]


def run_cpu_seconds(processes: list[psutil.Process]) -> float:
    """The CPU time the run has used: ``processes`` (``run_processes``: the root first) and the children the root
    has reaped (their time moved into its ``children_*``), so a worker that exits takes nothing away."""
    root = processes[0].cpu_times()
    total = root.user + root.system + root.children_user + root.children_system
    for process in processes[1:]:
        try:
            times = process.cpu_times()
        except psutil.Error:  # exited since it was listed
            continue
        total += times.user + times.system
    return total


def _descendant_pids(root: int) -> list[int]:
    """The pids below ``root`` in the process tree, from one pass over ``/proc/*/stat``.

    What ``psutil.Process.children(recursive=True)`` reads, in half its time: it opens each file as a
    Python file object (~2.3 ms a sample with 140 processes on the machine, where this takes ~1.2 ms;
    a box with thousands of processes pays that many times over, every second).
    """
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            descriptor = os.open(f"/proc/{name}/stat", os.O_RDONLY)
            try:
                stat = os.read(descriptor, 1024)
            finally:
                os.close(descriptor)
        except OSError:  # exited meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")".
        fields = stat[stat.rfind(b")") + 2:].split(b" ", 2)
        if len(fields) >= 2:
            children.setdefault(int(fields[1]), []).append(int(name))
    found, waiting = [], [root]
    while waiting:
        for pid in children.get(waiting.pop(), ()):
            found.append(pid)
            waiting.append(pid)
    return found


class OthersCpuMeter:
    """What other processes took of the machine's CPU between ``start()`` and ``stop()``, in % of the whole machine
    (0-100): the busy time of every CPU less this process tree's own (its DataLoader workers, ranks and compile
    workers; children it has reaped count through its ``children_*`` times). A trial's two arms run one after
    the other: where a neighbour's load came or went between them, their step times compare the machine, not the
    option (``core/wire/impact.py``'s ``load_shift``)."""

    def __init__(self) -> None:
        self._process = psutil.Process()
        self._started: tuple[float, float, float] | None = None

    def start(self) -> None:
        self._started = self._readings()

    def stop(self) -> float | None:
        """The share since ``start()``; None where too little time passed to say (under 50 ms) or /proc is gone."""
        if self._started is None:
            return None
        then, busy_then, own_then = self._started
        now, busy, own = self._readings()
        wall = (now - then) * (psutil.cpu_count() or 1)
        if wall < 0.05:
            return None
        return min(100.0, max(0.0, 100 * ((busy - busy_then) - (own - own_then)) / wall))

    def _readings(self) -> tuple[float, float, float]:
        """(a clock, the machine's busy CPU seconds, this process tree's CPU seconds)."""
        return time.monotonic(), machine_busy_seconds(), run_cpu_seconds(run_processes(self._process))


def machine_busy_seconds() -> float:
    """The CPU seconds every CPU of the machine has been busy since boot."""
    times = psutil.cpu_times()
    # Linux counts guest time inside user and nice already; steal (other VMs) is time taken from us too.
    return sum(getattr(times, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq", "steal"))

