"""System telemetry: a sampler thread in the trainer, about once a second.

Each sample is a ``TelemetrySample`` (core/wire/payloads.py): ``time``, ``step``, ``host`` (CPU %, RAM,
the RSS of the trainer and its children, such as DataLoader workers; each core's load; each of the run's
processes with its CPU, RSS and disk reads and writes), ``gpus`` (from NVML; empty with ``gpu_status`` saying
why), and ``torch`` (the CUDA caching allocator: allocated, reserved, and the peak since the last reset, which
the trainer does at each option change). The thread only reads; the training thread never waits for it, and
NVML calls do not synchronise CUDA.

Every rate is since the previous sample, from the sampler's own readings (a cumulative count, then the next):
each process read once a sample (CPU times, RSS, I/O counters: three small /proc files on Linux), and the
cores from one read of /proc/stat.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil
import torch

from torchlab.core.engine.measure.nvml import Nvml
from torchlab.core.engine.parallel.distributed import RANK_MODULE
from torchlab.core.wire.payloads import AllocatorSample, HostSample, ProcessSample, TelemetrySample, no_gpu_status


#: The first sample of a run comes this soon after its start (or at the interval, if that is sooner).
FIRST_SAMPLE_AFTER_S = 0.2
#: A sample lists at most this many of the run's processes one by one (the trainer, then the busiest): eight ranks
#: with eight DataLoader workers each would make a line of system.jsonl of seventy; its totals count them all.
MAX_PROCESSES_LISTED = 24
#: The fields of /proc/stat that count a core as busy. Linux counts guest time inside user and nice already;
#: steal (other VMs) is time taken from us too.
_BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq", "steal")


@dataclass(frozen=True)
class _Reading:
    """One process at one sample, as cumulative counts: the rates are the next sample's differences."""

    cpu_s: float  # user + system
    reaped_cpu_s: float  # its children's that it has waited for (a DataLoader worker that exited, say)
    rss_bytes: int
    read_bytes: int | None  # from the disk (the page cache's hits are not in it); None where the OS does not say
    write_bytes: int | None


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
        #: (a clock, each core's busy CPU seconds, the run's CPU seconds) at the last sample: the next one says
        #: what each used since. The machine's is our own reading: psutil.cpu_percent(None) keeps one baseline for
        #: the whole process, which any other caller moves.
        #: each process's reading at the last sample: its rates in the next. A psutil.Process is equal to another of
        #: the same pid and start time, so a later process that reuses a pid is not taken for the one before.
        self._readings_then: dict[psutil.Process, _Reading] = self._read(run_processes(self._process))
        self._cpu_then = (time.monotonic(), cores_busy_seconds(), self._run_cpu_seconds(self._readings_then))
        #: what each process is ("rank 1", "data worker"): read once, from its command line and name
        self._names: dict[psutil.Process, str] = {}
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
        then, cores_then, run_then = self._cpu_then
        now, cores, readings = time.monotonic(), cores_busy_seconds(), self._read(processes)
        run_s = self._run_cpu_seconds(readings)
        self._cpu_then = (now, cores, run_s)
        wall = now - then
        per_core = [_percent(busy - busy_then, wall) for busy, busy_then in zip(cores, cores_then)]
        listed = self._processes(processes, readings, wall)
        return HostSample(
            cpu_percent=sum(per_core) / len(per_core) if per_core else 0.0,
            cpu_count=psutil.cpu_count(),
            trainer_cpu_percent=max(0.0, 100 * (run_s - run_then) / wall) if wall > 0 else 0.0,
            ram_used_bytes=memory.total - memory.available,
            ram_total_bytes=memory.total,
            trainer_rss_bytes=sum(reading.rss_bytes for reading in readings.values()),
            trainer_processes=len(processes),
            cpu_percent_per_core=[round(load, 1) for load in per_core],
            processes=listed[:MAX_PROCESSES_LISTED],
            io_read_bytes_per_s=_total(process.read_bytes_per_s for process in listed),
            io_write_bytes_per_s=_total(process.write_bytes_per_s for process in listed),
        )

    def _run_cpu_seconds(self, readings: dict[psutil.Process, _Reading]) -> float:
        """What ``run_cpu_seconds`` says, from readings taken: the run's processes and the children the trainer reaped."""
        root = readings.get(self._process)
        return (root.reaped_cpu_s if root else 0.0) + sum(reading.cpu_s for reading in readings.values())

    @staticmethod
    def _read(processes: list[psutil.Process]) -> dict[psutil.Process, _Reading]:
        """Each process's counts now; one that exited since it was listed has none."""
        readings = {}
        for process in processes:
            try:
                with process.oneshot():
                    times, rss = process.cpu_times(), process.memory_info().rss
                    try:
                        io = process.io_counters()
                    except (psutil.AccessDenied, AttributeError):  # a container's /proc/<pid>/io, or no such counter
                        io = None
            except psutil.Error:  # a DataLoader worker that just exited
                continue
            readings[process] = _Reading(times.user + times.system, times.children_user + times.children_system, rss,
                                             io and io.read_bytes, io and io.write_bytes)
        return readings

    def _processes(self, processes: list[psutil.Process], readings: dict[psutil.Process, _Reading],
                   wall: float) -> list[ProcessSample]:
        """The run's processes with their rates since the last sample: the trainer first, then the busiest. One
        that started since is measured over its life so far."""
        listed = []
        for process in processes:
            reading = readings.get(process)
            if reading is None:
                continue
            before = self._readings_then.get(process)
            span = wall if before is not None else max(1e-3, time.time() - process.create_time())
            before = before or _Reading(0.0, 0.0, 0, 0, 0)
            listed.append(ProcessSample(
                pid=process.pid, name=self._name(process), cpu_percent=round(max(0.0, 100 * (reading.cpu_s - before.cpu_s) / span), 1),
                rss_bytes=reading.rss_bytes, read_bytes_per_s=_rate(reading.read_bytes, before.read_bytes, span),
                write_bytes_per_s=_rate(reading.write_bytes, before.write_bytes, span),
            ))
        self._readings_then = readings
        self._names = {process: name for process, name in self._names.items() if process in readings}
        trainer, *others = listed or [None]
        return [trainer, *sorted(others, key=lambda process: -process.cpu_percent)] if trainer else []

    def _name(self, process: psutil.Process) -> str:
        if process not in self._names:
            self._names[process] = "trainer" if process == self._process else process_name(process)
        return self._names[process]

    def _allocator(self) -> AllocatorSample:
        if self.device.type != "cuda":
            return AllocatorSample(device=str(self.device), allocated_bytes=None, reserved_bytes=None, peak_allocated_bytes=None)
        return AllocatorSample(
            device=str(self.device),
            allocated_bytes=torch.cuda.memory_allocated(self.device),
            reserved_bytes=torch.cuda.memory_reserved(self.device),
            peak_allocated_bytes=torch.cuda.max_memory_allocated(self.device),
        )


def process_name(process: psutil.Process) -> str:
    """What a process of the run is, in words: "rank 1" for a rank the launcher started (its RANK), "data worker"
    for a DataLoader's (torch names those ``pt_data_worker``), "compile worker" for torch.compile's; else the name
    the OS has for it."""
    try:
        name, command = process.name(), " ".join(process.cmdline())
    except psutil.Error:  # exited meanwhile
        return "?"
    if RANK_MODULE in command:
        try:
            return f"rank {process.environ().get('RANK', '?')}"
        except psutil.Error:  # its environment is not ours to read
            return "rank"
    if name == "pt_data_worker":
        return "data worker"
    if "compile_worker" in command:
        return "compile worker"
    return name


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
    option (``core/analysis/step_times.py``'s ``load_shift``)."""

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
    return _busy(psutil.cpu_times())


def cores_busy_seconds() -> list[float]:
    """The CPU seconds each core has been busy since boot, in the order the OS numbers them."""
    return [_busy(times) for times in psutil.cpu_times(percpu=True)]


def _busy(times) -> float:
    return sum(getattr(times, name, 0.0) for name in _BUSY_FIELDS)


def _percent(busy_s: float, wall_s: float) -> float:
    """Busy seconds over a wall-clock span as % of one core, 0-100 (clocks that read a hair apart can say 100.3)."""
    return min(100.0, max(0.0, 100 * busy_s / wall_s)) if wall_s > 0 else 0.0


def _rate(count: int | None, before: int | None, span_s: float) -> float | None:
    return max(0.0, (count - before) / span_s) if count is not None and before is not None else None


def _total(rates) -> float | None:
    known = [rate for rate in rates if rate is not None]
    return sum(known) if known else None

