"""A real, small, full disk for the tests of what a full disk costs: a 3 MB tmpfs (``small_disk``, a fixture;
skipped where mounting one is not permitted) holding a workload whose checkpoint takes about 420 kB, and
``leave_free`` to fill it. Used by tests/product/test_full_disk.py, tests/test_folder_rule.py and
tests/tui/test_with_trainer.py."""

from __future__ import annotations

import errno
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

#: A checkpoint of this workload takes about 420 kB (weights, and AdamW's two moments for each).
WORKLOAD = textwrap.dedent("""
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset
    from torchlab.core.workload import Workload

    def loss(model, batch):
        inputs, targets = batch
        return nn.functional.mse_loss(model(inputs), targets)

    def workload():
        inputs = torch.randn(256, 64, generator=torch.Generator().manual_seed(0))
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 1))
        return Workload(model=model, dataset=TensorDataset(inputs, inputs[:, :1]), loss_fn=loss, batch_size=16)
""")
CHECKPOINT_BYTES = 420 * 1024
#: Free space for one checkpoint (and the journals beside it), not for two.
ROOM_FOR_ONE_CHECKPOINT = CHECKPOINT_BYTES + 220 * 1024


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MB tmpfs, unmounted after the test."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount_point)],
                                 capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("no mount command here; tests/records/test_run_files.py injects the same faults")
    if mounted.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here ({mounted.stderr.strip()}); "
                    "tests/records/test_run_files.py injects the same faults")
    try:
        (mount_point / "workload.py").write_text(WORKLOAD)
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def leave_free(disk: Path, room: int, name: str = "filler") -> Path:
    """Fill ``disk`` with a file until ``room`` bytes are free (0: until nothing is)."""
    space = os.statvfs(disk)
    filler = disk / name
    if room:
        filler.write_bytes(b"\1" * max(0, space.f_bavail * space.f_frsize - room))
        return filler
    descriptor = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            try:
                os.write(descriptor, b"\1" * 4096)
            except OSError as error:
                assert error.errno == errno.ENOSPC
                return filler
    finally:
        os.close(descriptor)
