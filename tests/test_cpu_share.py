"""A training process's CPU threads: the cores it may use (affinity, cgroup quota), shared among the ranks on the
machine, the user's OMP_NUM_THREADS respected; idle OpenMP threads sleep instead of spinning (issue 45, item 9)."""

from __future__ import annotations

import os

import pytest
import torch

from trainers import TINY
from torchlab.core.cpu_share import (
    cgroup_quota_cores,
    decide_threads,
    prefer_passive_openmp_waits,
    ranks_on_this_machine,
    usable_cores,
)
from torchlab.core.errors import EXIT_OK
from torchlab.core.launch.cli import main


def write(path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_cgroup_v2_quota_is_read_as_cores_the_tightest_along_the_path(tmp_path):
    root, proc = tmp_path / "cgroup", tmp_path / "proc-self-cgroup"
    write(proc, "0::/user.slice/job\n")
    write(root / "user.slice" / "job" / "cpu.max", "250000 100000\n")
    write(root / "user.slice" / "cpu.max", "max 100000\n")
    assert cgroup_quota_cores(proc, root) == 2.5
    write(root / "user.slice" / "cpu.max", "150000 100000\n")  # the parent's limit binds its children
    assert cgroup_quota_cores(proc, root) == 1.5
    write(root / "user.slice" / "job" / "cpu.max", "max 100000\n")
    write(root / "user.slice" / "cpu.max", "max 100000\n")
    assert cgroup_quota_cores(proc, root) is None


def test_a_cgroup_v1_cfs_quota_is_read_as_cores_and_minus_one_is_none(tmp_path):
    root, proc = tmp_path / "cgroup", tmp_path / "proc-self-cgroup"
    write(proc, "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n")
    folder = root / "cpu,cpuacct" / "docker" / "abc"
    write(folder / "cpu.cfs_quota_us", "200000\n")
    write(folder / "cpu.cfs_period_us", "100000\n")
    assert cgroup_quota_cores(proc, root) == 2.0
    write(folder / "cpu.cfs_quota_us", "-1\n")
    assert cgroup_quota_cores(proc, root) is None
    assert cgroup_quota_cores(tmp_path / "no-such-file", root) is None  # not Linux, or no cgroup fs
    write(proc, "4:cpu:/docker/abc\n")  # mounted as cpu alone
    write(root / "cpu" / "docker" / "cpu.cfs_quota_us", "50000\n")
    write(root / "cpu" / "docker" / "cpu.cfs_period_us", "100000\n")
    assert cgroup_quota_cores(proc, root) == 0.5


def test_the_usable_cores_are_the_affinity_or_the_whole_cores_of_a_smaller_quota():
    assert usable_cores(affinity=16, quota=2.0) == 2
    assert usable_cores(affinity=16, quota=2.5) == 2  # a third thread would be throttled, not run
    assert usable_cores(affinity=16, quota=0.5) == 1
    assert usable_cores(affinity=2, quota=8.0) == 2
    assert usable_cores(affinity=4, read_quota=False) == 4


def test_the_ranks_on_a_machine_divide_its_cores_and_the_users_omp_num_threads_wins():
    assert decide_threads(1, cores=2, environ={}).threads == 2
    assert decide_threads(2, cores=2, environ={}).threads == 1
    assert decide_threads(2, cores=16, environ={}).threads == 8
    assert decide_threads(4, cores=2, environ={}).threads == 1  # never none
    theirs = decide_threads(2, cores=16, environ={"OMP_NUM_THREADS": "3"})
    assert theirs.threads == 3 and theirs.user_threads == "3"
    assert "OMP_NUM_THREADS=3 is set" in theirs.describe()
    unreadable = decide_threads(2, cores=16, environ={"OMP_NUM_THREADS": "many"})
    assert unreadable.threads == 8 and unreadable.user_threads is None
    assert ranks_on_this_machine({"LOCAL_WORLD_SIZE": "4"}) == 4 and ranks_on_this_machine({}) == 1


def test_idle_openmp_threads_sleep_unless_the_user_chose_how_they_wait():
    environ: dict[str, str] = {}
    assert prefer_passive_openmp_waits(environ) and environ == {"OMP_WAIT_POLICY": "PASSIVE"}
    for theirs in ({"OMP_WAIT_POLICY": "active"}, {"GOMP_SPINCOUNT": "10000"}, {"KMP_BLOCKTIME": "200"}):
        assert not prefer_passive_openmp_waits(environ := dict(theirs)) and environ == theirs


@pytest.fixture
def torch_threads_kept():
    """The one-process trainer runs in this process: its threads and affinity are put back afterwards."""
    threads, affinity = torch.get_num_threads(), os.sched_getaffinity(0)
    yield
    os.sched_setaffinity(0, affinity)
    torch.set_num_threads(threads)


def headless_world_size_1(run_dir) -> int:
    return main([TINY, "--headless", "--run-dir", str(run_dir), "--steps", "2", "--telemetry-interval", "0",
                 "--checkpoint-every", "0", "--eval-every", "0"])


def test_the_one_process_trainer_runs_as_many_threads_as_the_cores_it_may_use_or_as_the_user_set(
        tmp_path, monkeypatch, capfd, torch_threads_kept):
    """Affinity narrowed to one core after torch chose its threads (as taskset or a cpuset does to a process on a
    bigger machine): the trainer runs one thread, not torch's default; the waiting policy is set before torch
    would load. Then the user's OMP_NUM_THREADS: left alone, and said once."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    torch.set_num_threads(2)
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    assert headless_world_size_1(tmp_path / "narrowed") == EXIT_OK
    assert torch.get_num_threads() == 1
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    assert "OMP_NUM_THREADS" not in capfd.readouterr().err

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    torch.set_num_threads(2)  # what torch, loading in a process of their own, would have read
    assert headless_world_size_1(tmp_path / "theirs") == EXIT_OK
    assert torch.get_num_threads() == 2
    said = capfd.readouterr().err
    assert said.count("OMP_NUM_THREADS=2 is set, so torch runs 2 threads a process as you asked") == 1
