"""The journal's limit on refused lines: a burst per window, and a count of what it held back."""

from __future__ import annotations

from metrics_rows import metrics_row
from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.wire.observer import TrainerObserver
from torchlab.core.wire.protocol import OptionApplied, OptionRefused, TrialResult
from torchlab.core.wire.throttle import RefusedCommands, Throttle, refuses_a_command


def test_a_burst_per_window_then_the_count_of_what_was_held_back():
    now = [0.0]
    throttle = Throttle(burst=3, window_s=60.0, clock=lambda: now[0])
    assert [throttle.admit() for _ in range(5)] == [0, 0, 0, None, None]
    now[0] = 59.0
    assert throttle.admit() is None
    now[0] = 60.0  # a new window: the first record through carries the three held back
    assert [throttle.admit() for _ in range(4)] == [3, 0, 0, None]


def test_flush_gives_what_is_left_to_count_at_the_end():
    throttle = Throttle(burst=1, window_s=60.0, clock=lambda: 0.0)
    assert [throttle.admit() for _ in range(4)] == [0, None, None, None]
    assert throttle.flush() == 3 and throttle.flush() == 0


class Journal(TrainerObserver):
    def __init__(self) -> None:
        self.records: list[dict] = []
        self.metrics: list[MetricsRow] = []

    def on_event(self, event):
        self.records.append(event.journal_record())

    def on_metrics(self, row):
        self.metrics.append(row)


def test_refused_commands_reach_the_journal_by_the_rule_of_refused_lines():
    """The trainer's refusals of a peer's commands (an unknown option, a trial it cannot run) went to the journal
    each time; other events, and every report, go as they are."""
    journal = Journal()
    throttled = RefusedCommands(journal)
    for step in range(5000):
        throttled.on_event(OptionRefused(option=f"nope{step}", value=1, reason="unknown option", step=step))
        throttled.on_event(TrialResult(step=step, option="nope", value=1, steps=5, arms=[], error="unknown option"))
    throttled.on_event(OptionApplied(option="clip", value=0.5, previous=None, step=5000))
    throttled.on_metrics(metrics_row(5000))
    throttled.close(step=5001)

    burst = Throttle().burst
    assert [r["event"] for r in journal.records] == ["option_refused", "trial_result"] * (burst // 2) + [
        "option_applied", "lines_refused_unrecorded"]
    assert journal.records[-1] == {**journal.records[-1], "channel": "commands", "count": 2 * 5000 - burst, "step": 5001}
    assert journal.metrics == [metrics_row(5000)]
    finished = TrialResult(step=1, option="clip", value=0.5, steps=5, arms=[])
    assert refuses_a_command(OptionRefused(option="x", value=1, reason="r", step=1)) and not refuses_a_command(finished)


def test_the_count_of_held_back_commands_comes_before_the_next_one_let_through():
    now = [0.0]
    journal = Journal()
    throttled = RefusedCommands(journal)
    throttled._refusals.throttle = Throttle(burst=1, window_s=60.0, clock=lambda: now[0])
    for step in (1, 2, 3):
        throttled.on_event(OptionRefused(option="nope", value=1, reason="unknown option", step=step))
    now[0] = 60.0
    throttled.on_event(OptionRefused(option="nope", value=1, reason="unknown option", step=4))
    throttled.close(step=4)
    assert [(r["event"], r["step"], r.get("count")) for r in journal.records] == [
        ("option_refused", 1, None), ("lines_refused_unrecorded", 4, 2), ("option_refused", 4, None)]


def test_the_journal_behind_the_throttle_gets_every_call_an_observer_takes_before_checkpoint_too():
    """Found by the combination matrix (app_error_restart): RefusedCommands took ``before_checkpoint`` as the
    observer's default, nothing, so the app's trainer process never told its run directory to write the rows it held
    before a checkpoint landed; a kill then lost the rows of steps 7 and 8 that ``last.pt`` (step 8) held, for good.
    Every call a TrainerObserver takes is passed on: a call added to the base is one to pass on here too."""
    calls = [name for name in vars(TrainerObserver) if not name.startswith("_")]
    assert set(calls) <= set(vars(RefusedCommands)), set(calls) - set(vars(RefusedCommands))

    class Spy(Journal):
        def before_checkpoint(self, step):
            self.records.append({"before_checkpoint": step})

    journal = Spy()
    RefusedCommands(journal).before_checkpoint(8)
    assert journal.records == [{"before_checkpoint": 8}]
