"""The headless progress bar's figures."""

from __future__ import annotations

import io
import time

import pytest

from rich.console import Console

from metrics_rows import metrics_row
from torchlab.core.launch.headless import HeadlessProgress
from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.wire.events import RunStarted


def row(step: int, step_time_s: float, batch: int = 32, **given) -> MetricsRow:
    return metrics_row(step, loss=2.0, lr=1e-3, step_time_s=step_time_s, samples_per_s=batch / step_time_s, **given)


def test_the_rate_is_smoothed_over_steps_so_one_slow_step_does_not_read_as_the_speed():
    progress = HeadlessProgress(100, Console(file=io.StringIO()))
    rates = [progress.rate(row(step, 0.010)) for step in range(1, 21)]
    assert rates[-1] == pytest.approx(3200)  # steady: the rate of every step
    after_hiccup = progress.rate(row(21, 1.0))  # one step of a second (a checkpoint, a busy neighbour)
    assert 250 < after_hiccup < 400  # the average step is now ~0.11 s; one step's own rate would read 32
    recovering = [progress.rate(row(step, 0.010)) for step in range(22, 100)]
    assert recovering[-1] > 3000  # back to the speed it trains at


def frame(progress: HeadlessProgress, width: int) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    with console.capture() as captured:
        console.print(progress._live.renderable)
    return captured.get()


@pytest.mark.parametrize("width", [120, 80, 50])
def test_the_bar_is_one_line_at_any_width_with_the_figures_of_the_last_row(width):
    progress = HeadlessProgress(1000, Console(file=io.StringIO()))
    progress.on_event(RunStarted(step=0, device="cpu", batch_size=32, steps=1000, options={}, modules=[], module_params=[],
                                 checkpoint_blocks=[], world_size=1, ranks=None))
    for step in range(1, 341):
        progress.on_metrics(row(step, 0.010))
    line = frame(progress, width)
    assert line.count("\n") == 1 and len(line.rstrip("\n")) <= width
    assert line.startswith("training on cpu")
    if width >= 80:
        assert " 340/1000 loss 2.0000 3,200 samples/s " in line
        assert "━" in line  # the bar itself, narrowed to fit


def test_the_time_left_is_the_steps_to_go_at_the_pace_of_the_frames_so_far(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    progress = HeadlessProgress(1000, Console(file=io.StringIO()))
    assert frame(progress, 120).rstrip().endswith("0:00:00 -:--:--")  # no pace yet
    for step in range(1, 101):
        progress.on_metrics(row(step, 0.010))
    clock[0] += 10.0  # 100 steps in 10 s: 900 to go take 90 s
    frame(progress, 120)
    assert frame(progress, 120).rstrip().endswith("0:00:10 0:01:30")


def test_through_a_pipe_a_training_line_is_printed_every_ten_seconds_and_at_the_end(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    progress = HeadlessProgress(30, Console(file=out, width=200))  # a file: no terminal, no bar
    assert progress.prints_lines
    for step in range(1, 31):
        progress.on_metrics(row(step, 0.5, metrics={"accuracy": step / 40}, grad_norm_total=0.8771 if step % 4 == 0 else None))
        clock[0] += 0.5  # 2 steps a second: a line at steps 1, 21 and the last
    lines = out.getvalue().splitlines()
    assert [line.split(":")[0] for line in lines] == ["step 1/30", "step 21/30", "step 30/30"]
    assert lines[1] == "step 21/30: loss 2.0000, lr 0.001, 64 samples/s, grad norm 0.877, accuracy 0.525"
    assert "grad norm" not in lines[0]  # not measured yet: not made up
    assert progress.training_line(row(31, 0.5, lrs={"body": 0.05, "head": 0.2})).startswith(
        "step 31/30: loss 2.0000, lr body 0.05 head 0.2, ")


def test_on_a_terminal_the_bar_says_it_all_and_no_lines_are_printed():
    out = io.StringIO()
    progress = HeadlessProgress(30, Console(file=out, force_terminal=True))
    for step in range(1, 31):
        progress.on_metrics(row(step, 0.5))
    assert not progress.prints_lines and out.getvalue() == ""
