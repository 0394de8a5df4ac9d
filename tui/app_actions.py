"""What the workbench's keys do (``app_keys.KEY_ACTIONS`` says which key runs which), and how a command
reaches the trainer.

A part of ``TorchlabApp`` (app.py), split off so that each module holds one job: the app holds the state, the
link and the drawing; this class its actions, the command palette's entries and ``send``. Every request is
logged as requested at once, then acknowledged with the step it took effect at (or refused with the trainer's
reason) when the answer arrives; a prompt submitted with the value it showed sends nothing and says so. A
request that can go nowhere (a read-only view, a run that has ended, no trainer to connect to) is refused here,
in words, before a prompt asks for a value. One made while the trainer starts is queued, and said so: the link
and the trainer keep it, in the order typed, for the trainer's first step boundary.

A mixin rather than a separate object: Textual looks actions up on the app (``action_*``, ``check_action``,
``get_system_commands``), so they are the app's methods wherever they are written.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from textual.app import SystemCommand
from textual.screen import ModalScreen, Screen

from torchlab.core.analysis.trial_words import TRIAL_HINT, parse_trial
from torchlab.core.wire import protocol
from torchlab.core.options import CHECKPOINTING, OPTIONS_BY_NAME, Number, OptionChangeError, format_option_value
from torchlab.core.wire.protocol import DEFAULT_PROFILE_STEPS
from torchlab.core.wire.run_status import RunStatus
from torchlab.tui.app_keys import KEY_ACTIONS, READ_ONLY_ACTION, TRAINER_ACTIONS, VIEW_ACTIONS, action_name
from torchlab.tui.log_levels import EntryLevel
from torchlab.tui.names import describe_blocks
from torchlab.tui.widgets.charts import SPEED, Charts


class KeyActions:
    """The actions of ``TorchlabApp``: its keys, its palette entries, and ``send``."""

    # ------------------------------------------------------------------ sending

    def _refuse_in_view(self, subject: str) -> bool:
        """True, said at once, when this app is a read-only view (before a prompt asks for a value that would
        go nowhere)."""
        if not self.read_only:
            return False
        self.refuse_request(f"{subject}: read-only view (the controlling app changes the run)")
        return True

    def send(self, command: protocol.Message) -> bool:
        """Send a command to the trainer; False (and a message saying why) when there is no trainer to send to."""
        if self._refuse_in_view(_command_subject(command)) or self._run_has_ended(_command_subject(command)):
            return False
        if self.link is None or self._link_closed:
            self.refuse_request(f"{_command_subject(command)}: no trainer is connected")
            return False
        # Before the trainer's welcome (torch still loading) the command is sent all the same: the link keeps it until
        # it connects and the trainer until it is built, in the order typed, for its first step boundary (queued).
        try:
            self.link.send(command)
        except Exception as error:  # told to the user; the app goes on
            self.run_state.log(EntryLevel.ERROR, f"could not send {command.type} to the trainer: {error}", notify=True)
            self._refresh_view()
            return False
        return True

    def _run_has_ended(self, subject: str) -> bool:
        """True, said at once as space says it, when no trainer is left to answer (the link would only say
        later that nothing is connected, after the app had logged the request as sent)."""
        ended = self.run_state.ended
        if ended is None:
            return False
        self.refuse_request(f"{subject}: {ended}; nothing was sent")
        return True

    # ------------------------------------------------------------------ keys

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if (action in TRAINER_ACTIONS or action in VIEW_ACTIONS) and isinstance(self.screen, ModalScreen):
            return False
        if action in TRAINER_ACTIONS and self.read_only:  # a viewer's footer lists only the keys that work for it
            return False
        if action == READ_ONLY_ACTION:  # instead, in a viewer, the key is refused in words (app_keys)
            return self.read_only
        return True

    def action_refuse_read_only(self, subject: str) -> None:
        """A viewer's key that would change the run: refused on the spot, saying the view is read-only."""
        self._refuse_in_view(subject)

    def action_toggle_pause(self) -> None:
        state = self.run_state.state
        if state == RunStatus.PAUSED:
            if self.send(protocol.ResumeCommand()):
                self._requested("resume requested")
        # While relaunching: the new ranks start paused; while connecting: the run does, at its first step boundary.
        elif state in (RunStatus.RUNNING, RunStatus.STARTING, RunStatus.RELAUNCHING, RunStatus.CONNECTING):
            if self.send(protocol.PauseCommand()):
                self._requested(f"pause requested ({self._when('takes effect at the end of the current step')})")
        else:
            why = self.run_state.ended or f"the run is {state}"
            self.notify(f"{why}: there is nothing to pause or resume", severity="warning")

    async def action_change_option(self, name: str) -> None:
        """An option's key: the next value of a mode or a switch, or a prompt for a number."""
        option = OPTIONS_BY_NAME[name]
        if self._refuse_in_view(name) or self._run_has_ended(name):  # before a prompt asks for a value that would go nowhere
            return
        current = self.run_state.option(name)
        if not isinstance(option, Number):
            self._next_value(name, current)
            return

        from torchlab.tui.screens.prompt import Chosen, OptionPrompt, open_prompt

        def chosen(answer: Chosen | None) -> None:
            if answer is None:
                return
            if answer.value == current:  # Enter on the value shown: "applied (was 1)" would say a change was made
                self._requested(f"{name} stays {format_option_value(name, current)}: nothing sent")
            else:
                self.set_option(name, answer.value)

        def parse(text: str) -> Any:  # as the option parses it, then what this run would refuse, with the reason
            value = option.parse(text)
            reason = self.run_state.would_refuse(name, value)
            if reason is not None:
                raise OptionChangeError(reason)
            return value

        await open_prompt(self, OptionPrompt(option.prompt, option.hint, parse, current=option.shown_in_prompt(current)),
                          chosen)

    def _next_value(self, name: str, current: Any) -> None:
        """A mode's key cycles past the values this run would refuse or has refused (saying why once for each); a
        switch turned to a value the run would refuse says why and sends nothing."""
        option = OPTIONS_BY_NAME[name]
        state = self.run_state
        value = option.next_value(current, lambda value: state.skips(name, value))
        reason = state.would_refuse(name, value)
        if reason is not None:
            self.refuse_request(f"{name} = {option.format(value)} refused: {reason} (nothing sent)")
            return
        self._say_why_skipped(name, current, value)
        self.set_option(name, value)

    def _say_why_skipped(self, name: str, current: Any, chosen: Any) -> None:
        """Once a run, for each value a key's cycle skipped between ``current`` and ``chosen`` because the run would
        refuse it: a key that silently passes a mode by reads as a key that does not know the mode."""
        option = OPTIONS_BY_NAME[name]
        candidate = option.next_value(current, lambda value: False)
        while candidate != chosen:
            reason = self.run_state.would_refuse(name, candidate)
            if reason is not None and (name, candidate) not in self._skips_said:
                self._skips_said.add((name, candidate))
                self.run_state.log(EntryLevel.INFO, f"{name}: {option.format(candidate)} skipped: {reason}")
            candidate = option.next_value(candidate, lambda value: False)

    async def action_try_option(self) -> None:
        """A controlled trial: OPTION=VALUE [STEPS] typed, checked, and sent; the result comes to the log."""
        from torchlab.tui.screens.prompt import Chosen, OptionPrompt, open_prompt

        if self._refuse_in_view("trial") or self._run_has_ended("trial"):
            return

        def chosen(answer: Chosen | None) -> None:
            if answer is not None:
                self.request_trial(answer.value)

        bottleneck = self.run_state.bottleneck.current  # where the time goes: its change, offered to be trialled
        offered = bottleneck.trial if bottleneck is not None and bottleneck.trial is not None else ""
        await open_prompt(self, OptionPrompt("Try an option for a few steps, then undo it", TRIAL_HINT, parse_trial,
                                             current=offered), chosen)

    def request_trial(self, command: protocol.TrialCommand, why: str = "") -> None:
        """Send a controlled trial and log it as requested: the trial prompt's and the impact view's ``T`` (the row's
        change; ``why`` says how it was chosen from the row)."""
        if self.send(command):
            self._requested(f"trial of {command.option} = {command.value} for {command.steps} steps requested{why} "
                            f"({self._when('from the next step boundary')}; training waits for it)")

    def refuse_request(self, text: str) -> None:
        """A request the app will not send, with the reason: in the log, and as a toast."""
        self.run_state.log(EntryLevel.REFUSED, text, notify=True)
        self._refresh_view()

    def set_option(self, option: str, value: Any) -> None:
        """Ask the trainer to change a live option at the next step boundary, saying what the forecast predicts of it;
        one predicted not to fit is refused with the figures until it is asked for again (its key pressed again,
        its value entered again): the memory a change will take is said before it is paid for."""
        check = self.run_state.forecast_check(option, value)
        if check.over is not None and self._confirming != (option, value):
            self._confirming = (option, value)
            again = (f"press {OPTIONS_BY_NAME[option].key} again" if not isinstance(OPTIONS_BY_NAME[option], Number)
                     else "enter it again")
            self.refuse_request(f"{check.over}: nothing sent; {again} to apply it all the same")
            return
        self._confirming = None
        if self.send(protocol.SetCommand(option, value)):
            self.run_state.note_request(option, value, check.words)
            self._refresh_view()

    def action_next_chart(self) -> None:
        shown = self.query_one(Charts).next_chart()
        if shown == SPEED and not self.run_state.workload_metrics:  # in the log too: a toast alone read as nothing done
            self.run_state.log(EntryLevel.INFO, "chart: the workload reports no metrics of its own: return {\"loss\": ..., "
                               "\"accuracy\": ...} from loss_fn to chart them", notify=True, toast="no workload metrics to chart")
            self._refresh_view()

    def action_profile(self) -> None:
        if self.send(protocol.ProfileCommand(steps=DEFAULT_PROFILE_STEPS)):
            self.run_state.note_profile_request()
            self._requested(f"profiler snapshot of the next {DEFAULT_PROFILE_STEPS} steps requested"
                            + (f" ({self.run_state.queued})" if self.run_state.queued else ""))

    def action_save_checkpoint(self) -> None:
        if self.send(protocol.SaveCheckpointCommand()):
            self._requested(f"checkpoint requested ({self._when('saved at the end of the current step')})")

    def action_detach(self) -> None:
        self.run_state.detach_requested = True
        if self.send(protocol.DetachCommand()):
            self._requested("detach requested: the app leaves once the trainer confirms")

    # The views are imported when first opened: they are not part of the first frame (start-up time).

    def action_profiles(self) -> None:
        from torchlab.tui.screens.profile_screens import ProfileListScreen

        self.push_screen(ProfileListScreen(self.run_state))

    def action_impact(self) -> None:
        from torchlab.tui.screens.impact_screen import ImpactScreen

        self.push_screen(ImpactScreen(self.run_state))

    def action_what_fits(self) -> None:
        from torchlab.tui.screens.fits_screen import FitsScreen

        self.request_forecast()
        self.push_screen(FitsScreen(self.run_state))

    def request_forecast(self) -> None:
        """Ask the trainer, once, for the memory of the settings in force and of the changes worth weighing: the "what
        fits" view lists them and each key says its own before it is sent. Said nowhere where it cannot be asked (a
        read-only view, a run that ended): the view says nothing is predicted."""
        state = self.run_state
        if state.forecast_requested or self.read_only or state.ended is not None or self.link is None or self._link_closed:
            return
        try:
            self.link.send(protocol.ForecastCommand())
        except Exception:  # the link says what broke it at its next drain
            return
        state.forecast_requested = True

    def _forecast_once_settled(self) -> None:
        """Once the run has trained ``forecast_after_s`` (this app's clock, from the first time it saw it training), ask
        for the predictions unasked: a run's first seconds (compiling, warming up) are left to it."""
        if self.forecast_after_s is None or self.run_state.forecast_requested or self.run_state.state != RunStatus.RUNNING:
            return
        now = time.monotonic()
        if self._training_since is None:
            self._training_since = now
        if now - self._training_since >= self.forecast_after_s:
            self.request_forecast()

    def action_memory(self) -> None:
        from torchlab.tui.screens.memory_screen import MemoryScreen

        self.push_screen(MemoryScreen(self.run_state))

    def action_compile_report(self) -> None:
        from torchlab.tui.screens.compile_screen import CompileScreen

        self.push_screen(CompileScreen(self.run_state))

    def action_time(self) -> None:
        from torchlab.tui.screens.time_screen import TimeScreen

        self.push_screen(TimeScreen(self.run_state))

    def action_heatmap(self) -> None:
        from torchlab.tui.screens.heatmap_screen import HeatmapScreen

        self.push_screen(HeatmapScreen(self.run_state))

    def action_system(self) -> None:
        from torchlab.tui.screens.system_screen import SystemScreen

        self.push_screen(SystemScreen(self.run_state))

    def action_help(self) -> None:
        blocks = self.run_state.checkpoint_blocks
        wraps = {CHECKPOINTING.key: f": {describe_blocks(blocks)}" if blocks else " (which ones: once the trainer has said)"}
        keys = [(k.key_display or k.key, k.help + wraps.get(k.key, "")) for k in KEY_ACTIONS
                if not (self.read_only and action_name(k) in TRAINER_ACTIONS)]  # a viewer's keys only
        keys += [("/", "Filter the gradient table by module name (enter/esc back)"), ("o", "Cycle the gradient table's sort"),
                 ("v", "Grouped / per-module gradient view"), ("enter", "On a group: show its modules"),
                 ("ctrl+p", "Command palette")]
        from torchlab.tui.screens.help_screen import HelpScreen

        self.push_screen(HelpScreen(keys))

    def _when(self, usual: str) -> str:
        """When a request takes effect: ``usual``, or, sent before the trainer's welcome, at its first boundary."""
        return self.run_state.queued or usual

    def _requested(self, text: str) -> None:
        self.run_state.log(EntryLevel.INFO, text)
        self._refresh_view()

    # ------------------------------------------------------------------ command palette

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for key in KEY_ACTIONS:
            if key.action in ("quit", "help") or (self.read_only and action_name(key) in TRAINER_ACTIONS):
                continue
            yield SystemCommand(key.help, f"key {key.key_display or key.key}", self._palette_callback(key.action))
        yield SystemCommand("Restart the trainer from the last checkpoint", "after a failure or a stop: resume the run",
                            self._restart_from_palette)
        yield SystemCommand("Compare with an earlier run of this workload", "the newest one before it, in the same runs folder",
                            self.compare_with_earlier_run)
        yield SystemCommand("Help: every key of the workbench", "key ?", self.action_help)

    def compare_with_earlier_run(self) -> None:
        """This run beside the newest earlier run of its workload (``torchlab-tui compare`` on the two)."""
        from torchlab.core.errors import ConfigError
        from torchlab.tui.run_history import RunHistory, earlier_run
        from torchlab.tui.screens.compare_screen import CompareScreen

        here = Path(self.run_state.run_dir) if self.run_state.run_dir else None
        before = earlier_run(here) if here is not None else None
        if before is None:
            where = here.parent if here is not None else "its runs folder"
            self.notify(f"no earlier run of this workload in {where} to compare with", severity="warning")
            return
        try:
            runs = [RunHistory.load(before), RunHistory.load(here)]
        except ConfigError as error:
            self.notify(str(error), severity="warning")
            return
        self.push_screen(CompareScreen(runs))

    def _restart_from_palette(self) -> None:
        """After a failure, the error screen again (its options go with the restart); else restart at once."""
        failure = self.run_state.failure
        if failure is not None and self.run_state.state == RunStatus.FAILED:
            self._show_failure(failure)
        else:
            self.restart_trainer()

    def _palette_callback(self, action: str) -> Callable[[], Any]:
        async def run() -> None:
            await self.run_action(action)

        return run


def _command_subject(command: protocol.Message) -> str:
    """What a command is about, as the user asked for it: the option's name, or the command's."""
    match command:
        case protocol.SetCommand():
            return command.option
        case protocol.TrialCommand():
            return "trial"
        case _:
            return command.type.replace("_", " ")
