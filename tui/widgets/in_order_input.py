"""A text field that acts on the keys typed into it in the order they were typed, however fast."""

from __future__ import annotations

from textual import events
from textual.widgets import Input

from torchlab.tui.key_order import act_on_key


class InOrderInput(Input):
    """An Input whose every key acts when it reaches the field, so a burst of keys acts in the order typed.

    Textual's Input types a character as it takes the key, while an editing key (backspace, home, enter) and a key
    of the screen around it (a dialog's esc) are bindings, acted on only once the key has bubbled up to the app.
    Keys that come together (tmux's ``send-keys BSpace 4 Enter``) are all in the field's queue by then: 4 replaced
    the selected value, the backspace then deleted the 4, and Enter submitted an empty field. Here a bound key runs
    its binding as it arrives. The bindings are the field's and those of the widgets around it, wherever the focus
    is by then: the gradient filter's Enter moves it to the table as it arrives, before the keys typed ahead of it
    have reached the field.
    """

    async def _on_key(self, event: events.Key) -> None:
        if not event.is_printable and await act_on_key(self, event.key):  # a printable one: Input's handler types it
            event.stop()
            event.prevent_default()
