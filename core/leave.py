"""How a process of the trainer's ends: with its exit status, and where it is a rank (a torch.distributed process
group of its own), without torch's teardown of that group.

Freeing the DDP reducer frees its gloo process group, whose destructor joins gloo's worker threads while holding the
GIL. A worker that is still dropping the last collective's tensors (created in Python, so their release needs the GIL)
then waits for the GIL for ever, and the rank never exits: seen under load with torch 2.13, the supervisor waiting on
a finished run, and a ``torchrun`` agent waiting on its rank 0 that had said "stopped" (the two-node test on the CI
machine, three minutes). By the time a rank leaves, everything it writes is written and closed (checkpoints are
published before a run returns; the app's socket is flushed and closed), and its launcher reads only the exit code.

Standard library only: the app's commands (``attach``, ``stop``) end through here too and never import torch.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn


def leave_without_teardown(code: int) -> NoReturn:
    """End this process now with ``code``, its output flushed, skipping every teardown (see the module docstring)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def exit_with(code: int) -> NoReturn:
    """End a command's process with ``code``: a rank (a process group open) leaves without torch's teardown, any other
    process exits as Python does."""
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        leave_without_teardown(code)
    sys.exit(code)
