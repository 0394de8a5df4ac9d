"""GPU figures through NVML (nvidia-ml-py's ``pynvml``), each of which may be missing.

Like nvitop, this layer never raises to its caller: a box without NVIDIA says why (``unavailable``),
and a GPU that hides a field (power on some boards, processes in containers) gives None for that
field only. Standard library plus ``pynvml``: no torch, so the app could use it too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from torchlab.core.wire.payloads import GpuSample

try:
    import pynvml
except ImportError:  # nvidia-ml-py is a dependency, but a broken install must not stop training
    pynvml = None


class Nvml:
    """An NVML session; ``unavailable`` holds the reason when there is none."""

    def __init__(self) -> None:
        self.unavailable: str | None = None
        self.handles: list[Any] = []
        if pynvml is None:
            self.unavailable = "nvidia-ml-py is not installed"
            return
        try:
            pynvml.nvmlInit()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except pynvml.NVMLError as error:
            self.unavailable = _reason(error)
            return
        if not self.handles:
            self.unavailable = "NVML sees no GPU"

    def sample(self, pids: Iterable[int]) -> list[GpuSample]:
        """One sample per GPU; ``this_run_memory_bytes`` sums the memory NVML attributes to ``pids``."""
        if self.unavailable:
            return []
        wanted = set(pids)
        gpus = []
        for index, handle in enumerate(self.handles):
            memory = _read(pynvml.nvmlDeviceGetMemoryInfo, handle)
            utilisation = _read(pynvml.nvmlDeviceGetUtilizationRates, handle)
            power_mw = _read(pynvml.nvmlDeviceGetPowerUsage, handle)
            limit_mw = _read(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)
            processes = _read(pynvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
            ours = [p.usedGpuMemory for p in processes if p.pid in wanted and p.usedGpuMemory is not None]
            gpus.append(GpuSample(
                index=index,
                name=_read(pynvml.nvmlDeviceGetName, handle),
                memory_used_bytes=memory.used if memory else None,
                memory_total_bytes=memory.total if memory else None,
                utilization_percent=utilisation.gpu if utilisation else None,
                temperature_c=_read(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU),
                power_w=power_mw / 1000 if power_mw is not None else None,
                power_limit_w=limit_mw / 1000 if limit_mw is not None else None,
                sm_clock_mhz=_read(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM),
                this_run_memory_bytes=sum(ours) if processes else None,
            ))
        return gpus

    def close(self) -> None:
        if not self.unavailable:
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass  # shutting down anyway; nothing to report to anyone


def _read(query: Callable, *args: Any) -> Any:
    try:
        return query(*args)
    except pynvml.NVMLError:
        return None


def _reason(error: Exception) -> str:
    if pynvml is not None and isinstance(error, pynvml.NVMLError_LibraryNotFound):
        return "no NVIDIA driver (NVML library not found)"
    if pynvml is not None and isinstance(error, pynvml.NVMLError_DriverNotLoaded):
        return "the NVIDIA driver is not loaded"
    return f"NVML: {error}"
