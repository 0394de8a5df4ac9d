"""The live options in force, each with the key that changes it; a requested change shows as pending."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from torchlab.core.wire.options import format_option_value
from torchlab.tui.state import RunState

#: (option, label, short label for the one-line form, key)
OPTION_ROWS = (
    ("amp", "amp", "amp", "a"),
    ("checkpointing", "checkpointing", "ckpt", "c"),
    ("clip", "clip norm", "clip", "g"),
    ("accum", "accumulation", "accum", "m"),
    ("lr_scale", "lr scale", "lr×", "l"),
    ("world_size", "world size", "ws", "w"),
)


class OptionsPanel(Static):
    """Current amp / checkpointing / clip / accum / lr scale / world size; one line when ``compact``."""

    DEFAULT_CSS = """
    OptionsPanel {
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    compact: reactive[bool] = reactive(False)
    """One line (``amp off · ckpt on · …``) instead of a key/label/value table: for small terminals."""

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
        for index, (option, label, short, key) in enumerate(OPTION_ROWS):
            current = state.options.get(option)
            shown = format_option_value(option, current) if option in state.options else "–"
            if self.compact:
                if index:
                    text.append(" · ", style="dim")
                text.append(f"{short} ", style="dim")
                text.append(shown, style="bold")
            else:
                if index:
                    text.append("\n")
                text.append(f" {key} ", style="bold reverse")
                text.append(f" {label:<14}", style="dim")
                text.append(shown, style="bold")
            if option in state.pending:
                text.append(f" → {format_option_value(option, state.pending[option])}…", style="italic yellow")
        return text
