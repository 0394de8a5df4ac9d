"""The heatmap's parts (tui/screens/heatmap_screen.py, tui/health_history.py): the history of measured steps, a
block's figures from its modules', the glyph scale, and the update flags of the gradient table."""

from __future__ import annotations

import math

import pytest

from torchlab.tui.gradient_flags import flag_for
from torchlab.tui.health_history import HealthHistory
from torchlab.tui.screens.heatmap_screen import Scale, grid_of

MODULES = ["blocks.0.attn", "blocks.0.mlp", "head"]


def history(*steps: int) -> HealthHistory:
    held = HealthHistory()
    for step in steps:
        held.add(step, 3, [0.1, 0.2, float("nan")], [1e-3, 1e-2, None], [1.0, 3.0, 2.0])
    return held


def test_a_step_held_again_replaces_it_and_what_came_after_and_values_not_finite_are_blank():
    held = history(2, 4, 6)
    held.add(4, 3, [0.5, 0.5, 0.5], None, None)  # a resumed run trains step 4 again
    assert list(held.steps) == [2, 4]
    assert held.columns["grad norm"][-1] == [0.5, 0.5, 0.5] and held.columns["update ratio"][-1] == [None] * 3
    assert held.columns["grad norm"][0][2] is None  # NaN: not drawn as a value


def test_a_blocks_ratio_is_its_update_norm_over_its_weight_norm_and_its_norm_adds_in_squares():
    grid = grid_of(history(2, 4), MODULES, "update ratio", grouped=True, columns=1)
    assert grid.labels == ["blocks.0", "head"] and grid.steps == [4]
    assert grid.cells[0][0] == pytest.approx(math.sqrt(1e-3**2 + (3e-2) ** 2) / math.sqrt(1 + 9))
    assert grid.cells[1][0] is None
    norms = grid_of(history(2, 4), MODULES, "grad norm", grouped=True, columns=5)
    assert norms.steps == [2, 4] and norms.cells[0] == [pytest.approx(math.sqrt(0.05))] * 2


def test_the_scale_spans_whole_decades_and_its_legend_reads_without_colour():
    scale = Scale.of([[1e-7, 2e-3], [None, 0.05]])
    assert (scale.low, scale.high) == (-7, -1)
    assert [scale.level(value) for value in (1e-7, 1e-4, 1e-2, 0.1, 0.0, None)] == [0, 4, 6, 7, 0, None]
    assert scale.legend().plain == "scale (log10): ▁▂▃▄▅▆▇█  ▁ 1e-7 · ▅ ≥ 1e-4 · █ 0.1 · blank: not measured"
    assert Scale(-1, 2).legend().plain.endswith("▁ 0.1 · ▅ ≥ 3.2 · █ 100 · blank: not measured")


@pytest.mark.parametrize("update_ratio, share, flag", [
    (1e-3, 1.0, ""), (5e-6, 1e-3, "frozen"), (0.3, 10.0, "thrashed"), (None, None, ""),
    (5e-6, 0.5, ""),  # a warm-up's small LR: every module moves little, and none has stopped
])
def test_an_update_far_outside_its_band_is_flagged_frozen_only_while_the_others_learn(update_ratio, share, flag):
    assert flag_for(0.1, 1.0, [0.1, 0.1, 0.1], update_ratio, share) == flag


def test_a_block_whose_small_layer_stopped_is_marked_and_the_cell_line_names_it():
    """A block's ratio weighs its modules by their weights: a small layer that stopped (blocks.0.norm, weight norm
    0.1, ratio 1e-8) leaves the block's figure healthy. Its cells say so as the gradient table would: ▽, named."""
    modules = ["blocks.0.attn", "blocks.0.norm", "head"]
    held = HealthHistory()
    held.add(2, 3, [0.1, 0.1, 0.1], [1e-3, 1e-8, 2e-3], [10.0, 0.1, 3.0])
    held.add(4, 3, [0.1, 0.1, 0.1], [1e-3, 0.5, 2e-3], [10.0, 0.1, 3.0])  # then thrashed
    grid = grid_of(held, modules, "update ratio", grouped=True, columns=5)
    assert grid.cells[0][0] == pytest.approx(1e-3, rel=1e-3)  # the block's figure alone hides it
    assert grid.flags[0] == [["blocks.0.norm frozen (1.00e-08)"], ["blocks.0.norm thrashed (0.5)"]]
    assert [grid.flag_glyph(0, column) for column in (0, 1)] == ["▽", "△"] and grid.flag_glyph(1, 0) is None
    assert grid_of(held, modules, "update ratio", grouped=False, columns=5).flags[1][0] == ["blocks.0.norm frozen (1.00e-08)"]
    assert grid_of(held, modules, "grad norm", grouped=True, columns=5).flags == [[[], []], [[], []]]


def test_a_journals_steps_go_before_the_ones_sent_and_the_newest_are_kept():
    from torchlab.tui.health_history import HISTORY_STEPS

    held = history(1000, 1002)
    held.put_before(3, [(step, [0.1, 0.2, 0.3], None, [1.0, 1.0, 1.0]) for step in range(2, 1001, 2)])
    assert len(held.steps) == HISTORY_STEPS and list(held.steps)[-3:] == [998, 1000, 1002]  # 1000: the sent one kept
    assert held.columns["weight norm"][-3] == [1.0, 1.0, 1.0] and held.columns["weight norm"][-1] == [1.0, 3.0, 2.0]
