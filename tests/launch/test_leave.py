"""How the trainer's processes end (core/leave.py): a rank under torchrun leaves without torch's teardown of its
process group, whose gloo destructor can wait for the GIL for ever under load (a torchrun agent then waits on its
rank 0 that had said "stopped"); any other process exits as Python does."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import atexit, os, sys, tempfile
import torch.distributed as dist
from torchlab.core.leave import exit_with
if sys.argv[1] == "rank":
    store = tempfile.mktemp()
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
atexit.register(lambda: print("torn down"))
print("leaving", flush=True)
exit_with(3)
"""


@pytest.mark.parametrize("process, torn_down", [("rank", False), ("command", True)])
def test_a_rank_leaves_with_its_status_and_without_teardown_and_a_command_exits_as_python_does(process, torn_down):
    ended = subprocess.run([sys.executable, "-c", SCRIPT, process], capture_output=True, text=True, timeout=120)
    assert ended.returncode == 3, ended.stderr
    assert ended.stdout.splitlines() == ["leaving"] + (["torn down"] if torn_down else [])
