"""One line of figures that fits its width by leaving out whole figures, never by cutting one."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.widgets import Static

from torchlab.tui.formatting import fit_parts


class FittedLine(Static):
    """A line of parts, most important first: those that do not fit the widget's width are left out, again
    whenever it is resized (``text-overflow: ellipsis`` cut ``samples/s 1,2…`` and ``ETA 6:…`` at 80 columns)."""

    DEFAULT_CSS = """
    FittedLine {
        height: 1;
        text-wrap: nowrap;
    }
    """

    def __init__(self, *, separator: Text | str = "  ", id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.separator = separator
        self._parts: list[Text] = []
        self._importance: list[int] | None = None

    def set_parts(self, parts: Sequence[Text], importance: Sequence[int] | None = None) -> None:
        """Show these parts, as many as fit, taken in their order or that of ``importance`` (``fit_parts``)."""
        self._parts = list(parts)
        self._importance = list(importance) if importance is not None else None
        self._fit()

    def on_resize(self) -> None:
        self._fit()

    def _fit(self) -> None:
        width = self.content_size.width
        # Before the first layout the width is 0: show everything, the resize that follows fits it.
        self.update(fit_parts(self._parts, width if width > 0 else 10_000, self.separator, self._importance), layout=False)
