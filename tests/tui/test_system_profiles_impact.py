"""The system panel, the profiler screens and the impact table, driven by a FakeLink (issue 4, app side)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from fake_link import NO_GPU, FakeLink, cpu_run_processes, gpu, impact, profile_ready, profile_row, quiet_app, telemetry, training_events

from torchlab.core.wire import protocol
from torchlab.tui.app import TorchlabApp
from torchlab.tui.state_measurements import TELEMETRY_HISTORY
from torchlab.tui.widgets.event_log import EventLog
from torchlab.tui.widgets.system_panel import SystemPanel

WIDE = (160, 48)
SMALL = (80, 24)
#: Sixteen cores, each busy its own amount (as % of that core).
CORE_LOADS = [95.0, 12.0, 40.0, 7.0, 100.0, 0.0, 63.0, 21.0, 88.0, 3.0, 50.0, 76.0, 14.0, 31.0, 9.0, 58.0]


def log_text(app: TorchlabApp) -> str:
    return "\n".join(app.query_one(EventLog).lines_written)


def panel_text(app: TorchlabApp) -> str:
    return app.query_one(SystemPanel).render().plain


def column(table, key: str) -> list[str]:
    """The plain text of one column of a DataTable, top to bottom as shown."""
    return [str(getattr(cell, "plain", cell)) for cell in table.get_column(key)]


def app_with(*events: protocol.Message) -> tuple[TorchlabApp, FakeLink]:
    link = FakeLink(training_events() + list(events))
    return quiet_app(link), link


async def answer(app: TorchlabApp, pilot) -> None:
    app.poll_now()
    await pilot.pause()


# ---------------------------------------------------------------------- system panel

async def test_without_a_gpu_the_panel_says_why_and_host_figures_show() -> None:
    app, _ = app_with(telemetry())
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        text = panel_text(app)
        assert text.splitlines()[0] == NO_GPU  # first, where the GPU lines would be
        assert "cpu   " in text and "23 % of 16 · trainer 98 %" in text
        assert "21.0/125.7 GiB" in text  # host RAM
        assert "812 MiB · 3 processes · alloc n/a on cpu" in text  # trainer RSS; no CUDA allocator on CPU
        assert "█" in text  # the CPU and RAM bars


@pytest.mark.parametrize("gpus", [0, 1, 4], ids=["no-gpu", "one-gpu", "four-gpus"])
@pytest.mark.parametrize("width", [30, 39, 58])
async def test_the_panel_leaves_out_whole_figures_that_do_not_fit_its_width(gpus: int, width: int) -> None:
    from torchlab.tui.widgets.system_panel import panel_text as draw

    samples = [telemetry(gpus=[gpu(index) for index in range(gpus)], rss_mib=700 + 2 * second, t=second).sample
               for second in range(60)]
    lines = draw(samples[-1], samples, width, 8).plain.splitlines()
    assert lines and all(len(line) <= width and "…" not in line for line in lines), lines
    assert any(line.startswith("rss") for line in lines)


@pytest.mark.parametrize("width", [30, 39, 58])
async def test_the_cores_and_processes_leave_out_whole_columns_that_do_not_fit_its_width(width: int) -> None:
    from torchlab.tui.widgets.system_panel import panel_text as draw

    sample = telemetry(cores=CORE_LOADS, processes=cpu_run_processes()).sample
    lines = draw(sample, [sample], width, 30).plain.splitlines()
    assert all(len(line) <= width and "…" not in line for line in lines), lines
    assert any(line.startswith("cores") for line in lines) and any("4242  trainer" in line for line in lines), lines
    assert any(line.startswith("disk  read 2.7 MiB/s") for line in lines), lines


async def test_a_small_terminal_gets_one_summary_line_and_t_opens_the_full_panel() -> None:
    app, _ = app_with(telemetry())
    async with app.run_test(size=SMALL) as pilot:
        await pilot.pause()
        panel = app.query_one(SystemPanel)
        assert panel.compact and panel.size.height == 1
        line = panel_text(app)
        # "no GPU" in a word, not a row's worth: the figures fit, whole; why there is none does not, so it is left out.
        assert line == "no GPU · cpu 23 % · ram 21.0/125.7 GiB · rss 812 MiB ×3"
        await pilot.press("t")
        from torchlab.tui.screens.system_screen import SystemScreen

        assert isinstance(app.screen, SystemScreen)
        detail = app.screen.query_one(SystemPanel)
        assert not detail.compact and "23 % of 16" in detail.render().plain
        assert "no GPU: no NVIDIA driver (NVML library not found)" in detail.render().plain  # there, it says why
        app.link.push(telemetry(rss_mib=900, t=1.0))  # the open view follows new samples
        await answer(app, pilot)
        assert "900 MiB" in detail.render().plain
        await pilot.press("escape")
        assert not isinstance(app.screen, SystemScreen)


@pytest.mark.parametrize("size", [SMALL, (200, 50)], ids=["80x24", "200x50"])
async def test_t_on_a_cpu_run_shows_a_bar_per_core_the_runs_processes_and_their_disk_io(size) -> None:
    """On a machine without a GPU the full-size view was five lines of figures and ~45 blank rows: it now has each
    core's load, the run's processes (the trainer, its DataLoader workers) with CPU, RSS and disk rates, and the
    run's disk reads and writes."""
    import re

    from torchlab.tui.screens.system_screen import SystemScreen

    app, _ = app_with(telemetry(cores=CORE_LOADS, processes=cpu_run_processes()))
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        await pilot.press("t")
        assert isinstance(app.screen, SystemScreen)
        panel = app.screen.query_one(SystemPanel)
        lines = panel.render().plain.splitlines()[:panel.content_size.height]  # what fits the view
        text = "\n".join(lines)
        cores = {int(index): float(load) for index, load in re.findall(r"(?<![\d.])(\d+) [█▏▎▍▌▋▊▉░]+ +(\d+) %", text)}
        assert cores == dict(enumerate(CORE_LOADS)), text  # every core, each with its bar and its load
        trainer = next(line for line in lines if "4242" in line)
        assert re.search(r"4242 +trainer +98 % +700 MiB", trainer) and "41.5 MiB/s" in trainer, text
        workers = [line for line in lines if "data worker" in line]
        assert len(workers) == 2 and re.search(r"4250 +data worker +31 % +56 MiB +1.5 MiB/s", workers[0]), text
        assert re.search(r"disk +read 2.7 MiB/s · write 41.5 MiB/s", text), text
        assert len(lines) >= 12  # it was five


async def test_a_gpu_sample_shows_memory_utilisation_temperature_power_and_allocator() -> None:
    app, _ = app_with(telemetry(gpus=[gpu(0)]))
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        text = panel_text(app)
        assert "GPU0 NVIDIA H100 80GB HBM3  62°C  312/700 W  1980 MHz" in text
        assert "41.2/79.6 GiB · run 40.1 GiB" in text
        assert "87 %" in text
        assert "alloc 12 GiB · reserved 14 GiB · peak 13 GiB" in text
        assert "no GPU" not in text


async def test_a_gpu_that_hides_fields_reads_na_and_history_is_bounded() -> None:
    hidden = gpu(0, temperature_c=None, power_w=None, utilization_percent=None, this_run_memory_bytes=None)
    app, link = app_with(telemetry(gpus=[hidden]))
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        text = panel_text(app)
        assert "n/a °C  n/a W" in text and "util  ········" in text and "n/a" in text.splitlines()[2]
        for second in range(TELEMETRY_HISTORY + 10):
            link.push(telemetry(gpus=[gpu(0, used_gib=10 + second / 10)], t=second))
        await answer(app, pilot)
        assert len(app.run_state.telemetry_history) == TELEMETRY_HISTORY
        history = next(line for line in panel_text(app).splitlines() if line.startswith("hist"))
        assert "GPU mem" in history and any(char in history for char in "▁▂▃▄▅▆▇█")


async def test_several_gpus_each_get_a_line_or_a_summary_when_they_do_not_fit() -> None:
    app, link = app_with(telemetry(gpus=[gpu(index) for index in range(7)]))
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        text = panel_text(app)  # seven GPUs, a CUDA allocator: 7 + 1 + 4 lines do not fit in 11
        assert "7 GPUs mem 288.4/557.2 GiB" in text and "util 0:87% 1:87% 2:87% 3:87% 4:87% 5:87% 6:87%" in text
        link.push(telemetry(gpus=[gpu(index) for index in range(7)]))
        await pilot.press("t")  # the full view has room for every GPU
        detail = app.screen.query_one(SystemPanel).render().plain
        assert all(f"GPU{index} NVIDIA H100" in detail for index in range(7))


# ---------------------------------------------------------------------- profiler screens

async def test_a_finished_profile_is_announced_with_its_files_and_the_key_to_open_it() -> None:
    app, _ = app_with(profile_ready(12), profile_ready(40, error="RuntimeError: profiler ran out of memory"))
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        text = log_text(app)
        assert "profile #1 (steps 12–16) ready: P opens the table · profiles/0000011/" in text
        assert "profile #2 (steps 40–44) failed: RuntimeError: profiler ran out of memory" in text
        assert [snapshot.number for snapshot in app.run_state.profiles] == [1, 2]
        await pilot.press("P")  # the list names the files each folder holds, and what opens the trace
        status = str(app.screen.query_one("#profiles-status").content)
        assert "trace.json (ui.perfetto.dev or chrome://tracing), table.txt, table.csv" in status


async def test_profile_list_opens_a_table_sorted_by_any_column() -> None:
    from textual.widgets import DataTable

    from torchlab.tui.screens.profile_screens import ProfileListScreen, ProfileTableScreen

    app, link = app_with(profile_ready(12), profile_ready(150, scale=0.5))
    async with app.run_test(size=SMALL) as pilot:
        await pilot.press("P")
        assert isinstance(app.screen, ProfileListScreen)
        assert app.screen.query_one(DataTable).row_count == 2
        await pilot.press("up", "enter")  # the cursor starts on the newest; up: the first snapshot
        screen = app.screen
        assert isinstance(screen, ProfileTableScreen) and screen.snapshot.number == 1
        table = screen.query_one(DataTable)
        assert column(table, "name")[0] == "aten::addmm"  # the trainer's sort: self CPU
        assert column(table, "self_cpu_us")[:2] == ["4 ms", "2.5 ms"]
        assert "self_device_us" not in [str(key.value) for key in table.columns]  # a CPU run: no device columns
        await pilot.press("o")  # the next column to the right
        assert screen.sort_key == "cpu_total_us"
        await pilot.press("o", "o", "o")  # CPU mem, name, calls
        assert screen.sort_key == "calls"
        assert column(table, "name")[0] == "aten::softmax" and column(table, "calls")[0] == "5,000"
        await pilot.press("r")
        assert column(table, "name")[0] == "aten::gelu"  # fewest calls first
        # A click on a header sorts by that column.
        x = sum(col.get_render_width(table) for col in table.ordered_columns[:4]) + 2  # the fifth: CPU mem
        await pilot.click(DataTable, offset=(x, 0))
        assert screen.sort_key == "self_cpu_memory_bytes" and not screen.reverse
        assert column(table, "name")[0] == "aten::gelu" and column(table, "self_cpu_memory_bytes")[-1] == "-512 KiB"
        await pilot.press("g")  # grouped by input shape
        assert "input_shapes" in [str(key.value) for key in table.columns]
        assert table.row_count == 3 and column(table, "input_shapes")[0].startswith("[[")
        assert link.sent == []  # no key here reached the trainer
        await pilot.press("escape")
        assert isinstance(app.screen, ProfileListScreen)


async def test_top_n_and_the_full_table_from_table_csv(tmp_path: Path) -> None:
    from textual.widgets import DataTable

    rows = [profile_row(f"aten::op{index:02d}", 1000.0 - index) for index in range(60)]
    with open(tmp_path / "table.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    sent = protocol.ProfileReady(12, 16, str(tmp_path), rows=rows[:50], rows_by_shape=[], build_s=0.1)
    app, _ = app_with(sent)
    async with app.run_test(size=SMALL) as pilot:
        await pilot.press("P", "enter")
        table = app.screen.query_one(DataTable)
        assert table.row_count == 20
        assert "all 60 ops (table.csv)" in str(app.screen.query_one("#profile-status").content)
        await pilot.press("plus", "plus")
        assert table.row_count == 60  # top 100 of the 60 in the CSV, not only the 50 sent
        await pilot.press("minus", "minus", "minus")
        assert table.row_count == 10
        await pilot.press("r")
        assert column(table, "name")[0] == "aten::op59"


async def test_two_snapshots_compare_with_ratio_columns() -> None:
    from textual.widgets import DataTable

    from torchlab.tui.screens.profile_screens import ProfileCompareScreen

    app, link = app_with(profile_ready(12), profile_ready(80), profile_ready(150, scale=0.5))
    async with app.run_test(size=SMALL) as pilot:
        await pilot.press("P", "up", "up", "space", "down", "down", "space", "c")  # mark #1 and #3
        screen = app.screen
        assert isinstance(screen, ProfileCompareScreen)
        assert (screen.before.number, screen.after.number) == (1, 3)
        table = screen.query_one(DataTable)
        ratios = dict(zip(column(table, "name"), column(table, "ratio")))
        assert ratios["aten::addmm"] == "0.50x" and ratios["aten::mm"] == "0.50x" and ratios["aten::gelu"] == "1.00x"
        assert dict(zip(column(table, "name"), column(table, "change")))["aten::addmm"] == "-2 ms"
        assert "8.3 ms → 5.05 ms  (0.61x)" in str(screen.query_one("#compare-total").content)
        await pilot.press("o", "o", "o", "o")  # size → name → #1 → #3 → ratio
        assert screen.sort_key == "ratio"
        assert column(table, "ratio") == ["1.00x", "1.00x", "1.00x", "0.50x", "0.50x"]
        await pilot.press("m")  # the next figure: total CPU, which has no meaningful sum
        assert screen.metric == "cpu_total_us"
        assert "no meaningful sum" in str(screen.query_one("#compare-total").content)
        assert link.sent == []  # c compared; it did not toggle checkpointing on the run


async def test_compare_without_marks_takes_the_snapshot_before_and_a_failed_one_shows_its_error() -> None:
    from textual.widgets import Static

    from torchlab.tui.screens.profile_screens import ProfileCompareScreen, ProfileListScreen, ProfileTableScreen

    app, _ = app_with(profile_ready(12), profile_ready(150, scale=0.5), profile_ready(300, error="RuntimeError: boom"))
    async with app.run_test(size=SMALL) as pilot:
        await pilot.press("P", "enter")  # the newest: the failed one
        assert isinstance(app.screen, ProfileTableScreen)
        assert "This snapshot failed: RuntimeError: boom" in str(app.screen.query_one("#profile-error", Static).content)
        await pilot.press("escape", "c")
        assert isinstance(app.screen, ProfileListScreen)  # nothing to compare a failed snapshot with
        await pilot.press("up", "c")
        assert isinstance(app.screen, ProfileCompareScreen)
        assert (app.screen.before.number, app.screen.after.number) == (1, 2)


async def test_with_ranks_the_table_and_headless_say_the_communication_share_in_the_same_words() -> None:
    import io
    from dataclasses import replace

    from rich.console import Console

    from torchlab.core.launch.headless import HeadlessProgress

    from torchlab.core.wire.communication import CollectiveTime, CommunicationShare

    communication = CommunicationShare(steps_us=866000.0, us=154000.0, share=0.1778, source="gloo", by_kind=[
        CollectiveTime("all_gather", 92000.0), CollectiveTime("all_reduce", 62000.0), CollectiveTime("broadcast", 300.0)])
    said = "communication 18 % of the profiled steps' time (all_gather 11 %, all_reduce 7 %; gloo)"
    with_ranks = replace(profile_ready(12), communication=communication)
    app, _ = app_with(with_ranks, profile_ready(150))
    async with app.run_test(size=SMALL) as pilot:
        await pilot.press("P", "up", "enter")
        assert str(app.screen.query_one("#profile-communication").content) == said
        await pilot.press("escape", "down", "enter")  # a single process's snapshot: no such line
        assert app.screen.snapshot.number == 2 and not app.screen.query("#profile-communication")
    console = Console(file=io.StringIO(), width=300, color_system=None)
    HeadlessProgress(100, console).on_event(with_ranks)
    assert console.file.getvalue().splitlines()[-1] == f"steps 12–16: {said}"


async def test_a_snapshot_arriving_while_the_list_is_open_appears() -> None:
    from textual.widgets import DataTable

    app, link = app_with()
    async with app.run_test(size=SMALL) as pilot:
        await pilot.press("P")
        assert "No snapshots yet" in str(app.screen.query_one("#profiles-status").content)
        link.push(profile_ready(12))
        await answer(app, pilot)
        assert app.screen.query_one(DataTable).row_count == 1


# ---------------------------------------------------------------------- impact

async def test_impact_rows_and_the_verdict_in_the_log_and_the_table() -> None:
    from textual.widgets import DataTable

    from torchlab.tui.screens.impact_screen import ImpactScreen

    app, link = app_with(impact(bf16_steps=5))
    async with app.run_test(size=SMALL) as pilot:
        await pilot.pause()
        assert "1.72x faster" not in log_text(app)  # five steps: the medians have not settled
        link.push(impact(bf16_steps=40))
        await answer(app, pilot)
        assert "amp=bf16: 1.72x faster, activations -46 %, memory -36 % (steps 121–160; i shows the impact table)" in log_text(app)
        link.push(impact(bf16_steps=60))
        await answer(app, pilot)
        assert log_text(app).count("1.72x faster") == 1  # told once per segment

        await pilot.press("i")
        screen = app.screen
        assert isinstance(screen, ImpactScreen)
        table = screen.query_one(DataTable)
        assert column(table, "change") == ["start", "amp=bf16"]
        assert column(table, "steps") == ["1–120", "121–180"]
        assert column(table, "step_time") == ["17.2 ms ±3 %", "10 ms ±4 %"]  # ±: the wider side of the 90 % interval
        assert column(table, "samples") == ["1,860", "3,200"]
        assert column(table, "activations") == ["48 MiB", "26 MiB"]  # saved for backward, measured
        assert column(table, "memory") == ["61 MiB", "39 MiB"]  # the tensors' total on a CPU run, never the RSS
        assert column(table, "slope") == ["-2.41", "-0.52"]
        # At 80 columns the verdict wraps between its parts, never inside a figure, so the row is read whole.
        assert column(table, "verdict") == ["–", "1.72x faster, activations -46 %,\nmemory -36 %"]
        assert "latest: amp=bf16: 1.72x faster, activations -46 %, memory -36 %" in str(screen.query_one("#impact-latest").content)
        table.move_cursor(row=1)
        link.push(impact(bf16_steps=90))  # updates arrive while it is open: rows change in place
        await answer(app, pilot)
        assert column(table, "steps")[1] == "121–210" and table.cursor_row == 1
        link.push(impact(bf16_steps=90, clip_steps=30))  # a change whose step time is within the noise
        await answer(app, pilot)
        assert column(table, "step_time")[2] == "10.3 ms ±15 %"
        assert column(table, "verdict")[2] == ("no clear difference (±20 %,\nsegments ran in turn,\n"
                                               "so load changes sway it, try a trial),\nsame memory")
        # The verdict and the columns before it fill the screen: neither it nor the column after it is cut at the edge.
        up_to_verdict = sum(column.get_render_width(table) for column in list(table.ordered_columns)[:4])
        assert table.scrollable_content_region.width <= up_to_verdict <= table.size.width
        verdicts = list(table.get_column("verdict"))
        assert verdicts[1].style == "green" and verdicts[2].style == ""  # only a clear difference is coloured
        await pilot.press("a")
        assert link.sent == []  # trainer keys are off while a view is open
        await pilot.press("i")
        assert not isinstance(app.screen, ImpactScreen)


async def test_impact_without_trials_shows_no_trials_table() -> None:
    app, _ = app_with(impact())
    async with app.run_test(size=SMALL) as pilot:
        await answer(app, pilot)
        await pilot.press("i")
        assert not app.screen.query_one("#trials-table").display


async def test_impact_before_any_segment_says_so() -> None:
    from torchlab.tui.screens.impact_screen import ImpactScreen

    app, _ = app_with()
    async with app.run_test(size=SMALL) as pilot:
        await pilot.press("i")
        assert isinstance(app.screen, ImpactScreen)
        assert "No segments yet" in str(app.screen.query_one("#impact-empty").content)


async def open_impact_view(app: TorchlabApp, pilot):
    from textual.widgets import DataTable

    from torchlab.tui.screens.impact_screen import ImpactScreen

    await answer(app, pilot)
    await pilot.press("i")
    assert isinstance(app.screen, ImpactScreen)
    return app.screen, app.screen.query_one("#impact-table", DataTable)


def verdict_header(table) -> str:
    return str(table.columns[next(key for key in table.columns if key.value == "verdict")].label)


async def test_a_baseline_marked_or_the_start_is_what_every_verdict_compares_with_through_live_updates() -> None:
    """Issue 29: b marks the row under the cursor as every row's baseline, s the run's start; the app judges each
    row against it with the trainer's own ``compare_segments``, and the choice holds while the table updates."""
    app, link = app_with(impact(bf16_steps=40, clip_steps=30))
    async with app.run_test(size=WIDE) as pilot:
        screen, table = await open_impact_view(app, pilot)
        assert verdict_header(table) == "vs the segment before"
        assert column(table, "verdict")[1] == "1.72x faster, activations -46 %, memory -36 %"
        await pilot.press("down", "down", "b")  # clip=1.0, within the noise of bf16 but clearly faster than the start
        assert verdict_header(table) == "vs clip=1.0 at step 161" and table.cursor_row == 2
        assert column(table, "verdict") == ["1.67x slower, activations +85 %, memory +56 %",
                                            "no clear difference (±17 %, segments ran in turn,\nso load changes sway it, try a trial), same memory",
                                            "baseline"]
        assert list(table.get_column("verdict"))[0].style == "red"
        link.push(impact(bf16_steps=40, clip_steps=60))  # the trainer's next table: rows change in place
        await answer(app, pilot)
        assert column(table, "steps")[2] == "161–220" and verdict_header(table) == "vs clip=1.0 at step 161"
        assert column(table, "verdict")[2] == "baseline" and table.cursor_row == 2
        await pilot.press("s")
        assert verdict_header(table) == "vs the start" and table.cursor_row == 2
        assert column(table, "verdict") == ["baseline", "1.72x faster, activations -46 %, memory -36 %",
                                            "1.67x faster, activations -46 %, memory -36 %"]
        await pilot.press("s")  # again: the trainer's verdicts, each against the segment before
        assert verdict_header(table) == "vs the segment before"
        assert column(table, "verdict")[2].startswith("no clear difference (±20 %")
        await pilot.press("b", "b")  # b on the baseline row: back too
        assert verdict_header(table) == "vs the segment before" and link.sent == []
        assert "b baseline · s vs start · T trial of the row's change · e explain" in str(screen.query_one(".view-keys").content)


async def test_a_segment_too_short_to_judge_by_is_refused_as_the_baseline_saying_why() -> None:
    """Chosen, a segment without a step-time interval made every verdict "too few steps to judge", unexplained."""
    from dataclasses import replace

    start, bf16, clip = impact(bf16_steps=40, clip_steps=30).segments
    short = replace(clip, change="accum=2", options={**clip.options, "accum": 2}, first_step=191, last_step=193,
                    median_step_time_s=None, step_time_low_s=None, step_time_high_s=None)
    app, link = app_with(protocol.Impact(segments=[start, bf16, clip, short]))
    async with app.run_test(size=WIDE) as pilot:
        screen, table = await open_impact_view(app, pilot)
        await pilot.press("down", "down", "down", "b")
        assert verdict_header(table) == "vs the segment before" and screen.baseline_step is None
        assert ("accum=2 at step 191 as the baseline: too few timed steps to judge against (steps 191–193); choose a "
                "longer segment") in log_text(app) and link.sent == []


async def test_at_160_columns_a_long_verdict_wraps_so_that_every_column_stays_on_the_screen() -> None:
    """The noise of segments run in turn lengthens a verdict: at 160 columns it wraps beside samples/s, memory and the
    loss slope rather than pushing them past the screen's edge (at 80 they are a scroll away, as before)."""
    app, _ = app_with(impact(bf16_steps=40, clip_steps=30))
    async with app.run_test(size=WIDE) as pilot:
        _, table = await open_impact_view(app, pilot)
        assert sum(column.get_render_width(table) for column in table.ordered_columns) <= table.scrollable_content_region.width
        assert column(table, "verdict")[2] == ("no clear difference (±20 %, segments ran in turn,\n"
                                               "so load changes sway it, try a trial), same memory")


#: The glyphs of a horizontal scrollbar's thumb: seen as text (tmux capture-pane), stray marks among the rows.
SCROLLBAR_GLYPHS = "▏▎▍▌▋▊▉"


def cut_cells(table) -> list[str]:
    """The header and cell lines of ``table`` wider than their columns: what the screen would show cut."""
    cut = []
    for column in table.ordered_columns:
        room = column.get_render_width(table) - 2 * table.cell_padding
        for text in [str(column.label), *(str(getattr(cell, "plain", cell)) for cell in table.get_column(column.key))]:
            cut += [line for line in text.splitlines() if len(line) > room]
    return cut


@pytest.mark.parametrize("size", [SMALL, WIDE])
async def test_the_segments_get_the_room_and_no_header_or_cell_is_cut(size) -> None:
    """Issue 45: at 80x24 two rows of segments sat under eight lines of explanation, the verdict's header read "vs the
    segment be", a trial's "cannot run here: c │ (a relaunch)" was cut mid-sentence, and ▌/▉ stood about (the
    trials table's scrollbar). The explanation is a line (e: the whole), every header and cell fits its column, the
    table scrolls sideways to the columns past the edge at 80, and at 160 every column is on the screen."""
    from textual.widgets import DataTable

    from torchlab.tui.screens.impact_screen import EXPLANATION, SHORT_EXPLANATION

    relaunch = protocol.TrialResult(step=130, option="world_size", value=2, steps=20, arms=[],
                                    error="cannot run here: changing the world size starts new ranks (a relaunch)")
    app, _ = app_with(several_changes(), relaunch)
    async with app.run_test(size=size) as pilot:
        screen, table = await open_impact_view(app, pilot)
        trials = screen.query_one("#trials-table", DataTable)
        assert cut_cells(table) == [] and cut_cells(trials) == []
        assert verdict_header(table) == "vs the segment before"
        assert column(trials, "verdict")[0].endswith("starts new ranks (a relaunch)")
        assert not any(glyph in app.export_screenshot() for glyph in SCROLLBAR_GLYPHS)
        explanation = screen.query_one("#impact-explanation")
        keys = str(screen.query_one(".view-keys").content)
        if size == SMALL:
            assert explanation.size.height == 1 and table.size.height >= 12  # the header and a dozen lines of rows
            assert column(table, "change")[3] == "accum=2,\nlr_scale=0.5"  # in lines, leaving the verdict its room
            assert "← → columns" in keys
            await pilot.press("right")  # the columns past the edge, a scroll away
            assert table.scroll_x > 0
            await pilot.press("e")
            assert str(explanation.content) == EXPLANATION
            await pilot.press("e")
            assert str(explanation.content) == SHORT_EXPLANATION
        else:
            assert table.virtual_size.height <= table.size.height  # every row
            assert sum(column.get_render_width(table) for column in table.ordered_columns) <= table.scrollable_content_region.width
            assert column(table, "change")[3] == "accum=2, lr_scale=0.5" and "←" not in keys
            assert str(explanation.content) == EXPLANATION  # room for it whole


def several_changes() -> protocol.Impact:
    """The fake table with a fourth row that changed two options at once, and a fifth that changed the world size."""
    from dataclasses import replace

    start, bf16, clip = impact(bf16_steps=40, clip_steps=30).segments
    both = replace(clip, change="accum=2, lr_scale=0.5", options={**clip.options, "accum": 2, "lr_scale": 0.5},
                   first_step=191, last_step=200)
    ranks = replace(both, change="world_size=2", options={**both.options, "world_size": 2}, first_step=201, last_step=210)
    fp16 = replace(ranks, change="amp=fp16", options={**ranks.options, "amp": "fp16"}, first_step=211, last_step=220)
    return protocol.Impact(segments=[start, bf16, clip, both, ranks, fp16])


async def test_t_on_a_row_tries_its_change_as_the_trial_prompt_would_and_says_why_where_it_cannot() -> None:
    from torchlab.core.records.settings import DEFAULT_TRIAL_STEPS

    app, link = app_with(several_changes())
    async with app.run_test(size=WIDE) as pilot:
        await answer(app, pilot)
        await pilot.press("a")  # the run now has amp=bf16: a trial of the bf16 row tries the value it changed from
        await answer(app, pilot)
        assert link.sent == [protocol.SetCommand("amp", "bf16")]
        screen, table = await open_impact_view(app, pilot)
        await pilot.press("down", "T")
        assert link.sent[1:] == [protocol.TrialCommand("amp", "off", DEFAULT_TRIAL_STEPS)]
        assert (f"trial of amp = off for {DEFAULT_TRIAL_STEPS} steps requested (the row's change undone: the run has "
                "amp=bf16 now)") in log_text(app)
        await pilot.press("down", "T")
        assert link.sent[2:] == [protocol.TrialCommand("clip", "1.0", DEFAULT_TRIAL_STEPS)]
        assert f"trial of clip = 1.0 for {DEFAULT_TRIAL_STEPS} steps requested (from the next step boundary" in log_text(app)
        for row, why in ((0, "trial of start: the start changed no option: choose the row of a change (nothing sent)"),
                         (3, "trial of accum=2, lr_scale=0.5: a trial tries one option; this row changed accum and lr_scale "
                             "at once"),
                         (4, "trial of world_size=2: a trial cannot change the world size"),
                         (5, "trial of amp=fp16: fp16 needs CUDA; this run is on cpu")):
            table.move_cursor(row=row)
            await pilot.press("T")
            assert why in log_text(app) and len(link.sent) == 3
        assert isinstance(app.screen, type(screen))  # the view stays open


# ---------------------------------------------------------------------- keys

async def test_new_views_are_in_the_help_and_the_command_palette() -> None:
    from torchlab.tui.screens.help_screen import HelpScreen
    from torchlab.tui.screens.impact_screen import ImpactScreen

    app, _ = app_with()
    async with app.run_test(size=SMALL) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        listed = dict(app.screen.keys)
        assert listed["P"].startswith("Profiles") and listed["i"].startswith("Impact") and listed["t"].startswith("System")
        await pilot.press("escape")
        commands = {command.title: command for command in app.get_system_commands(app.screen)}
        assert any(title.startswith("Profiles") and command.help == "key P" for title, command in commands.items())
        assert any(title.startswith("System") for title in commands)
        impact_command = next(command for title, command in commands.items() if title.startswith("Impact"))
        await impact_command.callback()
        await pilot.pause()
        assert isinstance(app.screen, ImpactScreen)


async def test_a_verdict_unclear_when_it_settled_is_logged_again_once_the_step_times_are_clear() -> None:
    import dataclasses

    def unclear(bf16_steps: int) -> protocol.Impact:
        start, bf16 = impact(bf16_steps=bf16_steps).segments
        return protocol.Impact(segments=[start, dataclasses.replace(
            bf16, speedup=None, verdict="amp=bf16: no clear difference (±30 %), activations -46 %, memory -36 %")])

    app, link = app_with(unclear(40))
    async with app.run_test(size=SMALL) as pilot:
        await answer(app, pilot)
        assert log_text(app).count("amp=bf16: no clear difference (±30 %)") == 1
        link.push(unclear(50))
        await answer(app, pilot)
        assert log_text(app).count("amp=bf16: no clear difference") == 1  # the same answer is not repeated
        link.push(impact(bf16_steps=80))
        await answer(app, pilot)
        assert log_text(app).count("amp=bf16: 1.72x faster") == 1  # the answer, once it is one
        link.push(impact(bf16_steps=120))
        await answer(app, pilot)
        assert log_text(app).count("amp=bf16") == 2


async def test_a_trials_result_lands_in_the_log_and_one_that_could_not_run_says_why() -> None:
    from torchlab.core.wire.payloads import TrialArm

    arms = [TrialArm(label=label, steps=20, median_step_time_s=ms / 1000, step_time_low_s=0.99 * ms / 1000,
                     step_time_high_s=1.01 * ms / 1000, activations_bytes=size, tensor_bytes=size + 100, losses=[2.5], error=None)
            for label, ms, size in (("checkpointing=on", 13.3, 100), ("as it is", 10.0, 1000))]
    app, _ = app_with(protocol.TrialResult(step=121, option="checkpointing", value="on", steps=20, arms=arms),
                      protocol.TrialResult(step=130, option="amp", value="fp16", steps=20, arms=[],
                                           error="amp=fp16 cannot run here: fp16 needs CUDA"))
    async with app.run_test(size=SMALL) as pilot:
        await answer(app, pilot)
        text = log_text(app)
        assert "trial checkpointing=on from step 121, 20 steps each on the same batches: 1.33x slower, activations -90 %" in text
        assert "trial amp=fp16 from step 130 could not run: amp=fp16 cannot run here: fp16 needs CUDA" in text
        await pilot.press("i")  # and the impact view lists them under the segments
        trials = app.screen.query_one("#trials-table")
        assert column(trials, "trial") == ["checkpointing=on", "amp=fp16"]
        verdicts = column(trials, "verdict")
        assert verdicts[0].startswith("1.33x slower, activations -90 %") and verdicts[1].startswith("could not run: ")


async def test_the_header_says_how_far_a_running_trial_is_and_forgets_it_once_its_result_is_in() -> None:
    from torchlab.tui.widgets.run_header import RunHeader

    def header(app: TorchlabApp) -> str:
        return str(app.query_one(RunHeader).content)

    app, link = app_with(protocol.TrialProgress(step=121, label="checkpointing=on", arm=1, done=7, steps=20))
    async with app.run_test(size=SMALL) as pilot:
        await answer(app, pilot)
        assert "● trying checkpointing=on 7/20  step 120/" in header(app)
        link.push(protocol.TrialProgress(step=121, label="checkpointing=on", arm=2, done=3, steps=20))
        await answer(app, pilot)
        assert "trying checkpointing=on: as it is 3/20" in header(app)
        link.push(protocol.TrialResult(step=121, option="checkpointing", value="on", steps=20, arms=[], error="stopped"))
        await answer(app, pilot)
        assert "trying" not in header(app)
        # The progress is the newest value, sent apart from the ordered events: one can land after the result,
        # or (to an app that attaches) long after the trial. Training past its step says it is over.
        link.push(protocol.TrialProgress(step=121, label="checkpointing=on", arm=2, done=20, steps=20))
        await answer(app, pilot)
        assert "trying" not in header(app)


async def test_t_asks_for_a_trial_checks_it_as_the_trainer_would_and_sends_it() -> None:
    from torchlab.tui.screens.prompt import OptionPrompt

    app, link = app_with()
    async with app.run_test(size=SMALL) as pilot:
        await answer(app, pilot)
        await pilot.press("T")
        prompt = app.screen
        assert isinstance(prompt, OptionPrompt)
        # The hint is read as typed, not as markup: "[STEPS]" was taken for a style tag and vanished.
        assert str(prompt.query_one("#prompt-hint").render()).startswith("OPTION=VALUE [STEPS], e.g. amp=bf16")
        for typed, error in (("turbo=on", "unknown option 'turbo'"), ("world_size=2", "a trial cannot change the world size"),
                             ("amp bf16", "type OPTION=VALUE"), ("clip=1.0 0", "STEPS must be a whole number from 1 to 1000 (steps an arm), got '0'"),
                             ("clip=1.0 " + "9" * 5000, "STEPS must be a whole number from 1 to 1000 (steps an arm), got '999")):
            prompt.query_one("#prompt-input").value = typed  # as typed (5,000 key presses take minutes)
            await pilot.press("enter")
            assert error in prompt.error_text and link.sent == []
        prompt.query_one("#prompt-input").value = ""
        await pilot.press(*"checkpointing=on 8", "enter")
        assert link.sent == [protocol.TrialCommand("checkpointing", "on", 8)]
        assert "trial of checkpointing = on for 8 steps requested" in log_text(app)
        await pilot.press("M")  # views do not open over one another; T is a trainer key, off in a view
        await pilot.press("T")
        assert not isinstance(app.screen, OptionPrompt)


def test_a_verdict_wraps_between_its_parts_and_a_wide_spread_reads_as_a_ratio() -> None:
    from dataclasses import replace

    from torchlab.tui.screens.impact_screen import step_time_text, wrap_verdict

    noisy = "no clear difference (step times varied up to 7.9x), activations -44 %, memory -40 %"
    assert wrap_verdict(noisy, 33) == "no clear difference\n(step times varied up to 7.9x),\nactivations -44 %, memory -40 %"
    assert wrap_verdict(noisy, 200) == noisy
    # A part too wide breaks between its words (a trial's "could not run: ..." was cut mid-sentence), never in a figure
    assert wrap_verdict("workers=2 data wait 4.2 → 0.1 ms", 10) == "workers=2\ndata wait\n4.2 → 0.1 ms"
    assert wrap_verdict("step times varied up to 7.9x, memory -40 %", 16) == "step times\nvaried up to\n7.9x,\nmemory -40 %"
    segment = impact().segments[1]
    assert step_time_text(replace(segment, median_step_time_s=0.314, step_time_low_s=0.2, step_time_high_s=1.225)) == "314 ms ≤3.9x"
    assert step_time_text(replace(segment, median_step_time_s=0.314, step_time_low_s=0.2, step_time_high_s=0.5)) == "314 ms ±59 %"
