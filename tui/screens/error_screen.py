"""The run failed: say why, show the traceback or the non-finite report, and offer a way on, with the
options the restart should train with (a NaN is often fixed by a lower LR scale or clipping, before the
restart reproduces it). A failure told in a paragraph alone (a refused directory, a full disk, a workload
that cannot load) has no panel below it: there is nothing more to read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

from torchlab.core.errors import printable
from torchlab.core.options import LIVE_OPTIONS, OPTIONS_BY_NAME, Choice, Number, Switch
from torchlab.core.wire.run_status import RunStatus
from torchlab.tui.state import Failure

#: What the screen dismisses with, besides a ``Restart``.
CLOSE, QUIT = "close", "quit"


@dataclass(frozen=True)
class Restart:
    """Restart the run; ``options`` set on the screen apply from the restarted trainer's first step."""

    options: dict[str, Any] = field(default_factory=dict)


class ErrorScreen(ModalScreen[Restart | str]):
    """Shows a ``Failure``; dismisses with a ``Restart``, "close" (look at the run) or "quit".

    With the run's ``options`` given, each live option's key sets it for the restart, as on the main screen
    (a mode or a switch cycles, a number is asked for), generated from the registry like the main screen's.
    The app underneath keeps draining the link and drawing, so the curves up to the failure stay visible
    behind the dialog and after it closes.
    """

    DEFAULT_CSS = """
    ErrorScreen {
        align: center middle;
        background: $background 60%;
    }
    ErrorScreen > #error-dialog {
        width: 90%;
        max-width: 120;
        height: 90%;
        border: thick $error;
        background: $surface;
        padding: 0 1;
    }
    ErrorScreen #error-title { text-style: bold; color: $error; width: 1fr; }
    ErrorScreen #error-message { width: 1fr; margin-bottom: 1; }
    ErrorScreen #error-detail-scroll { height: 1fr; border: round $panel; }
    ErrorScreen #error-options-title { color: $text-muted; width: 1fr; margin-top: 1; }
    ErrorScreen #error-options { grid-size: 3; grid-gutter: 0 1; height: auto; }
    ErrorScreen #error-options Static { height: 1; text-wrap: nowrap; text-overflow: ellipsis; }
    ErrorScreen #error-keys { color: $text-muted; width: 1fr; }
    ErrorScreen #error-buttons { height: auto; align-horizontal: right; }
    ErrorScreen #error-buttons Button { margin-left: 1; min-width: 10; }
    /* On a short terminal (80x24) every row goes to the report: at 90% it had one, cut before the step. */
    ErrorScreen.-short > #error-dialog { width: 100%; height: 100%; }
    ErrorScreen.-short #error-message { margin-bottom: 0; }
    ErrorScreen.-short #error-options-title { margin-top: 0; }
    /* A paragraph alone (no traceback, no report) takes the rows it needs, on any terminal. */
    ErrorScreen.-paragraph > #error-dialog { height: auto; max-height: 100%; }
    """

    AUTO_FOCUS = "#restart"  # on activation, by Textual: also safe when a key dismisses it at once

    #: With priority, each key acts when it arrives, in the order typed: a number's key opens its prompt before
    #: the keys typed after it are routed (see ``prompt.open_prompt``). The screen has no text field to take them.
    BINDINGS = [
        Binding("r", "restart", "Restart", priority=True),
        Binding("escape", "choose('close')", "Close", priority=True),
        Binding("q", "choose('quit')", "Quit", priority=True),
        *(Binding(option.key, f"set_option('{option.name}')", option.footer, show=False, priority=True)
          for option in LIVE_OPTIONS),
    ]

    def __init__(self, failure: Failure, restart_from: str | None = None, options: dict[str, Any] | None = None,
                 refused: Callable[[str, Any], bool] = lambda option, value: False) -> None:
        """``restart_from``: the checkpoint a restart resumes from (None: there is none, it starts over).
        ``options``: the live options the restart would train with; None where a restart cannot take any
        (the trainer never started). ``refused``: whether a mode's key skips ``option = value`` on this run, by
        the main screen's rule (``RunState.skips``: refused, or one the device does not allow, fp16 on a CPU)."""
        super().__init__()
        self.failure = failure
        self.restart_from = restart_from
        self.options = options
        self.refused = refused
        #: option -> the value set on this screen, where it differs from ``options``
        self.changed: dict[str, Any] = {}

    def compose(self) -> ComposeResult:
        failure = self.failure
        title = "The run stopped on a non-finite value" if failure.kind == RunStatus.NONFINITE else "The run failed"
        step = f" at step {failure.step}" if failure.step is not None else ""
        with Vertical(id="error-dialog"):
            yield Label(f"{title}{step}", id="error-title")
            yield Static(Text(printable(failure.message, keep_lines=True)), id="error-message")
            if failure.detail:
                with VerticalScroll(id="error-detail-scroll"):
                    yield Static(Text(printable(failure.detail, keep_lines=True)), id="error-detail")
            else:
                self.add_class("-paragraph")
            if self.options is not None:
                yield Label("The restart's options, from its first step (their keys set them):", id="error-options-title")
                with Grid(id="error-options"):
                    for option in LIVE_OPTIONS:
                        yield Static(self._option_text(option.name), id=f"error-option-{option.name}")
            restart = f"r restarts from {self.restart_from}" if self.restart_from else "r starts the run over (no checkpoint yet)"
            yield Label(f"{restart} · esc closes this to look at the run · q quits", id="error-keys")
            with Horizontal(id="error-buttons"):
                yield Button("Restart", id="restart", variant="primary",
                             tooltip=f"Start a new trainer from {self.restart_from}" if self.restart_from else "Start the run over")
                yield Button("Close", id="close")
                yield Button("Quit", id="quit", variant="error")

    def value(self, name: str) -> Any:
        """The value the restart would train with: set here, else the run's."""
        return self.changed[name] if name in self.changed else (self.options or {}).get(name)

    def _option_text(self, name: str) -> Text:
        option = OPTIONS_BY_NAME[name]
        text = Text.assemble((f"{option.key} ", "bold"), (f"{option.short} ", "dim"))
        before = (self.options or {}).get(name, option.default)
        if name in self.changed:
            text.append(f"{option.format(before)} → ", style="dim")
            text.append(option.format(self.changed[name]), style="bold yellow")
        else:
            text.append(option.format(before), style="bold")
        return text

    def _set(self, name: str, value: Any) -> None:
        before = (self.options or {}).get(name, OPTIONS_BY_NAME[name].default)
        if OPTIONS_BY_NAME[name].format(value) == OPTIONS_BY_NAME[name].format(before):
            self.changed.pop(name, None)  # set back to what it was: nothing to change
        else:
            self.changed[name] = value
        self.query_one(f"#error-option-{name}", Static).update(self._option_text(name))

    async def action_set_option(self, name: str) -> None:
        if self.options is None:
            return
        option = OPTIONS_BY_NAME[name]
        current = self.value(name)
        if isinstance(option, (Choice, Switch)):
            self._set(name, option.next_value(current, lambda value: self.refused(name, value)))
        elif isinstance(option, Number):
            await self._ask(name, option, current)

    async def _ask(self, name: str, option: Number, current: Any) -> None:
        from torchlab.tui.screens.prompt import Chosen, OptionPrompt, open_prompt

        def chosen(answer: Chosen | None) -> None:
            if answer is not None:
                self._set(name, answer.value)

        await open_prompt(self.app, OptionPrompt(f"{option.prompt}, for the restart", option.hint, option.parse,
                                                 current=option.shown_in_prompt(current)), chosen)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "restart":
            self.action_restart()
        else:
            self.dismiss(event.button.id or CLOSE)

    def action_restart(self) -> None:
        self.dismiss(Restart(dict(self.changed)))

    def action_choose(self, choice: str) -> None:
        self.dismiss(choice)
