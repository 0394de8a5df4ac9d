"""The gradient table on a model with long, alike module names (HuggingFace's BERT naming, a tied lm_head):
the module column takes the width there is, a name cut keeps both ends, and no two rows read alike."""

from __future__ import annotations

import pytest

from fake_link import FakeLink, long_names_events, quiet_app

from torchlab.tui.names import ELLIPSIS
from torchlab.tui.screens.help_screen import HelpScreen
from torchlab.tui.widgets.grad_table import GradTable
from torchlab.tui.widgets.options_panel import OptionsPanel

WORD_EMBEDDINGS = "bert.embeddings.word_embeddings"


def shown_labels(grads: GradTable) -> dict[str, str]:
    return {key: grads.table.get_cell(key, "module").rstrip() for key in grads.displayed_keys}


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (160, 48), (200, 50)])
async def test_each_row_reads_differently_and_a_cut_name_keeps_both_ends(size) -> None:
    app = quiet_app(FakeLink(long_names_events()))
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        grads = app.query_one(GradTable)
        labels = shown_labels(grads)
        assert len(labels) == 35 and len(set(labels.values())) == len(labels)
        for key, label in labels.items():
            full = key + (" = lm_head" if key == WORD_EMBEDDINGS else "")
            pieces = label.split(ELLIPSIS)
            assert full.startswith(pieces[0]) and full.endswith(pieces[-1]), (full, label)
            assert label == full or (len(pieces) > 1 and pieces[0] and pieces[-1]), (full, label)  # both ends kept
        # The module column takes the width the other columns leave (it was 22 at most, however wide the table).
        layout = grads.layout_columns
        available = grads.table.content_size.width - 1
        longest = max(len(key) + (len(" = lm_head") if key == WORD_EMBEDDINGS else 0) for key in labels)
        assert layout.name == min(longest, available - layout.others)


async def test_a_wide_terminal_shows_the_long_names_whole() -> None:
    app = quiet_app(FakeLink(long_names_events()))
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.pause()
        labels = shown_labels(app.query_one(GradTable))
        assert labels["bert.encoder.layer.3.attention.output.LayerNorm"] == "bert.encoder.layer.3.attention.output.LayerNorm"


async def test_a_tied_module_is_named_once_with_its_other_names_and_the_filter_finds_it() -> None:
    app = quiet_app(FakeLink(long_names_events()))
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        grads = app.query_one(GradTable)
        assert "lm_head" not in grads.displayed_keys  # its weight is the word embeddings': counted there
        assert shown_labels(grads)[WORD_EMBEDDINGS] == f"{WORD_EMBEDDINGS} = lm_head"
        await pilot.press("slash", *"lm_head", "enter")
        await pilot.pause()
        assert grads.displayed_keys == [WORD_EMBEDDINGS]


async def test_the_options_panel_and_the_help_say_which_blocks_checkpointing_wraps() -> None:
    app = quiet_app(FakeLink(long_names_events()))
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        assert "c wraps 4 blocks (see ?)" in str(app.query_one(OptionsPanel).content)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        listed = dict(app.screen.keys)
        assert listed["c"].endswith(": bert.encoder.layer.0–3 (4 blocks)")
