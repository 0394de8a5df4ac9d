"""The event log's rows: a long entry wraps under its text, between words, never between a figure and its unit."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from torchlab.tui.widgets.event_log import HangingEntry, wrap_keeping_figures

UNITS = ("%", "s", "ms", "MiB", "x")
VERDICT = ("compile=on: no clear difference (±192 %), activations -19 %, memory -5 % (steps 183–210; "
           "i shows the impact table), compiled in 22.2 s, 4.11 MiB")


def test_no_row_begins_with_the_unit_of_a_figure_left_on_the_row_above() -> None:
    """Seen in tmux at 80x24: "... activations -19 %, memory -5" on one row, "% (steps 183-210; ..." on the next."""
    for width in range(12, 90):
        rows = [row.plain for row in wrap_keeping_figures(Text(VERDICT), width)]
        assert " ".join(rows) == VERDICT, width  # nothing lost or doubled: only the spaces at breaks go
        assert all(len(row) <= width for row in rows), width
        assert not any(row.split(" ", 1)[0].rstrip(",;)") in UNITS for row in rows[1:]), (width, rows)


def test_a_word_wider_than_a_row_is_folded_and_styles_survive_the_wrap() -> None:
    path = "/home/someone/runs/20261124-194448-tiny_gpt/checkpoints/step-0000400.pt"
    text = Text.assemble(("saved ", "bold"), (path, "cyan"))
    rows = wrap_keeping_figures(text, 20)
    assert "".join(row.plain for row in rows[1:]) == path and all(len(row) <= 20 for row in rows)
    assert rows[0].plain == "saved" and rows[0].spans[0].style == "bold" and rows[1].spans[0].style == "cyan"


def test_an_entry_goes_on_under_its_text_with_the_step_column_left_to_steps() -> None:
    console = Console(width=40, record=True, file=None, force_terminal=False, color_system=None)
    with console.capture() as capture:
        console.print(HangingEntry(Text("   210 Δ "), Text(VERDICT)))
    rows = capture.get().splitlines()
    assert rows[0].startswith("   210 Δ compile=on") and len(rows) > 2
    assert all(row.startswith(" " * 9) and row[9] != " " for row in rows[1:])
