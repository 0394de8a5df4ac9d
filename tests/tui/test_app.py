"""The app driven by keys against a FakeLink: what it sends, what it shows, and that it stays up."""

from __future__ import annotations

import asyncio
import signal
from dataclasses import replace
from pathlib import Path

import pytest

from fake_link import FakeLink, grad_norms, module_names, quiet_app, record, training_events, welcome

from torchlab.core.errors import EXIT_FAILED
from torchlab.core.wire import protocol
from torchlab.tui import app as app_module
from torchlab.tui.app import TorchlabApp
from torchlab.tui.screens.error_screen import ErrorScreen
from torchlab.tui.screens.help_screen import HelpScreen
from torchlab.tui.screens.prompt import OptionPrompt
from torchlab.tui.widgets.event_log import EventLog
from torchlab.tui.widgets.grad_table import GradTable
from torchlab.tui.widgets.line_chart import LineChart
from torchlab.tui.widgets.options_panel import OptionsPanel

SIZE = (120, 40)


def log_text(app: TorchlabApp) -> str:
    return "\n".join(app.query_one(EventLog).lines_written)


def options_text(app: TorchlabApp) -> str:
    panel = app.query_one(OptionsPanel)
    return str(panel.content)


async def answer(app: TorchlabApp, pilot) -> None:
    """Let the fake trainer's answers in, as the 10 Hz timer would, and let the screen settle."""
    app.poll_now()
    await pilot.pause()


async def test_module_rows_appear_after_welcome_and_grad_norms() -> None:
    link = FakeLink([welcome(0)])
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        grads = app.query_one(GradTable)
        assert link.started
        assert grads.displayed_keys == module_names()
        assert str(grads.table.get_cell("head", "norm")) == "–"
        link.push(grad_norms(2))
        await answer(app, pilot)
        assert str(grads.table.get_cell("head", "norm")) != "–"
        assert app.run_state.grad_step == 2


def on_cuda(events: list[protocol.Message]) -> list[protocol.Message]:
    """``events`` of a run on a GPU: the app then lets fp16 through, for the trainer to answer (the fake refuses it)."""
    return [replace(event, run=replace(event.run, device="cuda:0")) if isinstance(event, protocol.Welcome) else event
            for event in events]


async def test_amp_key_cycles_and_every_answer_shows_with_its_step() -> None:
    link = FakeLink(on_cuda(training_events()))
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("a")
        assert link.sent[-1] == protocol.SetCommand("amp", "bf16")
        assert "requested amp = bf16" in log_text(app)
        await answer(app, pilot)
        assert "amp = bf16 applied at step 121 (was off)" in log_text(app)
        assert "amp           bf16" in options_text(app)

        await pilot.press("a")
        assert link.sent[-1] == protocol.SetCommand("amp", "fp16")
        await answer(app, pilot)
        assert "amp = fp16 refused: fp16 needs CUDA" in log_text(app)
        assert app.run_state.options["amp"] == "bf16"

        # fp16 was refused on this run: the cycle goes on to off instead of asking again.
        await pilot.press("a")
        assert link.sent[-1] == protocol.SetCommand("amp", "off")


async def test_checkpointing_key_toggles_and_is_acknowledged(app: TorchlabApp, link: FakeLink) -> None:
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("c")
        assert link.sent == [protocol.SetCommand("checkpointing", True)]
        assert "checkpointing off → on…" in options_text(app)  # shown as pending until the answer
        await answer(app, pilot)
        assert "checkpointing = on applied at step 121 (was off)" in log_text(app)
        assert "checkpointing on" in options_text(app)
        await pilot.press("c")
        assert link.sent[-1] == protocol.SetCommand("checkpointing", False)


async def test_clip_prompt_sends_the_value_and_focus_returns_so_keys_work(app: TorchlabApp, link: FakeLink) -> None:
    async with app.run_test(size=SIZE) as pilot:
        focused_before = app.focused
        await pilot.press("g")
        assert isinstance(app.screen, OptionPrompt)
        await pilot.press("1", ".", "5", "enter")
        await pilot.pause()
        assert not isinstance(app.screen, OptionPrompt)
        assert link.sent == [protocol.SetCommand("clip", 1.5)]
        await answer(app, pilot)
        assert "clip = 1.5 applied at step 121 (was off)" in log_text(app)
        # Focus is back where it was, not in an input: letter keys mean their actions again.
        assert app.focused is focused_before
        await pilot.press("c")
        assert link.sent[-1] == protocol.SetCommand("checkpointing", True)


async def test_empty_clip_prompt_turns_clipping_off(app: TorchlabApp, link: FakeLink) -> None:
    link.options["clip"] = 1.0
    app.run_state.options["clip"] = 1.0
    async with app.run_test(size=SIZE) as pilot:
        app.run_state.options["clip"] = 1.0
        await pilot.press("g")
        prompt = app.screen
        assert isinstance(prompt, OptionPrompt)
        await pilot.press("backspace", "enter")  # the prefilled value is selected: backspace clears it
        await pilot.pause()
        assert link.sent == [protocol.SetCommand("clip", None)]


async def test_invalid_prompt_input_says_what_is_wrong_and_sends_nothing(app: TorchlabApp, link: FakeLink) -> None:
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("m")
        prompt = app.screen
        assert isinstance(prompt, OptionPrompt)
        await pilot.press("x", "enter")
        await pilot.pause()
        assert app.screen is prompt
        assert "accum must be a whole number" in prompt.error_text
        assert link.sent == []
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, OptionPrompt)
        assert link.sent == []


async def test_lr_scale_and_world_size_prompts(app: TorchlabApp, link: FakeLink) -> None:
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("l", "0", ".", "5", "enter")
        await pilot.pause()
        assert link.sent[-1] == protocol.SetCommand("lr_scale", 0.5)
        await pilot.press("w", "2", "enter")
        await pilot.pause()
        assert link.sent[-1] == protocol.SetCommand("world_size", 2)
        await answer(app, pilot)
        await answer(app, pilot)  # the checkpoint, then (after the relaunch) the acknowledgement
        assert "world_size = 2 applied at step 121 (was 1)" in log_text(app)


async def test_d_switches_the_ranks_to_fsdp_through_a_relaunch(link: FakeLink) -> None:
    link.options["world_size"] = 2
    link.queue = list(training_events(world_size=2))
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await answer(app, pilot)
        await pilot.press("D")
        await pilot.pause()
        assert link.sent[-1] == protocol.SetCommand("parallel", "fsdp")
        await answer(app, pilot)  # the checkpoint: the ranks stop
        assert app.run_state.state == "relaunching" and app.run_state.state_detail == "ddp → fsdp"
        assert "relaunching with parallel=fsdp from the checkpoint of step 120" in log_text(app)
        assert "checkpoint saved (parallel change)" in log_text(app)
        await answer(app, pilot)  # the new ranks train
        assert app.run_state.state == "running" and "parallel = fsdp applied at step 121 (was ddp)" in log_text(app)
        assert app.run_state.world_size == 2
        await pilot.press("a")  # amp on a sharded model is FSDP2's mixed precision: the request says it relaunches
        await pilot.pause()
        assert "requested amp = bf16 (checkpoint and relaunch the ranks at the next step)" in log_text(app)


async def test_space_pauses_and_resumes(app: TorchlabApp, link: FakeLink) -> None:
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("space")
        assert link.sent == [protocol.PauseCommand()]
        await answer(app, pilot)
        assert app.run_state.state == "paused"
        assert "paused at step 120" in log_text(app)
        await pilot.press("space")
        assert link.sent[-1] == protocol.ResumeCommand()
        await answer(app, pilot)
        assert app.run_state.state == "running"
        assert "resumed at step 120" in log_text(app)


async def test_profile_save_and_detach_are_sent_and_answered(app: TorchlabApp, link: FakeLink) -> None:
    link.detach_acknowledged = False  # a trainer too busy to answer yet: the app waits where it is
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("p", "s", "d")
        assert [type(c) for c in link.sent] == [protocol.ProfileCommand, protocol.SaveCheckpointCommand, protocol.DetachCommand]
        await answer(app, pilot)
        text = log_text(app)
        assert "profile = 5 refused: a profile is already recording (from step 118)" in text
        assert "121 ◆ checkpoint saved (requested): checkpoints/step-0000121.pt" in text
        assert "detach requested: the app leaves once the trainer confirms" in text
        assert link.closed is None and not app.run_state.detached


async def detach_confirmed(app: TorchlabApp, pilot, link: FakeLink) -> None:
    """``d``, and the trainer's acknowledgement of it; then the app leaves."""
    await pilot.press("d")
    link.queue.clear()
    link.push(protocol.Detached(121))
    await answer(app, pilot)
    await app.workers.wait_for_complete()
    await pilot.pause()


async def test_confirmed_detach_closes_the_link_without_stopping_the_trainer(app: TorchlabApp, link: FakeLink) -> None:
    async with app.run_test(size=SIZE) as pilot:
        await detach_confirmed(app, pilot, link)
    assert link.closed == {"detach": True}


async def test_detaching_a_paused_run_says_it_stays_paused_not_that_it_trains(app: TorchlabApp, link: FakeLink) -> None:
    async with app.run_test(size=SIZE) as pilot:
        link.push(protocol.State(state="paused", step=121))
        await answer(app, pilot)
        await pilot.press("d")
        link.push(protocol.Detached(121))
        await answer(app, pilot)
        assert "detached at step 121: the run stays paused: nothing trains until you attach and resume it (space)" in log_text(app)
        assert "keeps training" not in log_text(app)
        await app.workers.wait_for_complete()
    assert link.closed == {"detach": True}


async def test_an_earlier_apps_detach_replayed_on_attach_does_not_make_this_app_leave(app: TorchlabApp, link: FakeLink) -> None:
    async with app.run_test(size=SIZE) as pilot:
        link.push(protocol.Detached(40))  # from the history ring
        await answer(app, pilot)
        assert not app.run_state.detached and link.closed is None
        assert "an earlier app detached at step 40" in log_text(app)


async def hangup_handled(app: TorchlabApp) -> None:
    """Wait for the hang-up's thread off the event loop: it ends by asking the loop to exit the app (a join on the
    loop's own thread waited out its whole timeout, 10 s a test)."""
    await asyncio.get_running_loop().run_in_executor(None, app._hangup_thread.join, 10)
    assert not app._hangup_thread.is_alive()


async def test_a_hang_up_detaches_so_the_trainer_trains_on(app: TorchlabApp, link: FakeLink) -> None:
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app._on_hangup(signal.SIGHUP, None)  # what the terminal's hang-up delivers
        await hangup_handled(app)
    assert [type(c) for c in link.sent][-1] is protocol.DetachCommand
    assert link.closed == {"detach": True}


async def test_a_hang_up_the_trainer_does_not_acknowledge_stops_it_as_a_quit_would(app: TorchlabApp, link: FakeLink) -> None:
    link.detach_acknowledged = False
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app._on_hangup(signal.SIGHUP, None)
        await hangup_handled(app)
    assert link.closed == {"detach": False}


async def test_quit_stops_the_trainer_through_the_link(app: TorchlabApp, link: FakeLink) -> None:
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        await app.workers.wait_for_complete()
        await pilot.pause()
    assert link.closed == {"detach": False}


async def test_quit_on_a_hung_run_says_the_failure_the_stop_ended_it_with_not_stopped(app: TorchlabApp, link: FakeLink) -> None:
    """A stop cannot wait for the boundary of a hung step: the trainer ends the run and says why as it closes
    (core/engine/parallel/hang_watch.py). What it says then is the app's last word, its status and the terminal's
    lines: read before the app exits, it said "Stopped at step 11", exit 0, for a run that failed with no final
    checkpoint."""
    ended = "step 12 hung; ended as asked (stopped from the app), with no final checkpoint (its ranks are stuck)"
    link.said_on_close = [protocol.Error(ended, "", 12), protocol.State("failed", 12, ended)]
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        await app.workers.wait_for_complete()
        await pilot.pause()
    assert app.return_code == EXIT_FAILED
    assert app.how_it_ended(Path("/nowhere"))[0] == f"Failed at step 12: {ended}"


async def test_error_event_opens_the_error_screen_and_restart_resumes(app: TorchlabApp, link: FakeLink) -> None:
    async with app.run_test(size=SIZE) as pilot:
        link.push(protocol.Error("RuntimeError: boom", "Traceback (most recent call last):\n  ...\nRuntimeError: boom", 121, "runs/x/checkpoints/last.pt"))
        await answer(app, pilot)
        assert isinstance(app.screen, ErrorScreen)
        assert app.focused is app.screen.query_one("#restart")  # enter restarts
        assert app.run_state.state == "failed"
        # The app stays responsive underneath: it keeps taking events, and trainer keys are off while the dialog is up.
        link.push(protocol.Log("warning", "late line", 121))
        await answer(app, pilot)
        assert "late line" in log_text(app)
        await pilot.press("a")
        assert link.sent_of(protocol.SetCommand) == []
        await pilot.press("r")
        await pilot.pause()
        assert link.restarts == [True]
        assert not isinstance(app.screen, ErrorScreen)
        await answer(app, pilot)
        assert app.run_state.state == "running"
        assert app.run_state.step == 100  # resumed from the checkpoint at step 100
        await pilot.press("c")
        assert link.sent[-1] == protocol.SetCommand("checkpointing", True)


async def test_options_set_on_the_error_screen_go_with_the_restart_from_its_first_step(app: TorchlabApp, link: FakeLink) -> None:
    async with app.run_test(size=(80, 24)) as pilot:
        link.push(protocol.NonFinite(121, "forward", "blocks.2.mlp.fc", "output of blocks.2.mlp.fc is nan", "non-finite output"))
        await answer(app, pilot)
        screen = app.screen
        assert isinstance(screen, ErrorScreen)
        await pilot.press("l")  # as on the main screen: a number is asked for, checked as the trainer would
        assert isinstance(app.screen, OptionPrompt)
        await pilot.press(*"0.5", "enter", "g", *"1.0", "enter", "a")
        await pilot.pause()
        assert app.screen is screen and screen.changed == {"lr_scale": 0.5, "clip": 1.0, "amp": "bf16"}
        assert str(screen.query_one("#error-option-lr_scale").content) == "l lr× 1.0 → 0.5"
        assert str(screen.query_one("#error-option-accum").content) == "m accum 1"
        await pilot.press("a")  # bf16 → off, back to what the run had: fp16 is skipped on a CPU run, as the main
        assert "amp" not in screen.changed  # screen's key skips it (the screen offered "amp bf16 → fp16")
        await pilot.press("r")
        await pilot.pause()
        assert link.restart_options == [{"lr_scale": 0.5, "clip": 1.0}]
        assert "restarting the trainer from the last checkpoint with lr_scale = 0.5, clip = 1.0…" in log_text(app)
        await answer(app, pilot)
        assert app.run_state.options["lr_scale"] == 0.5 and app.run_state.options["clip"] == 1.0
        assert "lr× 0.5" in options_text(app)


async def test_a_restart_keeps_an_option_changed_after_the_last_checkpoint_as_the_error_screen_showed_it(
        app: TorchlabApp, link: FakeLink) -> None:
    async with app.run_test(size=SIZE) as pilot:
        link.push(protocol.CheckpointSaved(110, "runs/x/checkpoints/step-0000110.pt", "periodic"))
        await answer(app, pilot)
        await pilot.press("c")  # checkpointing on at step 121: the checkpoint of step 110 has it off
        await answer(app, pilot)
        link.push(protocol.Error("RuntimeError: boom", "tb", 125))
        await answer(app, pilot)
        assert str(app.screen.query_one("#error-option-checkpointing").content) == "c ckpt on"
        await pilot.press("r")
        await pilot.pause()
        assert link.restart_options == [{"checkpointing": True}]


async def test_after_a_failure_the_palettes_restart_opens_the_error_screen_to_set_options_first(app: TorchlabApp,
                                                                                              link: FakeLink) -> None:
    async with app.run_test(size=SIZE) as pilot:
        link.push(protocol.Error("RuntimeError: boom", "tb", 121))
        await answer(app, pilot)
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, ErrorScreen) and link.restarts == []
        restart = next(c for c in app.get_system_commands(app.screen) if c.title.startswith("Restart the trainer"))
        restart.callback()
        await pilot.pause()
        assert isinstance(app.screen, ErrorScreen) and link.restarts == []
        await pilot.press("r")
        await pilot.pause()
        assert link.restarts == [True]


async def test_restart_truncates_curves_after_the_checkpoint_step(app: TorchlabApp, link: FakeLink) -> None:
    async with app.run_test(size=SIZE) as pilot:
        assert app.run_state.loss.xs[-1] == 120
        link.push(protocol.Error("boom", "tb", 121))
        await answer(app, pilot)
        await pilot.press("r")
        await answer(app, pilot)
        assert app.run_state.loss.xs[-1] == 100


async def test_nonfinite_event_shows_the_report(app: TorchlabApp, link: FakeLink) -> None:
    async with app.run_test(size=SIZE) as pilot:
        link.push(protocol.NonFinite(121, "backward", "blocks.2.mlp.fc", "grad of blocks.2.mlp.fc.weight is inf", "non-finite gradient"))
        await answer(app, pilot)
        screen = app.screen
        assert isinstance(screen, ErrorScreen)
        assert "blocks.2.mlp.fc" in screen.failure.detail
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, ErrorScreen)
        assert app.run_state.state == "failed"


async def test_a_link_that_fails_to_start_shows_the_error_and_the_app_stays_up() -> None:
    def broken() -> FakeLink:
        raise OSError("no space left on device")

    app = quiet_app(broken)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, ErrorScreen)
        assert "no space left on device" in app.screen.failure.message
        await pilot.press("escape")
        await pilot.press("a")  # nothing to send to: said so, no crash
        await pilot.pause()
        assert "no trainer is connected" in log_text(app)


def unsafe_runtime_directory(tmp_path: Path, monkeypatch) -> Path:
    """XDG_RUNTIME_DIR/torchlab with mode 755: another user could enter it, so no trainer's socket goes there."""
    unsafe = tmp_path / "xdg" / "torchlab"
    unsafe.mkdir(parents=True)
    unsafe.chmod(0o755)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    return unsafe


async def leave_the_error_screen(app: TorchlabApp, pilot) -> None:
    await pilot.press("q")
    for _ in range(100):
        if not app.is_running:
            return
        await app.workers.wait_for_complete()
        await pilot.pause()
    raise AssertionError("the app did not exit")


async def test_a_refused_runtime_directory_is_its_paragraph_without_a_traceback_and_exits_2(tmp_path, monkeypatch) -> None:
    """The real link, refused by the runtime directory: the error screen showed a traceback panel for torchlab's own
    refusal, and the app then exited 0."""
    from torchlab.tui.link import ProcessLink

    unsafe = unsafe_runtime_directory(tmp_path, monkeypatch)
    link = ProcessLink(tmp_path / "run", ["mlp"])
    app = quiet_app(lambda: link)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, ErrorScreen)
        assert app.screen.failure.message == f"{unsafe} has mode 755, not 700: run chmod 700 {unsafe}."
        assert app.screen.failure.detail == "" and not app.screen.query("#error-detail")  # no traceback panel
        await leave_the_error_screen(app, pilot)
    assert link.process is None  # no trainer was started
    assert app.return_code == 2


@pytest.mark.parametrize("error, status, traceback_shown", [
    ("storage", 1, False),  # a full disk: a failed run, said in its words
    ("no-space", 1, False),  # the machine's own error, which names the file
    ("bug", 1, True),  # not torchlab's words: a bug, whose traceback is what to report
])
async def test_a_trainer_that_cannot_start_exits_as_a_failed_run_with_a_traceback_only_for_a_bug(
        error: str, status: int, traceback_shown: bool) -> None:
    import errno

    from torchlab.core.errors import StorageError

    raised = {"storage": StorageError("could not write runs/x/trainer.log: No space left on device"),
              "no-space": OSError(errno.ENOSPC, "No space left on device", "/tmp/torchlab-0/x.token"),
              "bug": RuntimeError("an internal mistake")}[error]

    def broken() -> FakeLink:
        raise raised

    app = quiet_app(broken)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, ErrorScreen)
        assert str(raised) in app.screen.failure.message
        assert ("Traceback" in app.screen.failure.detail) == traceback_shown
        assert bool(app.screen.query("#error-detail")) == traceback_shown
        await leave_the_error_screen(app, pilot)
    assert app.return_code == status


async def test_an_error_the_trainer_tells_without_a_traceback_shows_no_traceback_panel(app: TorchlabApp, link: FakeLink) -> None:
    """A full disk mid-run, a workload that cannot load: the trainer's paragraph is all there is to show."""
    async with app.run_test(size=SIZE) as pilot:
        link.push(protocol.Error("could not write runs/x/metrics.jsonl: No space left on device", "", 121))
        await answer(app, pilot)
        assert isinstance(app.screen, ErrorScreen) and not app.screen.query("#error-detail")


async def test_surprising_events_are_logged_not_fatal(app: TorchlabApp, link: FakeLink) -> None:
    async with app.run_test(size=SIZE) as pilot:
        link.push(
            protocol.OptionApplied("turbo", 3, None, 121, "app"),
            protocol.Metrics(columns={"loss": [1.0]}),
            protocol.Metrics(columns={"step": [1, 2], "loss": [3.0]}),
            protocol.GradNorms(122, [1.0, 2.0]),
            protocol.State("levitating", 122),
            protocol.Refused("wrong token"),
        )
        await answer(app, pilot)
        text = log_text(app)
        assert "turbo = 3 applied at step 121" in text
        assert "metrics batch without a step column" in text
        assert "metrics batch whose 2 columns differ in length" in text
        assert "gradient norms for 2 modules" in text
        assert "unknown state 'levitating'" in text
        assert "the trainer refused a message: wrong token" in text
        await pilot.press("c")
        assert link.sent[-1] == protocol.SetCommand("checkpointing", True)


async def test_grad_table_filter_by_name_and_focus_returns_to_the_table(app: TorchlabApp, link: FakeLink) -> None:
    async with app.run_test(size=SIZE) as pilot:
        grads = app.query_one(GradTable)
        await pilot.press("slash")
        await pilot.press(*"attn")
        await pilot.pause()
        assert grads.displayed_keys and all("attn" in key for key in grads.displayed_keys)
        assert len(grads.displayed_keys) == 8
        await pilot.press("enter")
        assert app.focused is grads.table
        await pilot.press("c")  # a letter key acts again, it is not typed into the filter
        assert link.sent == [protocol.SetCommand("checkpointing", True)]
        await pilot.press("escape")
        await pilot.pause()
        assert len(grads.displayed_keys) == len(module_names())


async def test_grad_table_sort_keeps_the_cursor_on_its_module(app: TorchlabApp, link: FakeLink) -> None:
    async with app.run_test(size=SIZE) as pilot:
        grads = app.query_one(GradTable)
        await pilot.press(*["down"] * 5)
        assert grads.displayed_keys[grads.table.cursor_row] == "blocks.0.ln_2"
        await pilot.press("o")  # sort by norm, largest first
        await pilot.pause()
        assert grads.sort_by == "norm"
        assert grads.displayed_keys[0] == "head"
        assert grads.displayed_keys[-1] == "blocks.3.ln_1"
        assert grads.displayed_keys[grads.table.cursor_row] == "blocks.0.ln_2"
        await pilot.press("o")  # by ratio to the median: the same order here
        await pilot.press("o")  # by name
        await pilot.pause()
        assert grads.displayed_keys == sorted(module_names())


async def test_new_norms_update_in_place_keeping_cursor_and_scroll(link: FakeLink) -> None:
    names = [f"layers.{i}.linear" for i in range(40)]
    link.queue = training_events(20, names=names)
    app = quiet_app(link)
    async with app.run_test(size=(120, 30)) as pilot:
        grads = app.query_one(GradTable)
        table = grads.table
        await pilot.press(*["down"] * 30)
        await pilot.pause()
        row, scroll = table.cursor_row, table.scroll_y
        assert row == 30 and scroll > 0
        before = str(table.get_cell("layers.30.linear", "norm"))
        link.push(protocol.Metrics.from_rows([record(21)]), grad_norms(21, names))
        link.push(protocol.GradNorms(22, [float(i) for i in range(40)], 1.0))
        await answer(app, pilot)
        assert str(table.get_cell("layers.30.linear", "norm")) != before
        assert (table.cursor_row, table.scroll_y) == (row, scroll)


async def test_a_large_model_starts_grouped_and_a_group_drills_down(link: FakeLink) -> None:
    names = [f"blocks.{b}.{part}" for b in range(125) for part in ("ln_1", "attn.qkv", "attn.proj", "ln_2", "mlp.fc", "mlp.proj", "mlp.act", "drop")]
    assert len(names) == 1000
    link.queue = training_events(10, names=names)
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        grads = app.query_one(GradTable)
        assert grads.grouped
        assert len(grads.displayed_keys) == 125
        await pilot.press("down", "down", "enter")
        await pilot.pause()
        assert not grads.grouped
        assert grads.filter_text == "blocks.2."
        assert len(grads.displayed_keys) == 8
        await pilot.press("v")  # back to groups, filter kept: the group whose modules match
        await pilot.pause()
        assert grads.grouped
        assert grads.displayed_keys == ["blocks.2"]
        await pilot.press("escape")
        await pilot.pause()
        assert len(grads.displayed_keys) == 125


async def test_trainer_log_lines_appear_in_the_event_log_but_torchs_cpp_log_does_not(tmp_path: Path) -> None:
    log_file = tmp_path / "trainer.log"
    log_file.write_text("torch warming up\n")
    link = FakeLink(log_path=log_file)
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        app._poll_trainer_log()
        with log_file.open("a") as handle:
            handle.write("[W1123 21:00:42.901699812 CPUAllocator.cpp:245] Memory block of unknown size was allocated\n"
                         "UserWarning: something\npartial")
        app._poll_trainer_log()
        app.poll_now()
        await pilot.pause()
        text = log_text(app)
        assert "torch warming up" in text and "UserWarning: something" in text
        assert "partial" not in text
        assert "CPUAllocator" not in text  # torch's C++ log stays in trainer.log


@pytest.mark.parametrize("size", [(80, 24), (200, 50)])
async def test_the_help_screens_closing_paragraph_wraps_inside_its_box(app: TorchlabApp, size) -> None:
    """Seen in tmux at 200x50: the paragraph under the keys was one row cut at the box's edge ("... shows the st")."""
    async with app.run_test(size=size) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        footer = app.screen.query_one("#help-footer")
        box = footer.parent.scrollable_content_region
        assert footer.region.right <= box.right and footer.size.height >= 2
        assert footer.size.width >= footer.virtual_size.width


async def test_help_screen_and_command_palette_list_every_action(app: TorchlabApp) -> None:
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        legend = str(app.screen.query_one("#help-phases").render())  # the stats line's bar of where the time goes
        assert all(f"█ {phase}" in legend for phase in ("data", "copy", "forward", "backward", "optimizer", "other"))
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        titles = " ".join(command.title for command in app.get_system_commands(app.screen))
        for words in ("Pause or resume", "mixed precision", "checkpointing", "max gradient norm", "accumulation",
                      "learning-rate scale", "training processes", "Profile", "Save a checkpoint", "trainer keeps training",
                      "Restart the trainer"):
            assert words in titles


async def test_the_command_palette_lists_each_entry_once(app: TorchlabApp) -> None:
    from torchlab.tui.app_keys import KEY_ACTIONS

    async with app.run_test(size=SIZE):
        ours = [command for command in app.get_system_commands(app.screen) if command.help.startswith("key ")]
        titles = [command.title for command in ours]
        assert len(titles) == len(set(titles))
        assert all(command.title != command.help for command in app.get_system_commands(app.screen))
        # Each key once, its key beside it: "Save a checkpoint now" · "key s".
        expected = {k.help: f"key {k.key_display or k.key}" for k in KEY_ACTIONS if k.action not in ("quit", "help")}
        assert {command.title: command.help for command in ours if command.title in expected} == expected


async def test_command_palette_action_runs(app: TorchlabApp, link: FakeLink) -> None:
    async with app.run_test(size=SIZE) as pilot:
        command = next(c for c in app.get_system_commands(app.screen) if "mixed precision" in c.title)
        await command.callback()
        await pilot.pause()
        assert link.sent == [protocol.SetCommand("amp", "bf16")]


async def test_small_and_large_terminals_switch_the_options_layout(link: FakeLink) -> None:
    app = quiet_app(link)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.query_one(OptionsPanel).compact
        assert not app.query_one(GradTable).layout_columns.params
        await pilot.resize_terminal(200, 50)
        await pilot.pause()
        assert not app.query_one(OptionsPanel).compact
        assert app.query_one(GradTable).layout_columns.params


@pytest.mark.parametrize("final, said", [
    (protocol.State("finished", 120), "the run is finished"),
    (protocol.Error("RuntimeError: boom", "tb", 121), "the run failed"),
], ids=["finished", "failed"])
async def test_keys_that_talk_to_the_trainer_say_at_once_that_the_run_has_ended(app: TorchlabApp, link: FakeLink,
                                                                                final, said) -> None:
    async with app.run_test(size=SIZE) as pilot:
        link.push(final)
        await answer(app, pilot)
        if isinstance(app.screen, ErrorScreen):
            await pilot.press("escape")
            await pilot.pause()
        app.query_one(EventLog).lines_written.clear()
        await pilot.press("a", "g")
        assert not isinstance(app.screen, OptionPrompt)  # no prompt for a value that would go nowhere
        await pilot.press("c", "p", "s", "T")
        await pilot.pause()
        assert not isinstance(app.screen, OptionPrompt)
        assert link.sent == []
        text = log_text(app)
        for subject in ("amp", "clip", "checkpointing", "profile", "save checkpoint", "trial"):
            assert f"{subject}: {said}; nothing was sent" in text
        assert "requested" not in text and "not connected" not in text
        await pilot.press("space")
        await pilot.pause()
        assert f"{said}: there is nothing to pause or resume" in [n.message for n in app._notifications]


async def test_a_refused_change_stops_showing_as_pending_in_the_options_line() -> None:
    link = FakeLink(on_cuda(training_events()))
    app = quiet_app(link)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("a")
        await answer(app, pilot)
        await pilot.press("a")  # fp16: the fake trainer refuses it
        assert "amp bf16 → fp16…" in options_text(app)
        await answer(app, pilot)
        assert "refused" in log_text(app)
        assert "→" not in options_text(app) and "amp bf16" in options_text(app)


async def test_a_workload_given_by_its_path_is_named_by_its_file_so_the_header_keeps_the_step() -> None:
    import dataclasses

    from torchlab.tui.widgets.run_header import RunHeader

    first = welcome(0)
    events = [dataclasses.replace(first, run=dataclasses.replace(first.run, workload="/home/me/work/models/my_model.py:workload")),
              protocol.State("running", 0), protocol.Metrics.from_rows([record(1)])]
    app = quiet_app(FakeLink(events))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.query_one(RunHeader).render_line(0).text.startswith(
            " torchlab  my_model.py:workload on cpu  ● running  step 1/200")
        assert "connected to the trainer of my_model.py:workload on cpu" in log_text(app)


async def test_at_80x24_the_lines_of_a_session_each_fit_one_row_of_the_event_log(link: FakeLink) -> None:
    from fake_link import RUN_DIR, profile_ready

    app = quiet_app(link)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("a")
        await answer(app, pilot)
        await pilot.press("a", "c", "s", "p")  # fp16 skipped on a CPU, checkpointing on, a checkpoint, a profile
        await answer(app, pilot)
        await pilot.press("w", "2", "enter")
        link.push(protocol.CheckpointSaved(400, f"{RUN_DIR}/checkpoints/step-0000400.pt", "periodic"), profile_ready(12))
        await answer(app, pilot)
        await answer(app, pilot)  # the relaunch's second half
        log = app.query_one(EventLog)
        text = log_text(app)
        for said in ("applied at step", "fp16 skipped: fp16 needs CUDA", "checkpoint saved (periodic)", "profile #1",
                     "checkpoint saved (world-size change)"):
            assert said in text
        assert len(log.lines) == len(log.lines_written)  # not one wrapped to a second row
        assert max(line.cell_length for line in log.lines) <= log.scrollable_content_region.width


async def test_at_80x24_an_entry_too_long_for_a_row_goes_on_under_its_text_not_under_the_steps(link: FakeLink) -> None:
    """Seen in tmux with a HuggingFace model: a refusal's reason and transformers' warnings went on at column 0,
    under the step column, so a reader could not tell where one entry ended and the next began."""
    reason = ("torch.compile could not compile this model: AttributeError: 'dict' object has no attribute "
              "'backward'; it trains on as it was")
    link.push(protocol.OptionRefused("compile", True, reason, 124, "app"))
    app = quiet_app(link)
    async with app.run_test(size=(80, 24)) as pilot:
        await answer(app, pilot)
        log = app.query_one(EventLog)
        rows = [line.text for line in log.lines]
        first = next(index for index, row in enumerate(rows) if "compile = on refused" in row)
        assert rows[first].startswith("   124 ✗ compile = on refused: torch.compile")
        continued = rows[first + 1:first + 3]
        assert continued and all(row.startswith(" " * 9) and row[9] != " " for row in continued)
        assert " ".join(row.strip() for row in rows[first:first + 3]).endswith("it trains on as it was")
        assert max(line.cell_length for line in log.lines) <= log.scrollable_content_region.width


async def test_at_80x24_the_error_screen_shows_the_nan_report_whole_with_its_step(link: FakeLink) -> None:
    """Seen in tmux with a HuggingFace GPT-2 at a huge LR: the report's box had one row, which read "The backward in
    transformer.h.1.ln_1 became non-finite at step" with the step and the rest of the report below the fold."""
    detail = "the backward pass of module 'transformer.h.1.ln_1' produced the first NaN/Inf gradient"
    link.push(protocol.NonFinite(4, "backward", "transformer.h.1.ln_1", detail,
                                 f"step 4: non-finite gradient (backward in transformer.h.1.ln_1): {detail}"))
    app = quiet_app(link)
    async with app.run_test(size=(80, 24)) as pilot:
        await answer(app, pilot)
        await pilot.pause()
        assert isinstance(app.screen, ErrorScreen)
        report = app.screen.query_one("#error-detail-scroll")
        shown = report.scrollable_content_region.height
        assert shown >= 4 and report.max_scroll_y == 0  # the whole report, without scrolling
        assert app.screen.query_one("#restart").region.height > 0  # and the way on still there


async def test_at_80x24_no_line_of_the_main_screen_is_cut_in_the_middle_of_a_figure() -> None:
    from fake_link import telemetry

    from torchlab.tui.widgets.run_header import RunHeader
    from torchlab.tui.widgets.stats_bar import StatsBar
    from torchlab.tui.widgets.system_panel import SystemPanel

    # Wide figures: a long run far along, every figure of the stats line present, an option pending.
    events = [welcome(98_765, steps=1_000_000), protocol.State("running", 98_765),
              protocol.Metrics.from_rows([record(98_766 + i, grad_norm_total=12.345, clipped=True, val_loss=1.2345,
                                                    samples_per_s=123_456.0) for i in range(30)]),
              telemetry()]
    link = FakeLink(events)
    app = quiet_app(link)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("m", "1", "6", "enter")  # accum 1 → 16… pending
        await pilot.pause()
        lines = {
            "header": app.query_one(RunHeader), "stats": app.query_one(StatsBar), "options": app.query_one(OptionsPanel),
            "status": app.query_one("#grad-status"),
        }
        for name, widget in lines.items():
            text = widget.render_line(0).text.rstrip()
            assert "…" not in text.replace("16…", ""), f"{name}: {text!r}"  # the pending mark is the only ellipsis
            assert len(text) <= widget.size.width, f"{name}: {text!r}"
        system = app.query_one(SystemPanel).render_line(0).text.rstrip()
        assert "…" not in system and system.startswith("no GPU · cpu")
        # What fits is there; what does not is left out whole: of the elapsed time and the ETA, the ETA stays.
        assert lines["header"].render_line(0).text.rstrip() == " torchlab  tiny_gpt on cpu  ● running  step 98795/1000000 10%  ETA 3:57:09"
        assert "1 → 16…" in lines["options"].render_line(0).text


async def test_restart_is_not_offered_while_the_run_is_going(app: TorchlabApp, link: FakeLink) -> None:
    async with app.run_test(size=SIZE) as pilot:
        app.restart_trainer()
        await pilot.pause()
        assert link.restarts == []


async def test_a_burst_of_reports_is_folded_in_slices_and_a_key_is_answered_before_it_ends(monkeypatch) -> None:
    monkeypatch.setattr(app_module, "FOLD_SLICE_S", 0.0)  # one message a slice, a pause between slices
    link = FakeLink(training_events(20))
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        link.push(*[protocol.Metrics.from_rows([record(step)]) for step in range(21, 321)])
        steps_when_answered: list[int] = []
        toggle_pause = app.action_toggle_pause

        def answered() -> None:
            steps_when_answered.append(app.run_state.step)
            toggle_pause()

        monkeypatch.setattr(app, "action_toggle_pause", answered)
        folding = asyncio.create_task(app._poll_in_slices())
        await pilot.press("space")
        await folding
        [step_when_answered] = steps_when_answered
        assert link.sent_of(protocol.PauseCommand), "the key was handled"
        assert step_when_answered < 320, "... while the burst was still being folded, not after it"
        assert app.run_state.step == 320
        assert app.run_state.loss.xs.tolist() == [float(step) for step in range(1, 321)], "every report, in order"


async def test_charts_are_redrawn_one_per_poll_and_at_most_every_chart_refresh_s(monkeypatch) -> None:
    """Three charts drawn in one frame made the slowest frames at 50k reports/s: one per poll instead."""
    link = FakeLink(training_events(20))
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        charts = list(app.query(LineChart))
        redrawn: list[LineChart] = []
        for chart in charts:
            chart.data_changed = lambda chart=chart: redrawn.append(chart)
        monkeypatch.setattr(app_module, "CHART_REFRESH_S", 0.0)
        link.push(protocol.Metrics.from_rows([record(21)]))
        app.poll_now()
        assert len(redrawn) == 1, "one chart a poll"
        app.poll_now()
        app.poll_now()
        app.poll_now()
        assert sorted(redrawn, key=charts.index) == charts, "then the others, each once, then none: all are current"
        monkeypatch.setattr(app_module, "CHART_REFRESH_S", 3600.0)
        link.push(protocol.Metrics.from_rows([record(22)]))
        app.poll_now()
        app.poll_now()
        assert len(redrawn) == len(charts), "none again within CHART_REFRESH_S of its last drawing"


async def quit_after(app: TorchlabApp, pilot, *events: protocol.Message, key: str = "q") -> None:
    """Let ``events`` in, then leave with ``key`` (from the error screen if one opened) and wait for the exit."""
    app.link.push(*events)
    await answer(app, pilot)
    await pilot.press(key)
    for _ in range(100):  # the screen's answer, then the worker that closes the link, then the exit
        if not app.is_running:
            return
        await app.workers.wait_for_complete()
        await pilot.pause()
    raise AssertionError(f"the app did not exit after {key!r}")


@pytest.mark.parametrize("events, trainer_exit_code, expected", [
    ([protocol.State("finished", 200)], 0, 0),
    ([], None, 0),  # q while it trains: stopped by the user
    ([protocol.Error("RuntimeError: boom", "tb", 121), protocol.State("failed", 121)], 1, 1),
    ([protocol.Error("tiny.py:3: the factory raised", "", 0), protocol.State("failed", 0)], 2, 2),  # bad input
    ([protocol.NonFinite(121, "forward", "head", "inf", "non-finite loss"), protocol.State("failed", 121)], 3, 3),
], ids=["finished", "stopped-by-the-user", "failed", "bad-input", "non-finite"])
async def test_the_app_exits_with_the_runs_outcome_as_headless_does(link: FakeLink, events, trainer_exit_code, expected) -> None:
    link.trainer_exit_code = trainer_exit_code
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await quit_after(app, pilot, *events)
    assert app.return_code == expected


async def test_a_detach_exits_0_even_after_an_earlier_failure_was_restarted(app: TorchlabApp, link: FakeLink) -> None:
    async with app.run_test(size=SIZE) as pilot:
        link.push(protocol.Error("boom", "tb", 121))
        await answer(app, pilot)
        await pilot.press("r")  # restarted: the failure is history
        await answer(app, pilot)
        await detach_confirmed(app, pilot, link)
    assert link.closed == {"detach": True}
    assert app.return_code == 0


async def test_the_error_screen_says_which_checkpoint_a_restart_resumes_from(link: FakeLink) -> None:
    from textual.widgets import Label

    link.checkpoint_to_restart_from = "step-0000100.pt, step 100"
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        link.push(protocol.Error("boom", "tb", 121))
        await answer(app, pilot)
        assert "r restarts from step-0000100.pt, step 100" in str(app.screen.query_one("#error-keys", Label).content)
        await pilot.press("escape")
        link.checkpoint_to_restart_from = None  # failed before its first checkpoint: a restart starts over
        link.push(protocol.Error("boom again", "tb", 3))
        app.run_state.failure = None  # as after a restart
        await answer(app, pilot)
        assert "r starts the run over (no checkpoint yet)" in str(app.screen.query_one("#error-keys", Label).content)
