"""What torch.compile did, in the app against a FakeLink: the log says each report; ``K`` shows the breaks at their
lines with their code and hint, the recompiles with the guard that failed, and what compiling bought (the impact
row of compile's segment); at 80x24."""

from __future__ import annotations

import dataclasses

from textual.widgets import Label

from fake_link import FakeLink, impact, quiet_app
from torchlab.core.wire import protocol
from torchlab.core.wire.compile_report import CompileReport, GraphBreak, Recompile
from torchlab.tui.screens.compile_screen import CompileScreen
from torchlab.tui.widgets.event_log import EventLog

REPORT = CompileReport(step=41, compile_s=12.5, graphs=3, recompile_limit=8, watch_s=0.004, breaks=[
    GraphBreak("/home/me/model.py", 17, "if h.mean() > 0.5:", "Data-dependent branching",
               "Detected data-dependent branching", "consider making the code branchless", count=2)],
    recompiles=[Recompile("forward", "/home/me/model.py", 12, "tensor 'tokens' size mismatch at index 1. expected 16, "
                          "actual 12", count=1, compiled=2)],
    eager_ops=2, graphs_run=3, eager_most=["aten::is_nonzero x2"])


def screen_text(app) -> str:
    """What the terminal shows, as text, each line without the view's frame."""
    return "\n".join(strip.text.strip("│ ") and strip.text[2:].rstrip(" │") for strip in app.screen._compositor.render_strips())


async def test_the_compile_view_names_each_break_and_recompile_and_what_compiling_bought():
    link = FakeLink()
    app = quiet_app(link)
    async with app.run_test(size=(80, 24)) as pilot:
        app.poll_now()
        await pilot.pause()
        await pilot.press("K")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, CompileScreen)
        assert "Nothing compiled" in str(screen.query_one("#compile-status", Label).render())
        start, bf16 = impact().segments[:2]
        compiled = dataclasses.replace(bf16, change="compile=on", verdict="compile=on: 1.72x faster; compiled in 12.5 s, "
                                       "saves 7.2 ms a step: pays back at step 1,857 of 2,000")
        link.push(REPORT)
        link.push(protocol.Impact(segments=[start, compiled]))
        app.poll_now()
        await pilot.pause()
        status = str(screen.query_one("#compile-status", Label).render())
        assert status.startswith("compile ") and "3 graphs, 12.5 s compiling (as of step 41" in status
        body = screen_text(app)
        wrapped, body = body, " ".join(body.split())  # what a line says, wherever the terminal wrapped it
        assert "pays back at step 1,857 of 2,000" in body
        assert "me/model.py:17 Data-dependent branching (2 compiles met it)" in body and "if h.mean() > 0.5:" in body
        assert "hint: consider making the code branchless" in body
        assert "forward (me/model.py:12) 1x, 2 graphs now" in body and "guard failed: tensor 'tokens' size mismatch" in body
        assert "eager between graphs: a forward runs 3 graphs and 2 ops eagerly between them (aten::is_nonzero x2)" in body
        assert "\n    actual 12" in wrapped  # a wrapped line stays under its entry
        await pilot.press("K")
        await pilot.pause()
        said = [line for line in app.query_one(EventLog).lines_written if "torch.compile: 3 graphs" in line]
        assert len(said) == 1 and "me/model.py:17 data-dependent branching" in said[0]
