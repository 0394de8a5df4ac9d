"""Which rank's failure the supervisor reports (core/engine/ranks/launcher.py ``root_cause``): the one that brought the others
down, not a rank that died of it."""

from __future__ import annotations

import json
import signal

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from torchlab.core.engine.ranks.launcher import root_cause


def failure(tmp_path, rank: int, exitcode: int, timestamp: int, message: str | None = None) -> ProcessFailure:
    error_file = tmp_path / f"error-{rank}.json"
    if message is not None:  # what @record writes for a Python exception
        error_file.write_text(json.dumps({"message": {"message": message, "extraInfo": {
            "py_callstack": f"Traceback ...\n{message}\n", "timestamp": str(timestamp)}}}))
    failed = ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=exitcode, error_file=str(error_file))
    failed.timestamp = timestamp
    return failed


def test_a_rank_gloo_aborted_when_its_peer_went_is_an_effect_even_if_the_launcher_saw_it_first(tmp_path):
    """CI saw it: rank 1 ran out of memory in a trial's arm; rank 0, inside the step's collective, was aborted by
    gloo (SIGABRT) a moment before rank 1's error was recorded, and the run said "rank 0 was killed by signal 6"."""
    aborted = failure(tmp_path, 0, -signal.SIGABRT, timestamp=100)
    cause = failure(tmp_path, 1, 1, timestamp=101, message="TrialOutOfMemory: out of memory in a trial's arm")
    rank, message, trace, _ = root_cause(ChildFailedError("ranks", {0: aborted, 1: cause}))
    assert rank == 1 and message.startswith("rank 1 failed: TrialOutOfMemory") and "Traceback" in trace


def test_a_rank_aborted_alone_is_still_the_cause(tmp_path):
    rank, message, _, exitcode = root_cause(ChildFailedError("ranks", {1: failure(tmp_path, 1, -signal.SIGABRT, 100)}))
    assert (rank, exitcode) == (1, -signal.SIGABRT) and message == "rank 1 was killed by signal 6 (SIGABRT)"
