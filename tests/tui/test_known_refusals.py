"""What the run would refuse, the app refuses before sending: a cycling key skips it (saying why once), a
switch says why and sends nothing, a prompt shows the reason and stays open. The app knows the device and the
batch from the trainer's welcome, the machine's cores and GPUs from its system samples."""

from __future__ import annotations

from dataclasses import replace

import pytest
from fake_link import FakeLink, quiet_app, telemetry, training_events, welcome

from torchlab.core.wire import protocol
from torchlab.tui.app import TorchlabApp
from torchlab.tui.screens.prompt import OptionPrompt
from torchlab.tui.state import RunState
from torchlab.tui.widgets.event_log import EventLog


SIZE = (80, 24)
FP16_ON_CPU = "fp16 needs CUDA; this run is on cpu: use bf16"


def log_text(app: TorchlabApp) -> str:
    return "\n".join(app.query_one(EventLog).lines_written)


def on_cores(cores: int) -> protocol.Telemetry:
    """A system sample of a machine with ``cores`` CPU cores and no GPU."""
    sample = telemetry().sample
    return protocol.Telemetry(sample=replace(sample, host=replace(sample.host, cpu_count=cores)))


def state_of(*events: protocol.Message) -> RunState:
    state = RunState()
    state.apply_all(events)
    return state


def test_a_cpu_run_would_refuse_fp16_and_pinned_memory_in_the_trainers_words() -> None:
    state = state_of(welcome(0))
    assert state.would_refuse("amp", "fp16") == FP16_ON_CPU
    assert state.would_refuse("amp", "bf16") is None
    assert "this run trains on cpu, where batches are not copied" in state.would_refuse("pin_memory", True)
    assert state.would_refuse("pin_memory", False) is None


def test_a_world_size_is_refused_for_the_batch_and_for_the_cores_once_they_are_known() -> None:
    state = state_of(welcome(0))
    assert state.would_refuse("world_size", 3).startswith("world size 3 does not divide the batch of 32")
    assert state.would_refuse("world_size", 4) is None  # the cores are not known before a system sample
    state.apply_all([on_cores(2)])
    assert state.would_refuse("world_size", 4) == "4 ranks on the CPU need 4 cores, one each; this machine has 2"
    assert state.would_refuse("world_size", 2) is None


def test_nothing_is_refused_before_the_trainer_has_said_what_it_runs_on() -> None:
    assert RunState().would_refuse("amp", "fp16") is None


@pytest.mark.asyncio
async def test_the_amp_key_skips_fp16_on_a_cpu_run_and_says_why_once() -> None:
    link = FakeLink()
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(4):
            await pilot.press("a")
            app.poll_now()
            await pilot.pause()
        assert [command.value for command in link.sent] == ["bf16", "off", "bf16", "off"]
        assert log_text(app).count(f"amp: fp16 skipped: {FP16_ON_CPU}") == 1


@pytest.mark.asyncio
async def test_pin_memory_on_a_cpu_run_is_refused_in_the_app_and_nothing_is_sent() -> None:
    link = FakeLink()
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("n")
        await pilot.pause()
        assert link.sent == []
        assert "pin_memory = on refused: pinned memory speeds up copies" in log_text(app)
        assert "nothing sent" in log_text(app)


@pytest.mark.asyncio
async def test_the_world_size_prompt_refuses_more_ranks_than_cores_with_the_reason_and_stays_open() -> None:
    link = FakeLink([*training_events(), on_cores(2)])
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("w")
        prompt = app.screen
        assert isinstance(prompt, OptionPrompt)
        await pilot.press("backspace", "4", "enter")
        await pilot.pause()
        assert app.screen is prompt
        assert prompt.error_text == "4 ranks on the CPU need 4 cores, one each; this machine has 2"
        await pilot.press("backspace", "3", "enter")
        await pilot.pause()
        assert "does not divide the batch of 32" in prompt.error_text
        assert link.sent == []
        await pilot.press("backspace", "2", "enter")
        await pilot.pause()
        assert link.sent == [protocol.SetCommand("world_size", 2)]


@pytest.mark.asyncio
async def test_a_viewers_footer_shows_only_the_keys_that_work_for_a_viewer() -> None:
    link = FakeLink()
    link.view = True  # attach --view: read-only
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        shown = {binding.action.removeprefix("app.") for _, binding, enabled, _ in app.screen.active_bindings.values() if binding.show}
        assert "quit" in shown and "help" in shown
        assert not {"toggle_pause", "save_checkpoint"} & shown
        assert not any(action.startswith("change_option") for action in shown)
        # Each key that would change the run is refused on the spot, in one line saying the view is read-only
        # (the manual's promise; they used to pass in silence), and nothing is sent, no prompt opens.
        keys = {"a": "amp", "c": "checkpointing", "g": "clip", "m": "accum", "space": "pause", "s": "save",
                "p": "profile", "T": "trial", "d": "detach"}
        await pilot.press(*keys)
        await pilot.pause()
        assert link.sent == []
        assert not isinstance(app.screen, OptionPrompt)
        refusals = [line for line in app.query_one(EventLog).lines_written if "read-only view" in line]
        assert [line[9:].split(":")[0] for line in refusals] == list(keys.values())
        assert all(line.endswith("read-only view (the controlling app changes the run)") for line in refusals)
