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

