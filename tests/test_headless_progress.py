"""The headless progress bar's figures."""

from __future__ import annotations

import io

import pytest

from rich.console import Console

from torchlab.core.launch.headless import HeadlessProgress


def row(step: int, step_time_s: float, batch: int = 32) -> dict:
    return {"step": step, "loss": 2.0, "step_time_s": step_time_s, "samples_per_s": batch / step_time_s}


def test_the_rate_is_smoothed_over_steps_so_one_slow_step_does_not_read_as_the_speed():
    progress = HeadlessProgress(100, Console(file=io.StringIO()))
    rates = [progress.rate(row(step, 0.010)) for step in range(1, 21)]
    assert rates[-1] == pytest.approx(3200)  # steady: the rate of every step
    after_hiccup = progress.rate(row(21, 1.0))  # one step of a second (a checkpoint, a busy neighbour)
    assert 250 < after_hiccup < 400  # the average step is now ~0.11 s; one step's own rate would read 32
    recovering = [progress.rate(row(step, 0.010)) for step in range(22, 100)]
    assert recovering[-1] > 3000  # back to the speed it trains at
