"""How many CPU threads a training process runs torch with, and how its OpenMP threads wait.

A process may use the cores of its affinity mask (``taskset``, a cpuset) and no more CPU time than its cgroup's
quota (``docker --cpus``, a Kubernetes CPU limit: cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``); the smaller
of the two is what it may use. The ranks on one machine divide that among themselves, so a rank gets
``cores // ranks`` intra-op threads (at least one); the one-process trainer is one rank. torch's own default is the
machine's cores, which on a 16-core host under a 2-core quota runs 16 threads that the quota throttles.

OpenMP's waiting policy (issue 45, item 9): torch's CPU wheel uses GNU OpenMP, whose threads spin after each
parallel region before they sleep (``GOMP_SPINCOUNT``, 300,000 pause loops by default: milliseconds on a
recent Xeon). On a box whose cores something else also uses, the spinning thread takes the core from the
thread that has the work, and every one of a step's thousands of small parallel regions waits for a time
slice: world size 1 (two threads in one process) ran 2.3-6.9x slower than two one-thread ranks, which have no
thread to wait for. ``OMP_WAIT_POLICY=PASSIVE`` makes an idle thread sleep at once. The runtime reads it only
when torch loads it, so the command line sets it before anything imports torch, in its own environment, which
the trainer and rank processes it starts inherit (``prefer_passive_openmp_waits``).

What the user set wins: ``OMP_NUM_THREADS`` (``torchrun`` sets 1 for several ranks a node) fixes the threads, and
any of ``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT`` or ``KMP_BLOCKTIME`` the waiting. This module decides and imports
no torch (the live options' limits read it too: no more ranks or loader workers than the cores allow);
core/engine/parallel/cpu_share.py applies the decision to torch.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

THREADS_VARIABLE = "OMP_NUM_THREADS"
WAIT_POLICY_VARIABLE = "OMP_WAIT_POLICY"
#: Any of these set by the user decides how OpenMP's threads wait; we set the first only where none is.
WAIT_VARIABLES = (WAIT_POLICY_VARIABLE, "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
#: The elastic launcher's count of the ranks on this machine (torchrun's and our supervisor's alike).
RANKS_HERE_VARIABLE = "LOCAL_WORLD_SIZE"

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def affinity_cores() -> int:
    """The cores this process may be scheduled on (its affinity mask, which a container or taskset narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cgroup_quota_cores(proc_cgroup: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> float | None:
    """The CPU time this process's cgroup allows, in cores (a quota of 150000 µs per 100000 µs period: 1.5), the
    tightest along its path to the root; None where no quota is set or none can be read (not Linux, no cgroup fs).

    Reads cgroup v2's ``cpu.max`` (``"max 100000"``: no quota) and v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``
    (a quota of -1: none), at the path ``/proc/self/cgroup`` gives (``/`` inside a container's namespace)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    quotas: list[float] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one unified hierarchy
            quotas += _quotas_along(root, path, _v2_quota)
        elif "cpu" in controllers.split(","):  # mounted as cpu,cpuacct, or as cpu (often a link to it)
            mount = root / controllers if (root / controllers).is_dir() else root / "cpu"
            quotas += _quotas_along(mount, path, _v1_quota)
    return min(quotas, default=None)


def _quotas_along(mount: Path, path: str, read) -> list[float]:
    """The quotas set on ``path`` and each of its ancestors under ``mount`` (a parent's limit binds its children)."""
    parts = [part for part in path.split("/") if part]
    found = []
    for depth in range(len(parts), -1, -1):
        quota = read(mount.joinpath(*parts[:depth]))
        if quota is not None:
            found.append(quota)
    return found


def _v2_quota(folder: Path) -> float | None:
    try:
        quota, period = (folder / "cpu.max").read_text().split()
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def _v1_quota(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota <= 0 or period <= 0 else quota / period


def usable_cores(*, affinity: int | None = None, quota: float | None = None, read_quota: bool = True) -> int:
    """The whole cores this process may use: its affinity, or its cgroup quota rounded down (at least 1) where
    that is smaller. A thread beyond the quota is throttled, not run."""
    cores = affinity_cores() if affinity is None else affinity
    if quota is None and read_quota:
        quota = cgroup_quota_cores()
    if quota is not None:
        cores = min(cores, max(1, math.floor(quota)))
    return max(1, cores)


@dataclass(frozen=True)
class ThreadShare:
    """One process's intra-op threads and why: the user's ``OMP_NUM_THREADS`` (``user_threads``), or our share."""

    threads: int
    cores: int
    ranks_here: int
    user_threads: str | None = None

    def describe(self) -> str:
        """One line for trainer.log (the terminal of a headless run)."""
        share = f"this process may use {self.cores} core{'s' * (self.cores != 1)}, {self.ranks_here} rank{'s' * (self.ranks_here != 1)} here"
        if self.user_threads is not None:
            return (f"torchlab: {THREADS_VARIABLE}={self.user_threads} is set, so torch runs {self.threads} thread"
                    f"{'s' * (self.threads != 1)} a process as you asked ({share}; unset it to let torchlab share the cores out)")
        return f"torchlab: torch runs {self.threads} thread{'s' * (self.threads != 1)} a process ({share})"


def ranks_on_this_machine(environ: Mapping[str, str] = os.environ) -> int:
    """The ranks sharing this machine's cores: the launcher's ``LOCAL_WORLD_SIZE``, else 1 (the one-process trainer)."""
    try:
        return max(1, int(environ.get(RANKS_HERE_VARIABLE, "1")))
    except ValueError:
        return 1


def decide_threads(ranks_here: int, *, cores: int | None = None, environ: Mapping[str, str] = os.environ) -> ThreadShare:
    """The intra-op threads of one of ``ranks_here`` processes sharing ``cores`` (default: ``usable_cores()``)."""
    cores = usable_cores() if cores is None else cores
    user = environ.get(THREADS_VARIABLE, "").strip()
    if user:
        try:
            threads = max(1, int(user.split(",")[0]))
        except ValueError:  # OpenMP ignores a value it cannot read; torch then keeps its own default
            threads = None
        if threads is not None:
            return ThreadShare(threads, cores, ranks_here, user_threads=user)
    return ThreadShare(max(1, cores // max(1, ranks_here)), cores, ranks_here)


def prefer_passive_openmp_waits(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Make idle OpenMP threads sleep instead of spinning, unless the user chose how they wait; whether it did.
    Takes effect in a process that imports torch after it, and in every process started from it."""
    if any(environ.get(name, "").strip() for name in WAIT_VARIABLES):
        return False
    environ[WAIT_POLICY_VARIABLE] = "PASSIVE"
    return True
