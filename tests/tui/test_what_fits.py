"""What fits, in the app against a FakeLink: the "what fits" view asks the trainer once and lists each prediction by
the change that makes it from the settings in force now; a key says its change's prediction as it sends it; a change
predicted not to fit is refused with its figures until its key is pressed again; the app asks on its own once the
run has trained ``forecast_after_s``."""

from __future__ import annotations

from fake_link import FakeLink, memory_predicted as predicted, quiet_app
from textual.widgets import DataTable

from torchlab.core.wire import protocol
from torchlab.core.wire.events import LongestBatch
from torchlab.tui.app import TorchlabApp
from torchlab.tui.screens.fits_screen import FitsScreen
from torchlab.tui.widgets.event_log import EventLog

SIZE = (120, 40)


def log_text(app: TorchlabApp) -> str:
    return "\n".join(app.query_one(EventLog).lines_written)


def table_rows(app: TorchlabApp) -> list[list[str]]:
    table = app.screen.query_one(DataTable)
    return [[str(cell) for cell in table.get_row_at(index)] for index in range(table.row_count)]


async def answer(app: TorchlabApp, pilot) -> None:
    app.poll_now()
    await pilot.pause()


async def test_the_view_asks_once_and_names_each_row_by_its_change_from_the_settings_in_force_now():
    link = FakeLink()
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await answer(app, pilot)
        await pilot.press("F")
        assert isinstance(app.screen, FitsScreen)
        assert link.sent_of(protocol.ForecastCommand) == [protocol.ForecastCommand()]
        assert "Predicting" in str(app.screen.query_one("#fits-status").render())
        link.push(predicted("in force", 60), predicted("checkpointing=on", 30, checkpointing=True),
                  predicted("batch_size=64", 90, "no", batch_size=64))
        await answer(app, pilot)
        assert table_rows(app) == [
            ["in force", "60 GiB", "yes", "30 GiB", "30 GiB", "0 B"],
            ["batch_size=64", "90 GiB", "no", "45 GiB", "45 GiB", "0 B"],
            ["checkpointing=on", "30 GiB", "yes", "15 GiB", "15 GiB", "0 B"],
        ]
        await pilot.press("escape")
        await pilot.press("c")  # applied by the fake trainer: the rows are named from the settings now in force
        await answer(app, pilot)
        await pilot.press("F")
        assert [row[0] for row in table_rows(app)] == ["in force", "checkpointing=off, batch_size=64", "checkpointing=off"]
        assert link.sent_of(protocol.ForecastCommand) == [protocol.ForecastCommand()]  # asked once a trainer


async def test_a_key_says_its_prediction_and_a_change_predicted_not_to_fit_waits_for_the_key_again():
    link = FakeLink()
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await answer(app, pilot)
        await pilot.press("c")  # nothing predicted yet: sent as it always was, with nothing said of its memory
        await answer(app, pilot)
        assert "requested checkpointing = on (applies at the next step)\n" in log_text(app) + "\n"
        link.push(predicted("in force", 60, checkpointing=True), predicted("checkpointing=off", 90, "no"),
                  predicted("amp=bf16", 41, checkpointing=True, amp="bf16"))
        await answer(app, pilot)
        sent = len(link.sent)
        await pilot.press("c")
        assert len(link.sent) == sent  # refused here, with the figures
        assert ("checkpointing = off is predicted not to fit: a peak of 90 GiB, over the 80 GiB a rank has (80 GiB "
                "per rank (NVIDIA H100 80GB HBM3, by NVML)): nothing sent; press c again to apply it all the same") in log_text(app)
        await pilot.press("c")
        assert link.sent[-1] == protocol.SetCommand("checkpointing", False)
        assert ("requested checkpointing = off (applies at the next step): peak 60 GiB → 90 GiB predicted"
                in log_text(app))
        await answer(app, pilot)
        link.push(predicted("amp=bf16", 41, checkpointing=True, amp="bf16"))
        await pilot.press("c", "a")  # back on (fits: said, sent at once), then amp's next value, bf16
        assert link.sent[-2:] == [protocol.SetCommand("checkpointing", True), protocol.SetCommand("amp", "bf16")]
        assert "requested amp = bf16 (applies at the next step): peak 60 GiB → 41 GiB predicted" in log_text(app)


async def test_the_app_asks_what_fits_on_its_own_once_the_run_has_trained_a_while():
    link = FakeLink()
    app = TorchlabApp(link, poll_interval=3600, log_poll_interval=3600, grad_refresh_interval=0, forecast_after_s=0)
    async with app.run_test(size=SIZE) as pilot:
        await answer(app, pilot)
        await answer(app, pilot)
        assert link.sent_of(protocol.ForecastCommand) == [protocol.ForecastCommand()]
    waiting = FakeLink()
    app = TorchlabApp(waiting, poll_interval=3600, log_poll_interval=3600, grad_refresh_interval=0)  # 30 s by default
    async with app.run_test(size=SIZE) as pilot:
        await answer(app, pilot)
        assert waiting.sent_of(protocol.ForecastCommand) == []


async def test_a_number_typed_that_is_predicted_not_to_fit_is_sent_when_entered_again():
    link = FakeLink()
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await answer(app, pilot)
        await pilot.press("k", "ctrl+a", "delete", "2", "enter")  # split 2, applied by the fake trainer
        await answer(app, pilot)
        link.push(predicted("in force", 60, split=2), predicted("split=1", 90, "no"))
        await answer(app, pilot)
        sent = len(link.sent)
        await pilot.press("k", "ctrl+a", "delete", "1", "enter")
        assert len(link.sent) == sent
        assert "split = 1 is predicted not to fit: a peak of 90 GiB" in log_text(app)
        assert "nothing sent; enter it again to apply it all the same" in log_text(app)
        await pilot.press("k", "ctrl+a", "delete", "1", "enter")
        assert link.sent[-1] == protocol.SetCommand("split", 1)


async def test_the_view_says_which_batch_it_predicted_with_and_the_log_says_each_longer_one():
    """Before the run's first step the predictions ran the dataset's first samples; then the run's longest batch
    (its first: no news in the log), and each longer one, said in the log, which the view names once its
    predictions are made with it."""
    link = FakeLink()
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await answer(app, pilot)
        link.push(LongestBatch(step=1, shapes=[[32, 61], [32]], elements=1984))
        await pilot.press("F")
        notes = lambda: str(app.screen.query_one("#fits-notes").render())  # noqa: E731
        assert "batch" not in notes()  # nothing predicted: no word of what with
        link.push(predicted("in force", 60))
        await answer(app, pilot)
        assert "the batch is the dataset's first samples" in notes()
        assert "the run's longest so far is being predicted" in notes() and "longer batch" not in log_text(app)
        link.push(LongestBatch(step=3, shapes=[[32, 64], [32]], elements=2080, previous_elements=1984),
                  predicted("in force", 61, longest=2080))
        await answer(app, pilot)
        assert "predicted with the run's longest batch so far (32×64, 32, step 3); a longer one takes more" in notes()
        assert "a longer batch than any before: 32×64, 32 (+5 % elements): what fits predicts with it" in log_text(app)

