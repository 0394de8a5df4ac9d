"""Never a row of a step a checkpoint holds is lost to a kill (issue 46, item 11): the rows of the steps up to a
checkpoint are in ``metrics.jsonl`` before the checkpoint is written, however the run reports.

A resume trains only the steps after ``last.pt``'s, so a row still held in memory when the checkpoint's rename
landed was lost for good by a ``kill -9`` then: seen once in 22 kills as seven rows (``last.pt`` at 231,
``metrics.jsonl`` ending at 224, a checkpoint every 7 steps), and by benchmarks/stress_kills.py in one kill of
five. These tests look at the file at the moment the checkpoint is written, so they need no kill and no timing:
the run directory is made to hold every row it may (as it does while steps come fast) until something makes it
write them.
"""

from __future__ import annotations

import json

import pytest

from metrics_rows import metrics_row
from trainers import TINY
from torchlab.core.engine import checkpointer
from torchlab.core.engine.ranks import channel as rc
from torchlab.core.engine.ranks.supervisor import Supervisor
from torchlab.core.records import rundir
from torchlab.core.errors import StorageError
from torchlab.core.records.config import build_config
from torchlab.core.wire.observer import TrainerObserver


@pytest.fixture
def rows_held_until_asked(monkeypatch):
    """Rows held as while steps come faster than ``ROWS_WRITTEN_AT_ONCE_BELOW_S`` apart, with no limit of time or
    number: only an event line, a checkpoint's ``before_checkpoint`` or the close writes them."""
    monkeypatch.setattr(rundir, "ROWS_WRITTEN_AT_ONCE_BELOW_S", float("inf"))
    monkeypatch.setattr(rundir, "HELD_FOR_S", float("inf"))
    monkeypatch.setattr(rundir, "HELD_ROWS", 10**9)


@pytest.fixture
def rows_when_checkpointed(monkeypatch):
    """``{step of a checkpoint: the steps of metrics.jsonl's rows as its write began}``."""
    seen: dict[int, list[int]] = {}
    write = checkpointer.write_checkpoint

    def looking_first(directory, step, state, keep):
        metrics = directory.parent / "metrics.jsonl"
        seen[step] = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
        return write(directory, step, state, keep)

    monkeypatch.setattr(checkpointer, "write_checkpoint", looking_first)
    return seen


def test_the_rows_up_to_a_checkpoint_are_written_before_it_in_a_headless_or_app_run(tmp_path, rows_held_until_asked,
                                                                                     rows_when_checkpointed):
    """Through the Supervisor, as ``--headless`` and the app's trainer process run at world size 1: its relay to the
    run directory passed on every row and event but not ``before_checkpoint``, so the rows since the last event
    line (the checkpoint before, at the next step) were still held when the checkpoint of 7 and 14 was written."""
    run = tmp_path / "run"
    directory = rundir.RunDirectory(run)
    config = build_config({"workload": TINY, "steps": 15, "checkpoint_every": 7, "telemetry_interval": 0}, {})
    try:
        Supervisor(config, observers=[directory], run_dir=directory.path).run()
    finally:
        directory.close()
    assert rows_when_checkpointed == {7: list(range(1, 8)), 14: list(range(1, 15)), 15: list(range(1, 16))}


class RowsAtCheckpoint(TrainerObserver):
    """The supervisor's observers, as the run directory takes them: the steps of the rows received, and at each
    ``before_checkpoint`` the step and the rows received by then."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.checkpoints: list[tuple[int, list[int]]] = []

    def on_metrics(self, row) -> None:
        self.rows.append(row.step)

    def before_checkpoint(self, step: int) -> None:
        self.checkpoints.append((step, list(self.rows)))


class Trainer:
    """What the link takes commands for."""

    def submit(self, command) -> None:
        pass

    def request_stop(self, reason: str) -> None:
        pass


def test_with_ranks_rank_0_writes_a_checkpoint_only_once_the_supervisor_has_written_the_rows_before_it():
    """With ranks, rank 0 writes the checkpoint and the supervisor's process writes the rows it sends: rank 0's
    ``before_checkpoint`` went nowhere, so the supervisor could still hold them (or not have read them yet) when the
    checkpoint's rename landed. It now returns once the supervisor says it wrote them."""
    written = RowsAtCheckpoint()
    channel = rc.RankChannel(written, step=lambda: 0)
    link = rc.SupervisorLink(channel.path, channel.token)
    link.attach(Trainer())
    try:
        for step in (1, 2, 3):
            link.on_metrics(metrics_row(step))
        link.before_checkpoint(3)
        assert written.checkpoints == [(3, [1, 2, 3])]
    finally:
        link.close()
        channel.close()


def test_rank_0_writes_no_checkpoint_whose_rows_the_supervisor_could_not_write():
    class FullDisk(RowsAtCheckpoint):
        def before_checkpoint(self, step: int) -> None:
            raise StorageError("no space left on device writing metrics.jsonl in runs/x; its lines before this one are whole")

    channel = rc.RankChannel(FullDisk(), step=lambda: 0)
    link = rc.SupervisorLink(channel.path, channel.token)
    link.attach(Trainer())
    try:
        with pytest.raises(StorageError, match="^no space left on device writing metrics.jsonl"):
            link.before_checkpoint(3)
    finally:
        link.close()
        channel.close()
