"""A one-field dialog (a live option's value, a trial to run): it checks what is typed as the trainer would
before anything is sent."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, Static

from torchlab.core.wire.options import OptionRefused


@dataclass(frozen=True)
class Chosen:
    """The prompt's answer: the value typed, parsed (None is a value too: clip's "off")."""

    value: Any


class OptionPrompt(ModalScreen[Chosen | None]):
    """Asks for a value; dismisses with it parsed by ``parse``, or with None when cancelled.

    ``parse`` raises OptionRefused with what is wrong. For a live option it is the option's own parser, the
    one the trainer applies, so what it accepts here is what the trainer will accept (except for facts only
    the trainer knows, like the device).
    """

    DEFAULT_CSS = """
    OptionPrompt {
        align: center middle;
        background: $background 60%;
    }
    OptionPrompt > #dialog {
        width: 60;
        max-width: 95%;
        height: auto;
        border: thick $primary;
        background: $surface;
        padding: 0 1;
    }
    OptionPrompt #prompt-title { text-style: bold; width: 1fr; }
    OptionPrompt #prompt-hint { color: $text-muted; width: 1fr; }
    OptionPrompt #prompt-error { color: $error; height: auto; width: 1fr; }
    OptionPrompt #prompt-keys { color: $text-muted; width: 1fr; }
    """

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, hint: str, parse: Callable[[str], Any], *, current: str = "") -> None:
        super().__init__()
        self.title_text, self.hint = title, hint
        self.parse = parse
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            # Hints and refusals are plain text: "OPTION=VALUE [STEPS]" read as markup lost its "[STEPS]".
            yield Label(self.title_text, id="prompt-title")
            yield Label(self.hint, id="prompt-hint", markup=False)
            yield Input(value=self.current, id="prompt-input", select_on_focus=True)
            yield Static("", id="prompt-error", markup=False)
            yield Label("enter apply · esc cancel", id="prompt-keys")

    @property
    def error_text(self) -> str:
        """What is wrong with the input, as shown; empty when nothing is."""
        return str(self.query_one("#prompt-error", Static).content)

    @on(Input.Submitted, "#prompt-input")
    def _submitted(self, event: Input.Submitted) -> None:
        try:
            value = self.parse(event.value.strip())
        except OptionRefused as refusal:
            self.query_one("#prompt-error", Static).update(str(refusal))
            return
        self.dismiss(Chosen(value))

    @on(Input.Changed, "#prompt-input")
    def _changed(self) -> None:
        self.query_one("#prompt-error", Static).update("")

    def action_cancel(self) -> None:
        self.dismiss(None)
