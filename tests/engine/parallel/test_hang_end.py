"""A hang, ended as the user chooses (core/engine/parallel/hang_watch.py): once a step is said to hang, rank 0's watch
ends the run for a stop asked then (no boundary will come to take it), or at once under ``--on-hang end``; with no
stop asked the run waits, and a step that ends after all is no hang to end. The watch's own thread, its real clock:
the hang's floor lowered to a fraction of a second."""

from __future__ import annotations

import threading

import pytest

from torchlab.core.engine.parallel import hang_watch
from torchlab.core.engine.parallel.hang_watch import KNOWN_AFTER, HangWatch


@pytest.fixture(autouse=True)
def quick_hangs(monkeypatch):
    monkeypatch.setattr(hang_watch, "HANG_MIN_S", 0.2)
    monkeypatch.setattr(hang_watch, "POLL_S", 0.01)


class Run:
    """What the trainer gives the watch: the stop asked (set by the test), and the hang said and the run ended."""

    def __init__(self) -> None:
        self.asked: str | None = None
        self.said = threading.Event()
        self.ended: list[tuple[int, str]] = []
        self.done = threading.Event()

    def watch(self, folder, *, ends_at_once: bool = False, rank: int = 0) -> HangWatch:
        watch = HangWatch(rank, 1, folder, 2.0, lambda *_: self.said.set(), stop_asked=lambda: self.asked,
                          end=self.end, ends_at_once=ends_at_once)
        for step in range(1, KNOWN_AFTER + 1):  # the usual step: known
            watch.step_started(step)
            watch.step_ended(0.001)
        return watch

    def end(self, step: int, reason: str) -> None:
        self.ended.append((step, reason))
        self.done.set()


def test_a_stop_asked_while_a_step_hangs_ends_the_run_and_none_asked_waits(tmp_path):
    run = Run()
    watch = run.watch(tmp_path)
    watch.step_started(6)
    assert run.said.wait(10)
    assert not run.done.wait(0.3) and run.ended == []  # said, and waiting: no stop asked
    run.asked = "stopped from the app"
    assert run.done.wait(10) and run.ended == [(6, "stopped from the app")]


def test_on_hang_end_ends_the_run_once_the_hang_is_said(tmp_path):
    run = Run()
    run.watch(tmp_path, ends_at_once=True).step_started(6)
    assert run.done.wait(10) and run.ended == [(6, "--on-hang end")] and run.said.is_set()


def test_a_step_that_ends_after_its_hang_was_said_is_not_ended_by_a_later_stop(tmp_path):
    run = Run()
    watch = run.watch(tmp_path)
    watch.step_started(6)
    assert run.said.wait(10)
    watch.step_ended(5.0)  # the slow node caught up: its boundary takes any stop
    run.asked = "stopped from the app"
    assert not run.done.wait(0.3) and run.ended == []


def test_another_rank_leaves_for_a_signal_during_its_hang_but_leaves_on_hang_end_to_rank_0(tmp_path):
    """Rank 0 ends the run and journals it; a rank but 0 under ``--on-hang end`` waits for its launcher, which ends it,
    and a stop a signal asked of it (torchrun's agent ending the ranks) makes it leave at once."""
    run = Run()
    watch = run.watch(tmp_path, ends_at_once=True, rank=1)
    watch.step_started(6)
    assert not run.done.wait(hang_watch.HANG_MIN_S + 0.5) and run.ended == []
    run.asked = "SIGTERM to rank 1: every rank stops"
    assert run.done.wait(10) and run.ended == [(6, "SIGTERM to rank 1: every rank stops")]
