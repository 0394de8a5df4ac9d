"""Notices cover no data: an acknowledgement is a line of the event log, and a view that covers the log shows it in
its frame's border. Textual's toasts were drawn over the gradient table's module names and the system view's lines."""

from __future__ import annotations

import pytest
from fake_link import FakeLink, quiet_app, telemetry, training_events
from textual.geometry import Region

from torchlab.tui.widgets.event_log import EventLog
from torchlab.tui.widgets.grad_table import GradTable
from torchlab.tui.widgets.system_panel import SystemPanel

SMALL = (80, 24)


def screen_rows(app) -> list[str]:
    return [strip.text for strip in app.screen._compositor.render_strips()]


def text_in(app, region: Region) -> list[str]:
    """What the screen shows inside ``region``, a row of text per row of it."""
    return [row[region.x : region.right] for row in screen_rows(app)[region.y : region.bottom]]


async def answer(app, pilot) -> None:
    app.poll_now()
    await pilot.pause()
    await pilot.pause()  # what a notification mounts, mounted


@pytest.mark.parametrize("size", [SMALL, (160, 48)])
async def test_an_acknowledgement_leaves_the_gradient_table_as_it_was_and_is_the_event_logs_newest_line(size) -> None:
    """At 80x24 ``accum = 2 applied at step 121`` was drawn over the gradient table's module names; at the bottom,
    toasts had covered the newest lines of the event log."""
    link = FakeLink(training_events(120) + [telemetry()])
    app = quiet_app(link)
    async with app.run_test(size=size, notifications=True) as pilot:
        await answer(app, pilot)
        grads = app.query_one(GradTable).region
        before, header = text_in(app, grads), screen_rows(app)[:2]
        await pilot.press("m", "2", "enter")
        await answer(app, pilot)
        assert "accum = 2 applied at step 121" in app.query_one(EventLog).lines_written[-1]
        assert text_in(app, grads) == before and screen_rows(app)[:2] == header
        events = app.query_one(EventLog).region
        said = [row for row in screen_rows(app) if "accum = 2 applied" in row]
        assert said and all(events.y <= screen_rows(app).index(row) < events.bottom for row in said)


async def test_on_the_system_view_a_notice_stands_in_its_border_and_its_lines_stay() -> None:
    """On the system view (``t``, which covers the event log) the toast covered its lines: the notice is now in the
    view's bottom border, and in the log for when the view closes."""
    link = FakeLink(training_events(120) + [telemetry()])
    app = quiet_app(link)
    async with app.run_test(size=SMALL, notifications=True) as pilot:
        await answer(app, pilot)
        await pilot.press("m", "2", "enter", "t")  # the answer comes once the view is open
        await pilot.pause()
        panel = app.screen.query_one(SystemPanel).region
        before = text_in(app, panel)
        await answer(app, pilot)
        assert text_in(app, panel) == before
        frame = app.screen.query_one("#view").region
        bottom_border = screen_rows(app)[frame.bottom - 1]
        assert "✓ accum = 2 applied at step 121" in bottom_border
        assert not any("accum = 2" in row for row in screen_rows(app)[frame.y : frame.bottom - 1])
        app.screen._end_notice()  # as its timer does
        await pilot.pause()
        assert "accum" not in screen_rows(app)[frame.bottom - 1]
        await pilot.press("escape")
        await pilot.pause()
        assert "accum = 2 applied at step 121" in app.query_one(EventLog).lines_written[-1]
