"""The event log after the terminal shrinks: its newest lines in view, wrapped to the new width."""

from __future__ import annotations

from fake_link import FakeLink, quiet_app, training_events

from torchlab.core.wire import protocol
from torchlab.tui.widgets.event_log import EventLog


async def test_shrinking_the_terminal_keeps_the_newest_lines_in_view_at_the_new_width() -> None:
    """From 200x50 to 80x24 the log showed old lines, cut at the old width, for more than 15 s."""
    link = FakeLink(training_events(120))
    app = quiet_app(link)
    async with app.run_test(size=(200, 50)) as pilot:
        for step in range(40):
            link.push(protocol.Log(level="info", text=f"line {step}: a trainer's warning long enough to need a second row "
                                                      "at eighty columns, and more words after it", step=step))
        app.poll_now()
        await pilot.pause()
        log = app.query_one(EventLog)
        assert log.is_vertical_scroll_end
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        await pilot.pause()
        assert log.virtual_size.width <= log.scrollable_content_region.width  # wrapped again, nothing cut off
        assert log.is_vertical_scroll_end, (log.scroll_y, log.max_scroll_y)
        bottom = "".join(segment.text for segment in log.render_line(log.scrollable_content_region.height - 1))
        assert "more words after it" in bottom or "line 39" in bottom, bottom
