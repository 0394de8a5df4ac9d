"""torch's elastic launcher as the supervisor uses it: private logs for the ranks, the rank whose failure ended a
run (``root_cause``), and taking the ranks down when the supervisor leaves early."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import psutil

from torchlab.core.engine.parallel.distributed import RANK_MODULE
from torchlab.core.records.storage import create_file, match_folder_privacy

#: How long the supervisor waits for rank processes to leave once it killed them.
TERMINATE_GRACE_S = 10.0
_PEER_LOST = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|remote worker crash|NCCL communicator was aborted", re.I)


def private_rank_logs(logs: Path):
    """torch's ``DefaultLogsSpecs`` for the ranks' stdout and stderr under ``logs``, made as private as ``logs``
    (``ranks/`` in the run directory): the launcher makes its folders with the umask's mode and opens each log
    with ``open(path, "w")``, which keeps the mode of a file that is there. So its folders lose their group and
    other bits as soon as they are made, inside the launcher's own 0700 folder (no one else could enter them
    meanwhile), and each log is created here first, as ``create_file`` makes it. A rank's ``error.json``, written
    by the rank only when it fails, is torch's, in those folders."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std

    class PrivateLogsSpecs(DefaultLogsSpecs):
        def reify(self, envs):
            destinations = super().reify(envs)
            for log in (*destinations.stdouts.values(), *destinations.stderrs.values()):
                if log and log != os.devnull:
                    log = Path(log)
                    for folder in reversed(log.relative_to(logs).parents[:-1]):
                        match_folder_privacy(logs / folder)
                    os.close(create_file(log))
            return destinations

    return PrivateLogsSpecs(log_dir=str(logs), redirects=Std.ALL)


def root_cause(error) -> tuple[int, str, str, int]:
    """The rank whose failure brought the others down: (rank, message, traceback, exit code).

    When one rank fails, the launcher stops the rest with SIGTERM, and ranks blocked in a collective
    fail on the lost peer, by an error that says so or by SIGABRT (gloo's C++ aborts a rank whose peer went:
    "gloo::EnforceNotMet ... Connection reset by peer"); those are effects, and a rank's own error wins over
    them even where the launcher saw them first. Of the others, the earliest (then the lowest rank) wins.
    """
    def describe(rank: int, failure) -> tuple[int, str, str, int]:
        data = failure.message
        text = data.get("message", "") if isinstance(data, dict) else str(data)
        trace = data.get("extraInfo", {}).get("py_callstack", "") if isinstance(data, dict) else ""
        if failure.exitcode < 0:
            return rank, f"rank {rank} was killed by signal {-failure.exitcode} ({failure.signal_name()})", "", failure.exitcode
        if not trace:
            text = f"exited with code {failure.exitcode}"
        return rank, f"rank {rank} failed: {text}", trace, failure.exitcode

    described = [describe(rank, failure) for rank, failure in error.failures.items()]

    def is_effect(item: tuple[int, str, str, int]) -> bool:
        return item[3] in (-signal.SIGTERM, -signal.SIGABRT) or bool(_PEER_LOST.search(item[1]))

    timestamps = {rank: failure.timestamp for rank, failure in error.failures.items()}
    return min(described, key=lambda item: (is_effect(item), timestamps[item[0]], item[0]))


def terminate_ranks() -> None:
    """Kill this process's rank children, and wait up to a grace period for them to go: no rank outlives its run. Not
    SIGTERM: a rank takes that as a scheduler's warning, to stop at its next boundary with a checkpoint
    (core/engine/parallel/preemption.py), and this is the supervisor leaving at once (a second Ctrl-C)."""
    me = psutil.Process()
    ranks = []
    for child in me.children(recursive=True):
        try:
            if RANK_MODULE in " ".join(child.cmdline()):
                ranks.append(child)
        except psutil.Error:
            continue
    for process in ranks:
        try:
            process.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(ranks, timeout=TERMINATE_GRACE_S)
