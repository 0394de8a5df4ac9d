"""Where the time goes, in the app against a FakeLink: the stats line draws the last measured steps' phases as a bar
with the bound they name, and the event log says the verdict with the change that tests it, once a kind."""

from __future__ import annotations

from fake_link import FakeLink, quiet_app, record
from torchlab.core.analysis.trial_words import DEFAULT_TRIAL_STEPS
from torchlab.core.wire import protocol
from torchlab.core.wire.payloads import StepPhases
from torchlab.tui.widgets.event_log import EventLog
from torchlab.tui.widgets.stats_bar import StatsBar

SIZE = (120, 40)


def measured(step: int, data_ms: float) -> object:
    """A row of the probe's, with the phases of the 5 steps before it: ``data_ms`` waiting for the loader."""
    phases = StepPhases(data_ms / 1000, 0.0, 0.010, 0.015, 0.001, 0.0, 0.0002, 0.0008, steps=5, flops=4.8e9,
                        flops_per_s=4.8e9 / 0.0268, peak_flops_per_s=1e12, ops=400)  # 62 µs an op: not launch-bound
    return record(step, phases=phases)


async def test_the_stats_line_draws_the_phases_and_the_log_says_the_bound_once():
    link = FakeLink()  # 120 steps without phases (a GPU's run)
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        app.poll_now()
        await pilot.pause()
        assert "█" not in str(app.query_one(StatsBar).render())
        batch = protocol.Metrics.from_rows([record(step) if step % 5 else measured(step, 21.0) for step in range(121, 151)])
        link.push(protocol.decode(batch.encode()))  # as the socket carries it: the phases as JSON objects
        app.poll_now()
        await pilot.pause()
        line = str(app.query_one(StatsBar).render())
        assert "████ input-bound 44%" in line and "MFU 18%" in line
        said = [line for line in app.query_one(EventLog).lines_written if "input-bound" in line]
        assert len(said) == 1 and "44 % of each step waits for data → W to raise the loader's workers (T to trial it)" in said[0]
        await pilot.press("T")  # the verdict's change, offered to be trialled: enter sends it
        await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
        [trial] = link.sent_of(protocol.TrialCommand)
        assert (trial.option, trial.value, trial.steps) == ("workers", "2", DEFAULT_TRIAL_STEPS)



async def test_the_time_view_draws_each_rows_phases_over_time_and_where_the_flops_are():
    """``B``: a bar a row, scaled to the slowest (a change that took the data wait away is a shorter bar), the
    verdict, the FLOPs by module (forward, backward, recompute) and by op, the FLOP/s an op reached in a profile of
    steps of the counted kind; at 80x24."""
    from torchlab.core.wire.events import FlopsCounted
    from torchlab.core.wire.payloads import ModuleFlops, OpFlops
    from torchlab.tui.screens.time_screen import TimeScreen
    from textual.widgets import DataTable, Label, Static

    link = FakeLink()
    app = quiet_app(link)
    async with app.run_test(size=(80, 24)) as pilot:
        app.poll_now()
        await pilot.pause()
        await pilot.press("B")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, TimeScreen)
        assert "No row has carried phases yet" in str(screen.query_one("#time-status", Label).render())
        link.push(FlopsCounted(step=1, flops=83_456, ops=140, shapes=[[16, 8], [16, 1]],
                               settings={"checkpointing": False, "split": 1, "accum": 1},
                               by_module=[ModuleFlops("body.0.0", 8192, 16384), ModuleFlops("stem", 4096, 4096)],
                               by_op=[OpFlops("aten::mm", 54_272), OpFlops("aten::addmm", 29_184)]))
        rows = [measured(step, 21.0 if step <= 130 else 1.0) for step in range(105, 151, 5)]
        link.push(protocol.decode(protocol.Metrics.from_rows(rows).encode()))
        link.push(protocol.ProfileReady(first_step=141, last_step=145, dir="/tmp/p", rows=[
            {"name": "aten::mm", "self_cpu_us": 54.272 * 5, "self_device_us": 0.0}]))
        app.poll_now()
        await pilot.pause()
        status = str(screen.query_one("#time-status", Label).render())
        assert status.startswith("step 150 · input-bound: 31 % of each step waits for data"), status  # the last 100 steps
        bars = str(screen.query_one("#time-phases", Static).render()).splitlines()
        slow, fast = bars[0], bars[-2]  # the last line names the colours
        assert slow.split()[:3] == ["125", "47.8", "ms"] and fast.split()[:3] == ["150", "27.8", "ms"]  # 6 rows at 80x24
        assert slow.count("█") == 40 and 22 <= fast.count("█") <= 24  # scaled to the slowest: 27.8 / 47.8 of it
        assert "█ data" in bars[-1] and "MFU 18 %" in slow
        title = str(screen.query_one("#time-flops-title", Label).render())
        assert title.startswith("FLOPs a step: 83.5 k in 140 ops (counted at step 1: batch 16×8, 16×1;"), title
        ops = str(screen.query_one("#time-ops", Static).render())
        assert "aten::mm 65 % (1 GFLOP/s)" in ops and "aten::addmm 35 %" in ops  # 54,272 FLOPs a step in 54.272 µs
        table = screen.query_one(DataTable)
        assert [str(cell) for cell in table.get_row_at(0)] == ["body.0.0", "8.19 k", "16.4 k", "0", "29 %"]
        await pilot.press("B")
        await pilot.pause()
        assert not isinstance(app.screen, TimeScreen)
