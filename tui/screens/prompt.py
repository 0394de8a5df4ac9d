"""A one-field dialog (a live option's value, a trial to run): it checks what is typed as the trainer would
before anything is sent, and acts on the keys typed into it in the order they were typed, however fast."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from torchlab.core.options import OptionChangeError
from torchlab.tui.widgets.in_order_input import InOrderInput


@dataclass(frozen=True)
class Chosen:
    """The prompt's answer: the value typed, parsed (None is a value too: clip's "off")."""

    value: Any


class PromptField(InOrderInput):
    """The prompt's field: each key acts as it reaches it (``InOrderInput``), and Enter answers at once (``answer``),
    not through a message queued behind the keys after it. A key that reaches the field after the prompt was
    answered was typed for the screen beneath: it goes back to the app, which routes it there.
    """

    def __init__(self, value: str, answer: Callable[[str], None], **kwargs: Any) -> None:
        """``answer`` takes the field's text on Enter."""
        super().__init__(value=value, **kwargs)
        self.answer = answer

    async def _on_key(self, event: events.Key) -> None:
        if not self.screen.is_active:  # answered (or covered): the key is for the screen now on top
            event.stop()
            event.prevent_default()  # else InOrderInput's and Input's handlers, next in line, act on it here
            self.app.post_message(events.Key(event.key, event.character))

    async def action_submit(self) -> None:
        self.answer(self.value)


class OptionPrompt(ModalScreen[Chosen | None]):
    """Asks for a value; dismisses with it parsed by ``parse``, or with None when cancelled.

    ``parse`` raises OptionChangeError with what is wrong. For a live option it is the option's own parser, the
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
        #: what is done with the answer (``open_prompt`` sets it), as it is given
        self.chosen: Callable[[Chosen | None], None] = lambda answer: None

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            # Hints and refusals are plain text: "OPTION=VALUE [STEPS]" read as markup lost its "[STEPS]".
            yield Label(self.title_text, id="prompt-title")
            yield Label(self.hint, id="prompt-hint", markup=False)
            yield PromptField(self.current, self._submitted, id="prompt-input", select_on_focus=True)
            yield Static("", id="prompt-error", markup=False)
            yield Label("enter apply · esc cancel", id="prompt-keys")

    @property
    def error_text(self) -> str:
        """What is wrong with the input, as shown; empty when nothing is."""
        return str(self.query_one("#prompt-error", Static).content)

    def _submitted(self, text: str) -> None:
        try:
            value = self.parse(text.strip())
        except OptionChangeError as refusal:
            self.query_one("#prompt-error", Static).update(str(refusal))
            return
        self._answer(Chosen(value))

    def _answer(self, answer: Chosen | None) -> None:
        """Act on the answer now, then close: a dismiss callback runs later, from another queue than the keys', and
        in ``g BSpace 1 Enter a`` typed fast amp was sent before clip, or, in ``m 2 Enter m 4 Enter``, accum 2 after
        accum 4 (the second prompt showed the value before the first answer)."""
        self.chosen(answer)
        self.dismiss(answer)

    def on_mount(self) -> None:
        # A watcher runs as the value changes: Input.Changed, a message queued behind the keys of a burst,
        # cleared the refusal of an Enter that came after the edits it reported.
        self.watch(self.query_one(PromptField), "value", self._edited, init=False)

    def _edited(self) -> None:
        self.query_one("#prompt-error", Static).update("")

    def action_cancel(self) -> None:
        self._answer(None)


async def open_prompt(app: App[Any], prompt: OptionPrompt, chosen: Callable[[Chosen | None], None]) -> None:
    """Push ``prompt`` and return once its field has focus: every key typed after the one that opened it is its.

    The one way the app opens a prompt (the main screen's and the error screen's). Call it from the action of
    a key bound with priority, and await it. Keys typed fast (``m 2 Enter``) arrive together. A priority
    binding runs when its key arrives, before the next key is routed anywhere; and the app handles no further
    key until this returns. Without both, ``2`` went to a widget of the screen beneath or to the prompt before
    its field had focus, and was lost, while Enter, a binding looked up when it was handled, reached the field
    and sent the value shown: "accum = 1 applied (was 1)".
    """
    prompt.chosen = chosen
    await app.push_screen(prompt)
