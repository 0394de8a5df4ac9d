"""The live options in force, each with the key that changes it; a requested change shows as pending."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from torchlab.core.options import CHECKPOINTING, LIVE_OPTIONS, LiveOption
from torchlab.tui.formatting import fit_parts, parts_that_fit
from torchlab.tui.names import describe_blocks
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
    (``compile on``, ``workers 2``, ``ws 2``): nine options do not fit in 80 columns. Where they still do not
    fit, the options at their default make way first, and the line ends with how many it leaves out
    (``+2 more``): at 80 columns ``par fsdp`` was left out, with no word."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._state: RunState | None = None

    def show(self, state: RunState) -> None:
        self._state = state
        self.update(self._render_text(state))

    def watch_compact(self) -> None:
        if self._state is not None:
            self.update(self._render_text(self._state))

    def on_resize(self) -> None:
        if self._state is not None:  # what fits the width again
            self.update(self._render_text(self._state))

    def _render_text(self, state: RunState) -> Text:
        items = []
        changed: list[int] = []  # the items that say something about this run: changed from the default, or changing
        shown = [option for option in LIVE_OPTIONS if option.in_panel]
        for option in shown if not self.compact else [option for option in shown if _on_the_line(option, state)]:
            shown = option.brief(state.options[option.name]) if option.name in state.options else "–"
            if self.compact:
                item = Text.assemble((f"{option.short} ", "dim"), (shown, "bold"))
            else:
                item = Text.assemble((f" {option.key} ", "bold reverse"), (f" {option.label:<14}", "dim"), (shown, "bold"))
            if option.name in state.pending:
                item.append(f" → {option.brief(state.pending[option.name])}…", style="italic yellow")
            if option.name in state.pending or not _at_default(option, state):
                changed.append(len(items))
            items.append(item)
        if self.compact:
            width = self.content_size.width
            return one_line(items, changed, width if width > 0 else 10_000)
        if state.checkpoint_blocks:  # what the checkpointing key wraps; in full on the help screen (?)
            blocks = state.checkpoint_blocks
            wraps = f" {CHECKPOINTING.key} wraps {describe_blocks(blocks)}"
            if len(wraps) > self.content_size.width > 0:
                wraps = f" {CHECKPOINTING.key} wraps {len(blocks)} block{'s' if len(blocks) != 1 else ''} (see ?)"
            items.append(Text(wraps, style="dim"))
        return Text("\n").join(items)


def one_line(items: list[Text], changed: list[int], width: int) -> Text:
    """The options that fit ``width``, in their order, whole (never cut): the ``changed`` ones first, then those at
    their default; the line ends with how many did not fit (``+2 more``), which a wider terminal lists."""
    separator = Text(" · ", style="dim")
    importance = changed + [index for index in range(len(items)) if index not in changed]
    if len(parts_that_fit(items, width, separator.cell_len, importance)) == len(items):
        return fit_parts(items, width, separator)
    # Room for the count first: "+9 more" at most (the options on the line are fewer than ten).
    count_width = separator.cell_len + len("+9 more")
    kept = parts_that_fit(items, width - count_width, separator.cell_len, importance)
    line = fit_parts([item if index in kept else Text() for index, item in enumerate(items)], width, separator)
    line.append_text(separator)
    line.append(f"+{len(items) - len(kept)} more", style="dim italic")
    return line


def _at_default(option: LiveOption, state: RunState) -> bool:
    value = state.options.get(option.name)
    return value is None or value is False or value == option.default


def _on_the_line(option: LiveOption, state: RunState) -> bool:
    """Whether the one-line panel shows ``option``: a footer key's always, another one changed or being changed."""
    return option.in_footer or option.name in state.pending or not _at_default(option, state)
