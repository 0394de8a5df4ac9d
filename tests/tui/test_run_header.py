"""The header between reports: its clock runs on, and it says when the trainer compiles instead of training."""

from __future__ import annotations

from fake_link import FakeLink, quiet_app, record, training_events

from torchlab.core.wire import protocol
from torchlab.core.wire.events import COMPILING
from torchlab.tui.widgets.run_header import RunHeader


def header_text(app) -> str:
    return str(app.query_one(RunHeader).content)


async def test_the_elapsed_time_runs_on_between_reports() -> None:
    """During a trial no report came for three minutes: the header held "elapsed 3:22", then jumped."""
    app = quiet_app(FakeLink(training_events(120)))  # the last report: 3.4 s of training
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.pause()
        assert "elapsed 0:03" in header_text(app)
        app.run_state.clock = lambda: 180.0  # three minutes later, and no report since
        await pilot.pause(RunHeader.TICK_S * 1.5)  # the header's own timer, not a report, redraws it
        assert "elapsed 3:03" in header_text(app)


async def test_a_paused_runs_clock_stands_still() -> None:
    link = FakeLink([*training_events(120), protocol.State("paused", 120)])
    app = quiet_app(link)
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.pause()
        app.run_state.clock = lambda: 180.0
        await pilot.pause(RunHeader.TICK_S * 1.5)
        assert "elapsed 0:03" in header_text(app)


async def test_the_header_says_compiling_while_torch_compile_runs() -> None:
    """A 70 s compile showed "● running" throughout."""
    link = FakeLink(training_events(120))
    app = quiet_app(link)
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.pause()
        link.push(protocol.State("running", 120, COMPILING))
        app.poll_now()
        await pilot.pause()
        assert "◌ compiling…" in header_text(app) and "● running" not in header_text(app)
        link.push(protocol.OptionApplied("compile", True, False, 121, "app"), protocol.State("running", 120))
        app.poll_now()
        await pilot.pause()
        assert "● running" in header_text(app) and "compiling" not in header_text(app)


def test_the_trainer_side_says_compiling_until_the_change_is_answered() -> None:
    """What the header's "compiling…" comes from: the worker's running state carries it from the trainer's
    CompileStarted to the answer to the change that asked for the compile."""
    from torchlab.core.launch.outbox_reporter import OutboxReporter
    from torchlab.core.wire.events import CompileStarted
    from torchlab.core.wire.outbox import Cursor, Outbox

    outbox = Outbox()
    reporter = OutboxReporter(outbox)
    reporter.set_state("running", 5)
    reporter.on_event(CompileStarted(step=6, detail="with amp=bf16"))
    reporter.on_event(protocol.OptionApplied("amp", "bf16", "off", 6, "app"))
    states = [(m.state, m.step, m.detail) for m in outbox.take_past(Cursor()) if isinstance(m, protocol.State)]
    assert states == [("running", 5, ""), ("running", 5, COMPILING), ("running", 5, "")]


async def test_the_header_says_eta_pending_until_enough_steps_were_measured() -> None:
    """``ETA 7:34`` at step 1 of a ~20 s run: the first step's start-up, taken for every step left. Now "ETA …" until
    the ETA can be estimated, then the estimate."""
    from torchlab.tui.state_figures import ETA_MIN_STEPS

    link = FakeLink(training_events(1))
    app = quiet_app(link)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert header_text(app).rstrip().endswith("ETA …")
        link.push(protocol.Metrics.from_rows([record(step) for step in range(2, ETA_MIN_STEPS + 1)]))
        app.poll_now()
        await pilot.pause()
        assert "ETA …" not in header_text(app) and "ETA 0:0" in header_text(app)


async def test_at_80_columns_the_options_line_keeps_changed_options_and_one_step_time_shows() -> None:
    """At 80x24 the options line dropped ``par fsdp`` with no word (the options at their default came first), and the
    header's ``step 47.6 ms`` stood above the ranks line's ``slowest rank 0 +3 % (154 ms)``: one step's time of one
    rank, gathered about once a second, read as a second step time that disagreed with the first."""
    from fake_link import ranks

    from torchlab.tui.widgets.options_panel import OptionsPanel
    from torchlab.tui.widgets.rank_table import RankTable

    link = FakeLink(training_events(120, world_size=2))
    link.push(protocol.Metrics.from_rows([record(121, world_size=2, parallel="fsdp", amp="bf16", compile=True)]),
              ranks(121, step_time_s=0.154))
    app = quiet_app(link)
    async with app.run_test(size=(80, 24)) as pilot:
        app.poll_now()
        await pilot.pause()
        options = app.query_one(OptionsPanel).render_line(0).text.strip()
        assert options.startswith("amp bf16 · ") and "compile on" in options and "ws 2 · par fsdp" in options
        assert options.endswith(" · +2 more")  # accum 1 and lr× 1.0, at their default, made way
        summary = app.query_one("#ranks-line", RankTable).render_line(0).text.strip()
        assert summary.startswith("2 ranks · slowest rank 1 +3 % · data wait ≤0.40 ms")
        assert "154 ms" not in summary and "159 ms" not in summary
