"""Keys typed fast after the key that opens a prompt belong to that prompt, however fast they come, and act
there in the order typed.

A terminal delivers ``m``, ``2``, Enter typed quickly (or pasted by tmux) as three key events queued
together, before the app has handled the first. ``type_fast`` queues them the same way; Pilot's
``press`` waits for the app to settle after each key, which hid the loss.
"""

from __future__ import annotations

import pytest
from fake_link import FakeLink, quiet_app, welcome

from textual import events
from textual.command import CommandPalette
from textual.widgets import Input

from torchlab.core.wire import protocol
from torchlab.tui.app import TorchlabApp
from torchlab.tui.screens.error_screen import ErrorScreen
from torchlab.tui.screens.help_screen import HelpScreen
from torchlab.tui.screens.impact_screen import ImpactScreen
from torchlab.tui.screens.memory_screen import MemoryScreen
from torchlab.tui.screens.profile_screens import ProfileListScreen
from torchlab.tui.screens.system_screen import SystemScreen
from torchlab.tui.screens.prompt import OptionPrompt
from torchlab.tui.widgets.event_log import EventLog
from torchlab.tui.widgets.grad_table import GradTable

SIZE = (80, 24)
#: what a terminal sends for the keys with names (tmux's BSpace is DEL); the others (left, home) send no character
CHARACTERS = {"enter": "\r", "full_stop": ".", "equals_sign": "=", "space": " ", "backspace": "\x7f", "escape": "\x1b",
              "slash": "/", "question_mark": "?"}


def log_text(app: TorchlabApp) -> str:
    return "\n".join(app.query_one(EventLog).lines_written)


async def type_fast(app: TorchlabApp, pilot, *keys: str) -> None:
    """Queue every key at once, as a terminal does when they come faster than the app handles them."""
    for key in keys:
        app.post_message(events.Key(key, CHARACTERS.get(key, key if len(key) == 1 else None)))
    await pilot.pause()
    await pilot.pause()


@pytest.mark.parametrize("keys, sent", [
    (("m", "2", "enter"), protocol.SetCommand("accum", 2)),
    (("g", "0", "full_stop", "5", "enter"), protocol.SetCommand("clip", 0.5)),
    (("l", "0", "full_stop", "5", "enter"), protocol.SetCommand("lr_scale", 0.5)),
], ids=["accum", "clip", "lr_scale"])
async def test_keys_typed_ahead_go_into_the_prompt_and_its_value_is_sent(keys, sent) -> None:
    link = FakeLink()
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await type_fast(app, pilot, *keys)
        assert not isinstance(app.screen, OptionPrompt)
        assert link.sent == [sent]


async def test_a_trial_typed_ahead_is_typed_into_its_prompt_not_taken_for_keys() -> None:
    """``amp=bf16`` holds a and m, keys of their own on the main screen: inside the prompt they are text."""
    link = FakeLink()
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await type_fast(app, pilot, "T", "a", "m", "p", "equals_sign", "b", "f", "1", "6", "space", "4", "enter")
        assert link.sent == [protocol.TrialCommand("amp", "bf16", 4)]


@pytest.mark.parametrize("opens, keys, sent", [
    ("m", ("backspace", "4", "enter"), protocol.SetCommand("accum", 4)),
    ("l", ("end", "backspace", "backspace", "backspace", "0", "full_stop", "5", "enter"), protocol.SetCommand("lr_scale", 0.5)),
    ("g", ("backspace", "1", "5", "home", "0", "full_stop", "delete", "enter"), protocol.SetCommand("clip", 0.5)),
], ids=["accum", "lr_scale", "clip"])
async def test_a_burst_of_keys_into_an_open_prompt_acts_in_the_order_typed(opens, keys, sent) -> None:
    """tmux's ``send-keys BSpace 4 Enter`` into the open accum prompt sent nothing and said "got ''": the 4 was
    typed over the selected 1, then the backspace, bound in the field and acted on only once it had bubbled up
    to the app, deleted the 4, and Enter submitted the empty field. An editing key acts where a character does."""
    link = FakeLink()
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(opens)
        assert isinstance(app.screen, OptionPrompt)
        await type_fast(app, pilot, *keys)
        assert not isinstance(app.screen, OptionPrompt)
        assert link.sent == [sent]


async def test_a_value_refused_in_a_burst_stays_refused_on_screen() -> None:
    """The refusal of what Enter submitted is the last word: the field's edits before Enter clear an earlier
    refusal, never this one."""
    link = FakeLink()
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await type_fast(app, pilot, "m", "9", "x", "enter")
        assert isinstance(app.screen, OptionPrompt)
        assert app.screen.error_text == "accum must be a whole number from 1 to 4096, got '9x'"
        await type_fast(app, pilot, "backspace")
        assert app.screen.error_text == ""
        assert link.sent == []


@pytest.mark.parametrize("keys, sent", [
    (("backspace", "4", "enter", "l", "0", "full_stop", "5", "enter"),
     [protocol.SetCommand("accum", 4), protocol.SetCommand("lr_scale", 0.5)]),
    (("5", "escape", "g", "2", "enter"), [protocol.SetCommand("clip", 2.0)]),
], ids=["after-enter", "after-escape"])
async def test_keys_typed_after_a_prompt_is_answered_go_to_the_screen_beneath(keys, sent) -> None:
    """A key that reached the prompt's field after Enter or Esc is not the field's: it was typed for the main
    screen, where ``l`` or ``g`` opens the next prompt."""
    link = FakeLink()
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("m")
        await type_fast(app, pilot, *keys)
        assert not isinstance(app.screen, OptionPrompt)
        assert link.sent == sent


@pytest.mark.parametrize("key, current, said", [
    ("m", None, "accum stays 1: nothing sent"),
    ("g", None, "clip stays off: nothing sent"),
])
async def test_a_prompt_submitted_unchanged_sends_nothing_and_says_so(key, current, said) -> None:
    link = FakeLink()
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await type_fast(app, pilot, key, "enter")
        assert not isinstance(app.screen, OptionPrompt)
        assert link.sent == []
        assert said in log_text(app)
        assert "applied" not in log_text(app) and "requested" not in log_text(app)


async def test_a_prompts_key_typed_into_the_gradient_filter_is_text_there() -> None:
    """The prompt keys are bound with priority (acted on before the focused widget sees them), yet a text field
    that has focus still takes them as text."""
    link = FakeLink()
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("slash", *"mlp", "w", "T")
        assert not isinstance(app.screen, OptionPrompt)
        assert app.query_one("#grad-filter", Input).value == "mlpwT"
        assert link.sent == []


@pytest.mark.parametrize("keys, changed", [
    (("m", "2", "enter"), {"accum": 2}),
    (("l", "0", "full_stop", "5", "enter", "g", "1", "enter"), {"lr_scale": 0.5, "clip": 1.0}),
], ids=["accum", "lr_scale-then-clip"])
async def test_keys_typed_ahead_into_the_error_screens_prompts_set_the_restarts_options(keys, changed) -> None:
    """The error screen's number keys open their prompts as the main screen's do: ``m 2 Enter`` typed fast put
    the 2 nowhere and the Enter on the focused Restart button, which restarted the run with accum unchanged."""
    link = FakeLink()
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        link.push(protocol.NonFinite(121, "forward", "blocks.2.mlp.fc", "output of blocks.2.mlp.fc is nan", "non-finite output"))
        app.poll_now()
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ErrorScreen)
        await type_fast(app, pilot, *keys)
        assert app.screen is screen and screen.changed == changed
        assert link.restarts == []


@pytest.mark.parametrize("keys, sent", [
    (("a", "m", "2", "enter"), [protocol.SetCommand("amp", "bf16"), protocol.SetCommand("accum", 2)]),
    (("s", "l", "0", "full_stop", "5", "enter"), [protocol.SaveCheckpointCommand(), protocol.SetCommand("lr_scale", 0.5)]),
    (("space", "g", "1", "enter", "c"), [protocol.PauseCommand(), protocol.SetCommand("clip", 1.0),
                                        protocol.SetCommand("checkpointing", True)]),
], ids=["amp-then-accum", "save-then-lr_scale", "pause-then-clip-then-checkpointing"])
async def test_a_key_typed_just_before_a_prompts_key_acts_first(keys, sent) -> None:
    """``a m 2 Enter`` typed fast set accum to 2 and lost the ``a``: a key without priority is looked up only once
    it has bubbled up from the focused widget, and by then ``m`` (acted on when it arrived) had opened its prompt,
    which keeps the main screen's keys from it. Each main-screen key acts when it arrives, in the order typed."""
    link = FakeLink()
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await type_fast(app, pilot, *keys)
        assert not isinstance(app.screen, OptionPrompt)
        assert link.sent == sent


@pytest.mark.parametrize("opens, shown, closes", [
    ("question_mark", HelpScreen, "q"),
    ("question_mark", HelpScreen, "question_mark"),
    ("i", ImpactScreen, "i"),
    ("i", ImpactScreen, "q"),
    ("t", SystemScreen, "t"),
    ("M", MemoryScreen, "M"),
    ("P", ProfileListScreen, "P"),
])
async def test_a_screen_over_the_main_one_keeps_its_own_keys_and_the_main_ones_do_nothing_there(opens, shown, closes) -> None:
    """The main screen's keys act when they arrive, yet only while it is on top: ``q`` closes help rather than
    quitting, ``i`` closes the impact table it opened, and ``a``, space, ``s``, ``m`` on a view send nothing and
    open no prompt."""
    link = FakeLink()
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(opens)
        assert isinstance(app.screen, shown)
        await pilot.press("a", "space", "s", "m")
        assert isinstance(app.screen, shown) and link.sent == []
        await pilot.press(closes)
        await app.workers.wait_for_complete()
        assert not isinstance(app.screen, shown) and link.closed is None  # closed, not quit
        await pilot.press("a")
        assert link.sent == [protocol.SetCommand("amp", "bf16")]


async def test_the_main_screens_keys_typed_into_the_command_palette_are_its_search() -> None:
    link = FakeLink()
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+p")
        assert isinstance(app.screen, CommandPalette)
        await pilot.press("s", "a", "space", "q", "m", "question_mark")
        assert app.screen.query_one(Input).value == "sa qm?"
        await app.workers.wait_for_complete()
        assert isinstance(app.screen, CommandPalette) and link.sent == [] and link.closed is None


async def test_ctrl_q_quits_from_a_screen_over_the_main_one() -> None:
    """ctrl+q is the app's, not the main screen's: it quits from help as from anywhere."""
    link = FakeLink()
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("ctrl+q")
        await app.workers.wait_for_complete()
        assert link.closed == {"detach": False}  # here: leaving run_test closes the link whatever was pressed


@pytest.mark.parametrize("keys", [
    ("question_mark", "q", "a"),
    ("question_mark", "escape", "a"),
    ("i", "i", "a"),
    ("t", "t", "a"),
    ("M", "M", "a"),
    ("P", "escape", "a"),
])
async def test_a_key_typed_just_after_a_views_closing_key_acts_on_the_main_screen(keys) -> None:
    """A view closes as its closing key arrives, so the key typed after it, however fast, acts on the main screen."""
    link = FakeLink()
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await type_fast(app, pilot, *keys)
        assert app.screen is app.screen_stack[0]
        assert link.sent == [protocol.SetCommand("amp", "bf16")]


@pytest.mark.parametrize("keys, sent", [
    (("question_mark", "escape", "m", "2", "enter"), [protocol.SetCommand("accum", 2)]),
    (("i", "escape", "l", "0", "full_stop", "5", "enter"), [protocol.SetCommand("lr_scale", 0.5)]),
    (("i", "i", "m", "2", "enter"), [protocol.SetCommand("accum", 2)]),
    (("question_mark", "q", "a", "m", "2", "enter"), [protocol.SetCommand("amp", "bf16"), protocol.SetCommand("accum", 2)]),
    (("t", "t", "g", "1", "enter"), [protocol.SetCommand("clip", 1.0)]),
    (("M", "q", "m", "2", "enter"), [protocol.SetCommand("accum", 2)]),
    (("P", "P", "l", "2", "enter"), [protocol.SetCommand("lr_scale", 2.0)]),
], ids=["help-esc", "impact-esc", "impact-i", "help-q-then-amp", "system-t", "memory-q", "profiles-P"])
async def test_a_prompt_opened_in_the_burst_that_closes_a_view_gets_the_keys_typed_after_it(keys, sent) -> None:
    """``? Esc m 2 Enter`` typed fast sent nothing: the keys after Esc reached help, which was still on top (its
    Esc, without priority, was on its way up to the app), came up to the app once it had closed, and there ``m``
    opened the accum prompt, while ``2``, come up behind it, was looked up as the prompt's key and lost."""
    link = FakeLink()
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await type_fast(app, pilot, *keys)
        assert app.screen is app.screen_stack[0]
        assert link.sent == sent


@pytest.mark.parametrize("keys", [
    ("question_mark", "a", "o", "q"),
    ("question_mark", "m", "2", "v", "escape"),
    ("i", "s", "down", "space", "i"),
    ("t", "a", "o", "escape"),
    ("M", "v", "M"),
    ("P", "m", "o", "P"),
])
async def test_keys_typed_on_a_view_before_its_closing_key_stay_the_views(keys) -> None:
    """The main screen's keys do nothing on a view. Typed fast on one just before the key that closes it, as it
    arrives, they reach the view after it has closed, and are not the main screen's either: ``o`` does not sort
    the gradient table, ``v`` does not group it, ``down`` does not move its cursor."""
    link = FakeLink()
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        grads = app.query_one(GradTable)
        await type_fast(app, pilot, *keys)
        await app.workers.wait_for_complete()
        assert app.screen is app.screen_stack[0]
        assert (grads.sort_by, grads.grouped, grads.table.cursor_row) == ("order", False, 0)
        assert link.sent == [] and link.closed is None


async def test_every_key_typed_fast_after_slash_goes_into_the_gradient_filter() -> None:
    """``/blocks`` typed fast opened the lr× prompt: ``/`` focused the filter only once it had come up to the
    app, and ``l``, routed before that, was the main screen's key."""
    link = FakeLink()
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await type_fast(app, pilot, "slash", *"blocks.0.mlp")
        assert not isinstance(app.screen, OptionPrompt)
        assert app.query_one("#grad-filter", Input).value == "blocks.0.mlp"
        assert link.sent == []


async def test_an_editing_key_typed_fast_into_the_gradient_filter_acts_in_the_order_typed() -> None:
    """``/blockx BSpace s.1`` typed fast filtered by ``blockxs.``: the backspace, a binding, acted only once it had
    come up to the app, and deleted the 1 typed after it."""
    link = FakeLink()
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await type_fast(app, pilot, "slash", *"blockx", "backspace", "s", "full_stop", "1")
        assert app.query_one("#grad-filter", Input).value == "blocks.1"
        assert link.sent == []


@pytest.mark.parametrize("leave, shown", [("enter", "mlp"), ("escape", "")])
async def test_the_keys_typed_fast_after_leaving_the_gradient_filter_act_on_the_main_screen(leave, shown) -> None:
    """Enter keeps the filter, Esc clears it; either way the keys typed after it are the main screen's again."""
    link = FakeLink()
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await type_fast(app, pilot, "slash", *"mlp", leave, "a", "m", "2", "enter")
        assert app.query_one("#grad-filter", Input).value == shown
        assert app.focused is app.query_one(GradTable).table
        assert link.sent == [protocol.SetCommand("amp", "bf16"), protocol.SetCommand("accum", 2)]


@pytest.mark.parametrize("typed, sent", [
    ("?\x1bm2\r", [protocol.SetCommand("accum", 2)]),
    ("i\x1bl0.5\r", [protocol.SetCommand("lr_scale", 0.5)]),
    ("m5\x1ba", [protocol.SetCommand("amp", "bf16")]),
], ids=["help-esc-accum", "impact-esc-lr_scale", "prompt-esc-amp"])
async def test_esc_with_a_key_close_behind_it_acts_as_the_two_keys_typed(typed, sent) -> None:
    """A terminal sends Esc as one byte, and Alt+m as Esc then m: Textual reads an Esc with a key close behind it
    as Alt and that key. ``? Esc m 2 Enter`` in one tmux send-keys reached the app as ``? alt+m 2 Enter``, and help
    stayed open. The bytes here are what tmux writes; the keys are as the app's terminal parser reads them."""
    from textual._xterm_parser import XTermParser

    parser = XTermParser(debug=False)
    keys = [token for token in parser.feed(typed) if isinstance(token, events.Key)]
    keys += [token for token in parser.feed("") if isinstance(token, events.Key)]  # the end: the Esc's wait is over
    assert any(key.key.startswith("alt+") for key in keys)
    link = FakeLink()
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        for key in keys:
            app.post_message(key)
        await pilot.pause()
        await pilot.pause()
        assert app.screen is app.screen_stack[0]
        assert link.sent == sent


async def test_a_prompts_answer_is_sent_before_the_keys_typed_after_its_enter() -> None:
    """The answer went through a dismiss callback, run later from another queue than the keys': ``g BSpace 1 Enter
    a c`` typed fast sent amp before clip."""
    link = FakeLink()
    app = quiet_app(link)
    async with app.run_test(size=SIZE) as pilot:
        await type_fast(app, pilot, "g", "backspace", "1", "enter", "a", "c")
        assert link.sent == [protocol.SetCommand("clip", 1.0), protocol.SetCommand("amp", "bf16"),
                             protocol.SetCommand("checkpointing", True)]


async def test_keys_typed_before_the_trainers_welcome_are_sent_in_order_said_queued_and_their_answers_notified() -> None:
    """``m 2 Enter`` typed as the screen shows, while the trainer still loads torch, was refused ("set: the trainer is
    still starting; try again in a moment"). It is sent, in the order typed (the link and the trainer keep it for
    the trainer's first step boundary), and said so; the trainer's answers come in the past its stream begins with
    (its first boundary is passed before this app's stream starts), and are notices, as the news they are to it."""
    link = FakeLink([])
    app = quiet_app(link)
    logged = []
    take_log = app.run_state.take_log
    app.run_state.take_log = lambda: (entries := take_log(), logged.extend(entries))[0]  # type: ignore[method-assign]
    async with app.run_test(size=SIZE) as pilot:
        await type_fast(app, pilot, "m", "2", "enter", "a", "space")
        assert link.sent == [protocol.SetCommand("accum", 2), protocol.SetCommand("amp", "bf16"), protocol.PauseCommand()]
        lines = [line[9:] for line in app.query_one(EventLog).lines_written]
        assert lines == ["accum = 2: queued, applied at the first step boundary",
                         "amp = bf16: queued, applied at the first step boundary",
                         "pause requested (queued, applied at the first step boundary)"]
        assert not any(entry.level == "refused" for entry in logged)
        link.queue = []  # as the trainer answers: at step 1, in the past its stream begins with (the fake link would
        app.run_state.apply_all([welcome(0, state="starting"),  # end the past at the welcome)
                                 protocol.OptionApplied("accum", 2, 1, 1, "app"), protocol.OptionApplied("amp", "bf16", "off", 1, "app"),
                                 protocol.Replayed(events=2), protocol.State("paused", 0)])
        app.poll_now()
        await pilot.pause()
        assert app.run_state.options["accum"] == 2 and not app.run_state.pending and app.run_state.state == "paused"
        notices = [entry.text for entry in logged if entry.notify]
        assert "accum = 2 applied at step 1 (was 1)" in notices and "amp = bf16 applied at step 1 (was off)" in notices
        assert not any("earlier events" in notice for notice in notices)  # they are not an attach's past
