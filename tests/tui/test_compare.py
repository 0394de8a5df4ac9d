"""Runs compared (issue 16): ``torchlab-tui compare`` from run directories, and its screen at 80x24 and 160x48.

The runs are written here, deterministic (the files a trainer writes, with made-up figures), so the snapshots
are stable; tests/launch/test_export.py-style real runs would move with the machine's speed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from metrics_rows import metrics_row

from torchlab.core.launch.compare import CompareApp, main
from torchlab.core.records.config import build_config
from torchlab.core.wire import strict_json
from torchlab.tui.run_history import RunHistory, differences, figure_name
from torchlab.core.wire.payloads import StepPhases
from torchlab.tui.screens.compare_screen import fold, table_rows
from torchlab.tui.widgets.line_chart import LineChart, marker


def write_run(root: Path, name: str, *, lr: float, clip_at: int | None = None, steps: int = 120,
              workload: str = "tiny_gpt", data_ms: float | None = None) -> Path:
    """``data_ms``: each 5th row carries the phases of the 5 steps before it, waiting that long for data."""
    run = root / name
    run.mkdir(parents=True)
    settings = {"workload": workload, "steps": steps, "lr": lr, "options": {}, "at": [f"{clip_at}:clip=0.5"] if clip_at else []}
    (run / "config.toml").write_text(build_config(settings).to_toml())
    rows = []
    for step in range(1, steps + 1):
        loss, accuracy = 4 * math.exp(-step * lr * 20) + 1, 1 - math.exp(-step * lr * 20)
        evaluated = {"val_loss": loss + 0.1, "val_metrics": {"accuracy": accuracy - 0.05}} if step % 40 == 0 else {}
        row = metrics_row(step, elapsed_s=step * (0.05 if clip_at is None else 0.06), loss=loss, lr=lr, samples_per_s=640.0,
                          metrics={"accuracy": accuracy}, **evaluated,
                          phases=StepPhases(data_ms / 1000, 0, 0.01, 0.02, 0.002, 0, 0, 0.001, steps=5, flops=1e8,
                                            flops_per_s=1e8 / 0.033, peak_flops_per_s=1e11, ops=100)
                          if data_ms is not None and step % 5 == 0 else None)
        rows.append(strict_json.dumps(row.json_object()))
    (run / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    events = [{"event": "run_started", "step": 0}]
    if clip_at:
        events.append({"event": "option_applied", "step": clip_at, "option": "clip", "value": 0.5, "previous": None})
    (run / "events.jsonl").write_text("\n".join(map(json.dumps, events)) + "\n")
    return run


@pytest.fixture
def runs(tmp_path) -> list[Path]:
    return [write_run(tmp_path, "20261123-090000-tiny_gpt", lr=0.001),
            write_run(tmp_path, "20261123-100000-tiny_gpt", lr=0.003, clip_at=60)]


def test_a_run_is_read_from_its_files_with_its_settings_changes_and_figures(runs):
    first, second = (RunHistory.load(path) for path in runs)
    assert second.changes == ["step 60: clip = 0.5"]
    assert first.figures()[:4] == ["loss", "val_loss", "lr", "samples_per_s"]
    assert {"metrics.accuracy", "val_metrics.accuracy"} <= set(first.figures())
    assert len(first.by_step["loss"]) == 120 and len(first.by_step["val_loss"]) == 3
    assert differences([first, second]) == [("lr", ["0.001", "0.003"]), ("at", ["—", "[60:clip=0.5]"])]


def test_where_each_runs_time_went_is_a_row_of_the_table_and_each_phase_a_figure(tmp_path):
    slow = RunHistory.load(write_run(tmp_path, "20261123-090000-tiny_gpt", lr=0.001, data_ms=30))
    fast = RunHistory.load(write_run(tmp_path, "20261123-100000-tiny_gpt", lr=0.001, data_ms=1))
    assert {"phases.data", "phases.forward", "phases.other", "mfu"} <= set(slow.figures()) and "phases.probes" not in slow.figures()
    assert slow.by_step["mfu"].ys[-1] == pytest.approx(3.03, rel=0.01) and figure_name("mfu") == "MFU %"
    assert slow.by_step["phases.data"].ys[-1] == pytest.approx(30) and figure_name("phases.data") == "data ms/step"
    [(label, texts)] = [row for row in table_rows([slow, fast]) if row[0] == "time went"]
    assert texts[0].startswith("input-bound: 48 % of each step waits for data") and texts[1].startswith("compute: ")


@pytest.mark.asyncio
async def test_f_and_x_change_the_figure_and_the_axis(runs):
    app = CompareApp([RunHistory.load(path) for path in runs])
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        chart = app.screen.query_one("#compare-chart", LineChart)
        assert [line.label for line in chart.lines] == ["20261123-090000-tiny_gpt", "20261123-100000-tiny_gpt"]
        assert "loss against step (1 of 6 figures)" in str(app.screen.query_one("#compare-status").content)
        await pilot.press("f")
        assert "val loss against step" in str(app.screen.query_one("#compare-status").content)
        await pilot.press("x")
        assert chart.x_name == "time" and "val loss against training time" in str(app.screen.query_one("#compare-status").content)
        await pilot.press("escape")
    assert app.return_code == 0


@pytest.mark.parametrize("argv, message", [
    (["only-one"], "give two runs or more to compare"),
    (["a", "b"], "a: no metrics.jsonl here; give run directories"),
])
def test_compare_says_what_is_wrong_in_one_line(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_long_setting_name_is_folded_between_its_words_not_mid_word():
    """At 80 columns the setting column is 13 wide: ``schedule_extensions`` read ``schedule_exte`` / ``nsions``."""
    assert fold("schedule_extensions", 13) == ["schedule_", "extensions"]


def test_a_runs_changes_of_length_read_as_steps_and_totals_not_raw_pairs(tmp_path):
    """compare printed ``schedule_extensions`` as config.toml keeps it: ``[[79, 400], [795, 5000], [900, 900]]``."""
    run = write_run(tmp_path, "20261123-090000-tiny_gpt", lr=0.001, steps=120)
    config = run / "config.toml"
    config.write_text(config.read_text().replace("schedule_extensions = []",
                                                 "schedule_extensions = [[40, 400], [79, 100]]"))
    assert RunHistory.load(run).settings["schedule_extensions"] == "at 40: 400 → 100 steps, at 79: 100 → 120 steps"


def test_a_run_named_twice_is_compared_once(runs, capsys):
    """``compare runs/*bad_data runs/2026...-bad_data`` drew that run twice, in two colours under one name."""
    assert main([str(runs[0]), f"{runs[0]}/."]) == 2
    assert "give two runs or more to compare" in capsys.readouterr().err


def test_compare_into_a_file_is_refused_not_drawn_into_it(runs, capsys):
    """`compare A B > out.txt` wrote the app's escape codes into the file and waited for keys."""
    assert main([str(path) for path in runs]) == 2  # pytest's captured output is no terminal
    said = capsys.readouterr()
    assert said.out == "" and said.err.startswith("torchlab-tui compare: not opened: torchlab-tui compare draws full screen")


@pytest.mark.parametrize("metrics", ["", '{"step": 1, "loss": 4.1', "not json\n"], ids=["empty", "torn", "garbage"])
def test_a_run_with_no_step_to_show_is_refused_in_one_paragraph_not_opened_blank(runs, metrics, capsys):
    young = runs[0].parent / "20261123-110000-tiny_gpt"
    young.mkdir()
    (young / "metrics.jsonl").write_text(metrics)  # a run killed at its start, mid-write
    assert main([str(runs[0]), str(young)]) == 2
    err = capsys.readouterr().err
    assert f"{young}: metrics.jsonl has no step yet" in err and "Traceback" not in err


def test_another_users_private_run_is_refused_in_one_paragraph(runs, monkeypatch, capsys):
    import errno

    import torchlab.tui.run_history as run_history

    def private(path):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))  # what a 0700 run of someone else's gives

    monkeypatch.setattr(run_history, "rows_of", private)
    assert main([str(path) for path in runs]) == 2
    assert capsys.readouterr().err.strip() == (f"torchlab-tui compare: {runs[0]}: cannot be read: permission denied "
                                               "(a run directory is private to the user who started it)")


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
def test_the_compare_screen(runs, snap_compare, size):
    assert snap_compare(CompareApp([RunHistory.load(path) for path in runs]), terminal_size=size)


def test_the_earlier_run_is_the_newest_before_this_one_of_the_same_workload(tmp_path):
    from torchlab.tui.run_history import earlier_run

    first = write_run(tmp_path, "20261123-090000-tiny_gpt", lr=0.001)
    second = write_run(tmp_path, "20261123-100000-tiny_gpt", lr=0.003)
    other = tmp_path / "20261123-093000-mlp"
    other.mkdir()
    (other / "config.toml").write_text(build_config({"workload": "mlp"}).to_toml())
    (other / "metrics.jsonl").write_text("")
    killed_at_start = tmp_path / "20261123-103000-tiny_gpt"  # no step reported: nothing to compare with
    killed_at_start.mkdir()
    (killed_at_start / "config.toml").write_text(build_config({"workload": "tiny_gpt"}).to_toml())
    (killed_at_start / "metrics.jsonl").write_text("")
    later = write_run(tmp_path, "20261123-110000-tiny_gpt", lr=0.01)
    assert earlier_run(later) == second and earlier_run(second) == first and earlier_run(first) is None


@pytest.mark.asyncio
async def test_the_palette_compares_the_live_run_with_its_earlier_one(runs):
    from dataclasses import replace

    from fake_link import FakeLink, quiet_app, training_events
    from torchlab.tui.screens.compare_screen import fold, CompareScreen

    events = training_events(20)
    events[0] = replace(events[0], run=replace(events[0].run, run_dir=str(runs[1])))  # the Welcome: this run's directory
    app = quiet_app(FakeLink(events))
    async with app.run_test(size=(80, 24)) as pilot:
        app.poll_now()
        await pilot.pause()
        app.compare_with_earlier_run()
        await pilot.pause()
        assert isinstance(app.screen, CompareScreen) and [run.path for run in app.screen.runs] == runs


def screen_text(app) -> str:
    """What the terminal shows, as text: the screen drawn through the app's filters (NO_COLOR's among them)."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


@pytest.mark.asyncio
async def test_at_80_columns_both_runs_values_of_a_long_setting_are_on_screen(tmp_path):
    """At 80x24 the second run's column was cut at the terminal's edge: with the workload files' paths as their
    values, 'torch.optim.lr_scheduler.StepLR (the workload's)' and the like, only the first run's could be read."""
    first = write_run(tmp_path, "20261125-160041-my_model", lr=0.001,
                      workload="/home/researcher/projects/vision/experiments/baseline_model.py:workload")
    second = write_run(tmp_path, "20261125-170512-my_model", lr=0.003,
                       workload="/home/researcher/projects/vision/experiments/wider_model_v2.py:workload")
    app = CompareApp([RunHistory.load(first), RunHistory.load(second)])
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        shown = screen_text(app)
        # A path goes on over lines of its column, broken between its folders: each part on screen, whole.
        for value in ("/home/researcher/projects/", "baseline_model.py:workload", "wider_model_v2.py:workload", "0.001", "0.003"):
            assert value in shown, shown
        assert "20261125-160041-my_model" in shown.split("setting")[1], shown  # each column says whose it is
        assert "20261125-170512-my_model" in shown.split("setting")[1], shown
        await pilot.resize_terminal(200, 50)  # wider: each path on one line
        await pilot.pause()
        shown = screen_text(app)
        for value in ("/home/researcher/projects/vision/experiments/baseline_model.py:workload",
                      "/home/researcher/projects/vision/experiments/wider_model_v2.py:workload"):
            assert value in shown, shown


@pytest.mark.asyncio
async def test_without_colour_each_run_has_its_own_marker_in_the_plot_and_the_legend(runs, monkeypatch):
    """Under NO_COLOR the runs' lines were the same grey braille, the legend's ━━ the same for each run (and the
    chart's blank cells, drawn without a style, stopped the app: 'NoneType' object has no attribute 'color')."""
    monkeypatch.setenv("NO_COLOR", "1")
    app = CompareApp([RunHistory.load(path) for path in runs])
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.no_color
        shown = screen_text(app)
        legend = str(app.screen.query_one("#compare-legend").render())
        chart = app.screen.query_one("#compare-chart", LineChart)
        first, second = (marker(style) for style in range(2))
        assert first != second
        assert f"━{first}━ 20261123-090000-tiny_gpt" in legend and f"━{second}━ 20261123-100000-tiny_gpt" in legend
        plot = "".join(chart.render_line(y).text for y in range(chart.size.height))
        assert first in plot and second in plot
        assert plot.count(first) >= 2 and plot.count(second) >= 2  # along each line, not at one point
        assert f"━{first}━ 20261123-090000-tiny_gpt" in shown  # as the terminal shows it


@pytest.mark.asyncio
async def test_at_80_columns_three_runs_each_have_a_column_and_a_legend_entry_that_keeps_its_marker_by_its_name(runs):
    """With three runs the legend ran past the width, and its last marker ended one line, its run's name began the next."""
    third = write_run(runs[0].parent, "20261123-110000-tiny_gpt", lr=0.01)
    app = CompareApp([RunHistory.load(path) for path in [*runs, third]])
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        shown = screen_text(app)
        for style, run in enumerate([*runs, third]):
            assert f"━{marker(style)}━ {run.name}" in shown, shown  # on one line of the screen
        assert all(value in shown for value in ("0.001", "0.003", "0.01 ")), shown


def test_what_held_each_runs_ranks_back_is_a_row_of_the_table(tmp_path):
    """A straggler's stretch and a hang, from each run's journal (core/records/rank_history.py); a run whose ranks
    nothing held back has a dash."""
    from torchlab.core.records.rundir import to_json_line
    from torchlab.core.wire.hang import Hang
    from torchlab.core.wire.straggler import Straggler

    held = write_run(tmp_path, "20261123-090000-tiny_gpt", lr=0.001)
    smooth = write_run(tmp_path, "20261123-100000-tiny_gpt", lr=0.003)
    slow = Straggler(step=60, rank=1, host="node-b", excess_s=0.05, step_share=0.2, since_step=30, part="data wait")
    with (held / "events.jsonl").open("a") as journal:
        for event in (slow, Hang(step=90, waited_s=41.0, explanation="rank 1 at model.py:88", folder="hangs/step-0000090")):
            journal.write(to_json_line(event.journal_record()) + "\n")
    [(label, texts)] = [row for row in table_rows([RunHistory.load(held), RunHistory.load(smooth)]) if row[0] == "ranks held"]
    assert texts == ["rank 1 (node-b) straggled from step 30 (data wait); hung at step 90", "—"]


def test_what_compile_did_in_each_run_is_a_row_of_the_table(tmp_path):
    """From each run's ``compile_report`` events in its journal: the newest's counts, the compile time of every process
    (a resumed process compiles again and counts from none); a run that never compiled says so with a dash."""
    from torchlab.core.records.rundir import to_json_line
    from torchlab.core.wire.compile_report import CompileReport, GraphBreak

    compiled = write_run(tmp_path, "20261123-090000-tiny_gpt", lr=0.001)
    eager = write_run(tmp_path, "20261123-100000-tiny_gpt", lr=0.003)
    first = CompileReport(step=1, compile_s=9.0, graphs=2, breaks=[], recompiles=[], recompile_limit=8)
    last = CompileReport(step=30, compile_s=12.5, graphs=3, recompile_limit=8, recompiles=[],
                         breaks=[GraphBreak("/m.py", 3, "if x:", "Data-dependent branching")] * 2)
    resumed = CompileReport(step=31, compile_s=4.0, graphs=3, recompile_limit=8, recompiles=[], breaks=last.breaks,
                            eager_ops=1, graphs_run=3, eager_most=["aten::is_nonzero x1"])
    with (compiled / "events.jsonl").open("a") as journal:
        for record in (first.journal_record(), last.journal_record(), {"event": "run_started", "step": 30, "time": 1.0},
                       resumed.journal_record()):
            journal.write(to_json_line(record) + "\n")
    [(label, texts)] = [row for row in table_rows([RunHistory.load(compiled), RunHistory.load(eager)]) if row[0] == "compiled"]
    assert texts == ["3 graphs, 16.5 s compiling, 2 graph breaks, 0 recompiles, 1 op eager between graphs", "—"]
