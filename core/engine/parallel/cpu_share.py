"""Apply this process's share of the CPU to torch: the decision is core/cpu_share.py's (the cores the process
may use, divided among the ranks on the machine; the user's ``OMP_NUM_THREADS`` wins), made here in the one-process
trainer and in every rank, before the workload is built (Lightning and transformers workloads train in the same
processes)."""

from __future__ import annotations

import sys

import torch

from torchlab.core.cpu_share import ThreadShare, decide_threads, ranks_on_this_machine

_said: set[str] = set()


def apply_thread_share(*, reports: bool) -> ThreadShare:
    """Set this process's torch threads to its share of the cores; where the user set ``OMP_NUM_THREADS``, leave
    torch alone and, in the process that reports (``reports``: rank 0, or the one-process trainer), say so once
    (trainer.log in the app, the terminal headless)."""
    share = decide_threads(ranks_on_this_machine())
    if share.user_threads is None:
        if torch.get_num_threads() != share.threads:
            torch.set_num_threads(share.threads)
    elif reports and share.describe() not in _said:
        _said.add(share.describe())
        print(share.describe(), file=sys.stderr, flush=True)
    return share
