"""The workload's own metrics and parameter groups in the app's charts (issue 15), driven by a FakeLink."""

from __future__ import annotations

import pytest

from fake_link import FakeLink, quiet_app, record, training_events

from torchlab.core.wire import protocol
from torchlab.tui.widgets.event_log import EventLog
from torchlab.tui.widgets.line_chart import LineChart


def own_rows(first: int, last: int, *, evaluate_at: int | None = None, name: str = "accuracy",
             val_name: str = "accuracy") -> protocol.Metrics:
    rows = []
    for step in range(first, last + 1):
        evaluated = {"val_metrics": {val_name: 0.5}} if step == evaluate_at else {}
        rows.append(record(step, lrs={"body": 0.05 - step * 1e-4, "head": 0.2 - step * 4e-4}, metrics={name: step / 200}, **evaluated))
    return protocol.Metrics.from_rows(rows)


def lines(app, chart_id: str) -> list[str]:
    return [line.label for line in app.query_one(f"#{chart_id}", LineChart).lines]


@pytest.mark.parametrize("name, val_name, shown", [
    ("accuracy", "accuracy", "val accuracy"),
    ("train_acc", "val_acc", "val_acc"),  # a LightningModule's names, as it logged them (issue 45): not "val train_acc"
])
async def test_each_groups_lr_is_a_line_and_the_first_metric_takes_the_third_chart_with_its_validation(name, val_name, shown) -> None:
    link = FakeLink(training_events(20) + [own_rows(21, 60, evaluate_at=50, name=name, val_name=val_name)])
    app = quiet_app(link)
    async with app.run_test(size=(160, 48)) as pilot:
        app.poll_now()
        await pilot.pause()
        assert lines(app, "lr-chart") == ["body", "head"]
        assert "body" in str(app.query_one("#lr-chart").border_title) and "head" in str(app.query_one("#lr-chart").border_title)
        assert lines(app, "speed-chart") == [name, shown]
        assert list(app.run_state.workload_metrics) == [name]
        accuracy, val_accuracy = app.run_state.workload_metrics[name]
        assert accuracy.last == pytest.approx(60 / 200) and len(accuracy) == 40 and val_accuracy.last == 0.5
        assert app.run_state.group_lrs["head"].last == pytest.approx(0.2 - 60 * 4e-4)
        from torchlab.tui.widgets.stats_bar import StatsBar

        assert f"{name} 0.3" in str(app.query_one(StatsBar).content)  # its newest figure, beside the loss
        await pilot.press("f")  # back to samples/s, then the metric again
        assert lines(app, "speed-chart") == ["samples/s"]
        await pilot.press("f")
        assert lines(app, "speed-chart") == [name, shown]


async def test_without_metrics_the_charts_are_as_before_and_f_says_how_to_get_some() -> None:
    link = FakeLink(training_events(30))
    app = quiet_app(link)
    async with app.run_test(size=(80, 24)) as pilot:
        app.poll_now()
        await pilot.pause()
        assert lines(app, "lr-chart") == ["lr"] and lines(app, "speed-chart") == ["samples/s"]
        await pilot.press("f")
        assert lines(app, "speed-chart") == ["samples/s"]
        assert any("return {\"loss\": ..., \"accuracy\": ...}" in line for line in app.query_one(EventLog).lines_written)
        assert any("no workload metrics" in str(toast.message) for toast in app._notifications)


async def test_a_change_of_steps_moves_the_headers_total_and_its_percentage() -> None:
    from torchlab.tui.widgets.run_header import RunHeader

    applied = protocol.OptionApplied(step=21, option="steps", value=500, previous=200, display="500", source="app")
    app = quiet_app(FakeLink(training_events(20) + [applied]))
    async with app.run_test(size=(80, 24)) as pilot:
        app.poll_now()
        await pilot.pause()
        assert "step 20/500 4%" in str(app.query_one(RunHeader).content)


async def test_on_a_short_screen_the_workloads_metric_takes_the_lr_charts_place() -> None:
    app = quiet_app(FakeLink(training_events(20) + [own_rows(21, 40)]))
    async with app.run_test(size=(80, 24)) as pilot:
        app.poll_now()
        await pilot.pause()
        assert app.query_one("#speed-chart").display and not app.query_one("#lr-chart").display
        await pilot.press("f")  # samples/s: the LR chart is back, as without metrics
        await pilot.pause()
        assert app.query_one("#lr-chart").display and not app.query_one("#speed-chart").display


async def test_without_colour_each_line_of_a_chart_has_its_own_marker_and_its_title_names_it(monkeypatch) -> None:
    """Under NO_COLOR the LR groups, the loss and val loss, a metric and its validation were lines of the same grey,
    told apart by a colour the terminal does not show (and the app stopped: a chart's blank cells had no style,
    which the monochrome filter cannot take)."""
    from torchlab.tui.widgets.line_chart import marker

    monkeypatch.setenv("NO_COLOR", "1")
    link = FakeLink(training_events(20) + [own_rows(21, 120, evaluate_at=100)])
    app = quiet_app(link)
    async with app.run_test(size=(160, 48)) as pilot:
        app.poll_now()
        await pilot.pause()
        assert app.no_color
        first, second = marker(0), marker(1)
        for chart_id, names in (("lr-chart", ("body", "head")), ("loss-chart", ("loss", "val loss")),
                                ("speed-chart", ("accuracy", "val accuracy"))):
            chart = app.query_one(f"#{chart_id}", LineChart)
            title = chart.border_title.plain if hasattr(chart.border_title, "plain") else str(chart.border_title)
            assert f"{first} {names[0]}" in title and f"{second} {names[1]}" in title, title
            plot = "".join(chart.render_line(y).text for y in range(chart.size.height))
            assert first in plot and second in plot, (chart_id, plot)
        await pilot.press("f")  # one line, samples/s: nothing to tell apart, no marker
        speed = app.query_one("#speed-chart", LineChart)
        await pilot.pause()
        assert not {first, second} & set("".join(speed.render_line(y).text for y in range(speed.size.height)))


async def test_the_loss_chart_names_a_validation_line_once_there_is_one() -> None:
    """A run without a validation set (or before its first evaluation) has no val loss: the title does not name one."""
    rows = [record(step, val_loss=None) for step in range(1, 30)]
    link = FakeLink(training_events(0) + [protocol.Metrics.from_rows(rows)])
    app = quiet_app(link)
    async with app.run_test(size=(120, 32)) as pilot:
        app.poll_now()
        await pilot.pause()
        title = str(app.query_one("#loss-chart").border_title)
        assert "loss" in title and "val loss" not in title
        link.push(protocol.Metrics.from_rows([record(30, val_loss=1.5)]))
        app.poll_now()
        await pilot.pause()
        assert "val loss" in str(app.query_one("#loss-chart").border_title)
