"""The live options in force, each with the key that changes it; a requested change shows as pending."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from torchlab.core.wire.options import LIVE_OPTIONS, LiveOption
from torchlab.tui.state import RunState

class OptionsPanel(Static):
    """Every live option in force, in the registry's order; one line when ``compact``."""

    DEFAULT_CSS = """
    OptionsPanel {
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    compact: reactive[bool] = reactive(False)
    """One line (``amp off · ckpt on · …``) instead of a key/label/value table: for small terminals. It has the
    options whose keys the footer shows, and the others only where they are not off or at their default
    (``compile on``, ``workers 2``, ``ws 2``): nine options do not fit in 80 columns."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._state: RunState | None = None

    def show(self, state: RunState) -> None:
        self._state = state
        self.update(self._render_text(state))

    def watch_compact(self) -> None:
        if self._state is not None:
            self.update(self._render_text(self._state))

    def _render_text(self, state: RunState) -> Text:
        text = Text()
        options = LIVE_OPTIONS if not self.compact else [option for option in LIVE_OPTIONS if _on_the_line(option, state)]
        for index, option in enumerate(options):
            shown = option.format(state.options[option.name]) if option.name in state.options else "–"
            if self.compact:
                if index:
                    text.append(" · ", style="dim")
                text.append(f"{option.short} ", style="dim")
                text.append(shown, style="bold")
            else:
                if index:
                    text.append("\n")
                text.append(f" {option.key} ", style="bold reverse")
                text.append(f" {option.label:<14}", style="dim")
                text.append(shown, style="bold")
            if option.name in state.pending:
                text.append(f" → {option.format(state.pending[option.name])}…", style="italic yellow")
        return text


def _on_the_line(option: LiveOption, state: RunState) -> bool:
    """Whether the one-line panel shows ``option``: a footer key's always, another one changed or being changed."""
    value = state.options.get(option.name)
    return option.in_footer or option.name in state.pending or not (value is None or value is False or value == option.default)
