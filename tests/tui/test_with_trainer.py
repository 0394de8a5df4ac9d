"""The real app against a real trainer process on a tiny model: keys, acknowledgements, quit, failure.

These are the tests that caught what fakes cannot: a quit that hung because closing the link takes
real seconds (a final checkpoint), while the app's own flag shadowed Textual's ``_closing``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from processes import alive, forecasters_of
from tmpfs import small_disk  # noqa: F401 (a fixture: a 3 MB tmpfs)
from torchlab.core.engine.parallel.distributed import usable_cpus
from torchlab.core.units import format_bytes
from torchlab.tui.app import TorchlabApp
from torchlab.tui.link import ProcessLink
from torchlab.tui.screens.error_screen import ErrorScreen
from torchlab.tui.widgets.event_log import EventLog
from torchlab.tui.widgets.grad_table import GradTable
from torchlab.tui.widgets.rank_table import RankTable

TINY = str(Path(__file__).parent.parent / "workloads" / "tiny.py")
SIZE = (120, 40)


async def until(pilot, condition, timeout: float = 60.0, what: str = "") -> None:
    """Let the app run (its own 10 Hz timer drains the link) until ``condition()`` holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what or condition}"
        await pilot.pause(0.05)


def error_screen_shown(app) -> bool:
    """The error screen is on top and mounted: its widgets can be read and its keys pressed."""
    return isinstance(app.screen, ErrorScreen) and app.screen.is_mounted


def app_with_trainer(run_dir: Path, *args: str):
    links: list[ProcessLink] = []

    def factory() -> ProcessLink:
        links.append(ProcessLink(run_dir, list(args)))
        return links[-1]

    return TorchlabApp(factory, workload="tiny"), links


def log_text(app) -> str:
    return "\n".join(app.query_one(EventLog).lines_written)


def events_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


async def test_keys_change_a_real_run_and_quit_leaves_no_trainer(tmp_path):
    run_dir = tmp_path / "run"
    app, links = app_with_trainer(run_dir, f"{TINY}:workload", "--steps", "100000", "--checkpoint-every", "0")
    async with app.run_test(size=SIZE) as pilot:
        state = app.run_state
        # Typed as the screen shows, while the trainer loads torch: queued (it was refused, "try again in a moment")
        # and applied at the first step boundary, where --at 1:accum=2 would be.
        assert not state.welcomed
        await pilot.press("m", "2", "enter")
        assert "accum = 2: queued, applied at the first step boundary" in "\n".join(app.query_one(EventLog).lines_written)
        await until(pilot, lambda: state.step >= 2 and state.modules, what="module rows")
        assert app.query_one(GradTable).displayed_keys[:2] == ["stem", "body.0.0"]
        await until(pilot, lambda: state.options.get("accum") == 2 and not state.pending, what="accum=2 acknowledged")

        await pilot.press("a")
        await until(pilot, lambda: state.option("amp") == "bf16", what="amp=bf16 acknowledged")
        await pilot.press("c")
        await until(pilot, lambda: state.option("checkpointing") is True, what="checkpointing acknowledged")
        await pilot.press("g", *"0.5", "enter")
        await until(pilot, lambda: state.option("clip") == 0.5, what="clip acknowledged")
        await pilot.press("a")  # bf16 -> off: fp16 is skipped on a CPU run, which would refuse it, saying why
        await until(pilot, lambda: state.option("amp") == "off" and not state.pending, what="amp=off acknowledged")
        await pilot.press("space")
        await until(pilot, lambda: state.state == "paused", what="paused")
        paused_at = state.step
        await pilot.press("space")
        await until(pilot, lambda: state.state == "running" and state.step > paused_at, what="running again")

        shown = "\n".join(app.query_one(EventLog).lines_written)
        applied: dict[str, int] = {}  # each option's first change (amp's second, to off, comes after)
        for e in events_of(run_dir):
            if e["event"] == "option_applied":
                applied.setdefault(e["option"], e["step"])
        assert set(applied) == {"accum", "amp", "checkpointing", "clip"} and applied["accum"] == 1
        for option, value in (("accum", "2"), ("amp", "bf16"), ("checkpointing", "on"), ("clip", "0.5")):
            assert f"{option} = {value} applied at step {applied[option]}" in shown  # the app and the journal agree
        assert "amp: fp16 skipped: fp16 needs CUDA; this run is on cpu: use bf16" in shown

        # The heatmap: the trainer's update ratios per module, over the steps it measured; f shows the weight norms
        await until(pilot, lambda: state.health.has("update ratio"), what="an update ratio")
        await pilot.press("H")
        await until(pilot, lambda: "measured steps" in str(app.screen.query_one("#heatmap-status").content),
                    what="the heatmap")
        assert str(app.screen.query_one("#heatmap-status").content).startswith("update ratio (‖Δθ‖/‖θ‖")
        assert " · step " in str(app.screen.query_one("#heatmap-cell").content)
        await pilot.press("f")
        assert str(app.screen.query_one("#heatmap-status").content).startswith("weight norm")
        await pilot.press("H")

        trainer_pid = links[0].pid
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, what="the app to exit after q")
    assert app.return_code == 0
    assert not alive(trainer_pid)
    assert events_of(run_dir)[-1] == {**events_of(run_dir)[-1], "event": "run_ended", "status": "stopped"}
    assert (run_dir / "checkpoints" / "last.pt").exists()
    # What the terminal says after the app (core/launch/cli.py), as a headless run interrupted says it
    assert app.how_it_ended(run_dir) == [
        f"Stopped at step {app.run_state.step} of 100000.",
        f"Stopped before its 100000 steps; continue it with torchlab-tui --resume {run_dir.absolute()}"]


async def test_a_model_with_long_alike_names_and_a_tied_head_reads_well_from_a_real_trainer(tmp_path):
    from torchlab.tui.screens.help_screen import HelpScreen

    long_names = str(Path(__file__).parent.parent / "workloads" / "long_names.py")
    app, links = app_with_trainer(tmp_path / "run", f"{long_names}:workload", "--steps", "100000", "--checkpoint-every", "0")
    async with app.run_test(size=(80, 24)) as pilot:
        state = app.run_state
        await until(pilot, lambda: state.modules and state.grad_step is not None, what="module rows and norms")
        grads = app.query_one(GradTable)
        keys = grads.displayed_keys
        labels = [grads.table.get_cell(key, "module").rstrip() for key in keys]
        assert len(keys) == 35 and "lm_head" not in keys and len(set(labels)) == len(labels)
        [embeddings] = [module for module in state.modules if module.tied]
        assert (embeddings.name, embeddings.tied) == ("bert.embeddings.word_embeddings", ("lm_head",))
        assert labels[keys.index(embeddings.name)].endswith("= lm_head")
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert dict(app.screen.keys)["c"].endswith(": bert.encoder.layer.0–3 (4 blocks)")
        await pilot.press("escape", "q")
        await until(pilot, lambda: not app.is_running, what="the app to exit after q")


async def test_a_workload_that_raises_shows_the_error_and_the_app_stays_up(tmp_path):
    """What a restart from here does is shown once each where it is cheapest: the trainer resuming from the checkpoint
    before the raise (tests/process/test_worker.py), and the app's restart of a dead trainer (the killed-trainer test
    below); a third trainer started here for it showed neither anew."""
    run_dir = tmp_path / "run"
    app, links = app_with_trainer(run_dir, f"{TINY}:raises_at_step_4", "--steps", "6", "--checkpoint-every", "1")
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: error_screen_shown(app), what="the error screen")
        assert "simulated failure inside the model" in app.run_state.failure.message
        # At 80x24 the traceback shows the engine's frames: the message above it leads with the user's (issue 45)
        shown = app.screen.query_one("#error-message")
        assert str(shown.content).startswith(f"{TINY}:") and "in forward(): RuntimeError" in str(shown.content)
        assert 'raise RuntimeError("simulated failure inside the model")' in str(shown.content)
        assert shown.region.bottom <= 24 and shown.region.height >= 3
        assert "tiny.py" in app.run_state.failure.detail  # the traceback names the user's file
        await pilot.press("escape")  # close the screen: the app is still there and answers keys
        await until(pilot, lambda: not isinstance(app.screen, ErrorScreen))
        await pilot.press("question_mark")
        await until(pilot, lambda: app.screen.__class__.__name__ == "HelpScreen", what="help")
        await pilot.press("escape")
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, what="exit")


async def test_a_real_profile_opens_as_a_table_what_fits_is_predicted_and_a_change_says_its_prediction_and_adds_an_impact_row(tmp_path):
    from textual.widgets import DataTable

    from torchlab.tui.screens.fits_screen import FitsScreen
    from torchlab.tui.screens.impact_screen import ImpactScreen
    from torchlab.tui.screens.profile_screens import ProfileListScreen, ProfileTableScreen

    run_dir = tmp_path / "run"
    app, links = app_with_trainer(run_dir, f"{TINY}:workload", "--steps", "100000", "--checkpoint-every", "0",
                                   "--forecast-priority", "low")  # beside tests that keep both cores busy
    async with app.run_test(size=SIZE) as pilot:
        state = app.run_state
        await until(pilot, lambda: state.step >= 2 and state.impact, what="training and a first impact table")
        await pilot.press("p")
        await until(pilot, lambda: state.profiles, timeout=120, what="the profile's tables")
        [snapshot] = state.profiles
        assert snapshot.error is None
        shown = "\n".join(app.query_one(EventLog).lines_written)
        assert f"ready: P opens the table · profiles/{Path(snapshot.dir).name}/" in shown
        assert (Path(snapshot.dir) / "trace.json").exists() and (Path(snapshot.dir) / "table.csv").exists()

        await pilot.press("P")
        assert isinstance(app.screen, ProfileListScreen)
        await pilot.press("enter")
        assert isinstance(app.screen, ProfileTableScreen)
        names = [str(cell) for cell in app.screen.query_one(DataTable).get_column("name")]
        assert any(name.startswith("aten::") for name in names), names
        await pilot.press("escape", "escape")

        # What fits: the run's forecaster (a process beside the trainer) predicts the settings in force and each change
        await pilot.press("F")
        assert isinstance(app.screen, FitsScreen)
        await until(pilot, lambda: state.predicted() is not None and state.predicted(checkpointing=True) is not None,
                    timeout=120, what="the settings in force and checkpointing=on predicted")
        rows = [[str(cell) for cell in app.screen.query_one(DataTable).get_row_at(index)]
                for index in range(app.screen.query_one(DataTable).row_count)]
        assert rows[0][0] == "in force" and rows[0][2] == "yes" and "checkpointing=on" in [row[0] for row in rows]
        now, then = (format_bytes(event.corrected_peak_bytes) for event in (state.predicted(), state.predicted(checkpointing=True)))
        await pilot.press("escape")

        await pilot.press("c")
        assert f"requested checkpointing = on (applies at the next step): peak {now} → {then} predicted" in log_text(app)
        await until(pilot, lambda: any(row.change == "checkpointing=on" for row in state.impact),
                    what="an impact segment for checkpointing=on")
        await until(pilot, lambda: state.predicted(amp="bf16") is not None, timeout=120,
                    what="the changes from the new settings predicted too")
        await pilot.press("i")
        assert isinstance(app.screen, ImpactScreen)
        changes = [str(cell) for cell in app.screen.query_one(DataTable).get_column("change")]
        assert changes[0] == "start" and "checkpointing=on" in changes
        await pilot.press("escape", "q")
        await until(pilot, lambda: not app.is_running, what="the app to exit after q")
    journalled = [event for event in events_of(run_dir) if event["event"] == "memory_predicted"]
    assert {"in force", "checkpointing=on"} <= {event["change"] for event in journalled}
    assert not forecasters_of(run_dir)  # it ended with the run


async def test_a_run_that_went_nan_restarts_with_the_lr_scale_and_clip_set_on_its_error_screen(tmp_path):
    run_dir = tmp_path / "run"
    app, links = app_with_trainer(run_dir, f"{TINY}:nan_in_forward", "--steps", "50", "--checkpoint-every", "1")
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: error_screen_shown(app), what="the error screen of the NaN")
        assert app.run_state.failure.kind == "nonfinite"
        said = str(app.screen.query_one("#error-message").content)  # the headless line's words (issue 45)
        assert f"are in {run_dir / 'checkpoints'}" in said and f"torchlab-tui --resume {run_dir} --lr-scale 0.5" in said
        await pilot.press("l", *"0.5", "enter", "g", *"1.0", "enter")
        await until(pilot, lambda: app.screen.changed == {"lr_scale": 0.5, "clip": 1.0}, what="both options set")
        stopped_at = app.run_state.checkpoint_step
        await pilot.press("r")
        link = links[0]
        await until(pilot, lambda: app.run_state.state in ("running", "failed") and link.pid is not None
                    and any(e["event"] == "resumed_from_checkpoint" for e in events_of(run_dir)), what="the restarted trainer")
        assert link.process.args[-7:] == ["--", "--resume", str(run_dir), "--lr-scale", "0.5", "--clip", "1.0"]
        resumed = [e for e in events_of(run_dir) if e["event"] == "resumed_from_checkpoint"][-1]
        assert resumed["step"] == stopped_at and resumed["options"]["lr_scale"] == 0.5 and resumed["options"]["clip"] == 1.0
        [changed] = [e for e in events_of(run_dir) if e["event"] == "resume_changed_settings"]
        assert {change["setting"] for change in changed["changes"]} == {"lr_scale", "clip"}
        # The restarted trainer's first step trains with them (it goes NaN again a few steps on: the poison is
        # in its forward, not in its learning rate; what matters here is what its steps ran with).
        first = await first_metrics_after(pilot, run_dir, stopped_at)
        assert first["step"] == stopped_at + 1 and first["lr_scale"] == 0.5 and first["clip"] == 1.0
        await until(pilot, lambda: app.run_state.state in ("failed", "finished"), what="the restarted run to end")
        await until(pilot, lambda: error_screen_shown(app), what="its error screen")
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, what="exit")
    # q on the error screen left only "Run directory: ..." on the terminal: now how it ended, and how to go on
    said, continuing = app.how_it_ended(run_dir)
    assert said.startswith(f"Stopped on a non-finite value at step {app.run_state.failure.step}: ")
    assert continuing == f"Its last checkpoint is kept; continue from it with torchlab-tui --resume {run_dir.absolute()}"


async def first_metrics_after(pilot, run_dir: Path, step: int) -> dict:
    def rows() -> list[dict]:
        path = run_dir / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    await until(pilot, lambda: any(row["step"] > step for row in rows()), what=f"a metrics row after step {step}")
    return min((row for row in rows() if row["step"] > step), key=lambda row: row["step"])


@pytest.mark.skipif(usable_cpus() < 2, reason="two ranks need two CPU cores")
async def test_two_ranks_fill_the_rank_table_and_quit_leaves_none(tmp_path):
    run_dir = tmp_path / "run"
    app, links = app_with_trainer(run_dir, f"{TINY}:workload", "--world-size", "2", "--steps", "100000", "--checkpoint-every", "0")
    async with app.run_test(size=SIZE) as pilot:
        table = app.query_one("#ranks", RankTable)
        await until(pilot, lambda: len(app.run_state.ranks) == 2 and table.display, timeout=120, what="two ranks' figures")
        await pilot.pause()
        header, *rows = table.render().plain.splitlines()
        assert header.split()[:2] == ["rank", "step"]
        assert [row.replace("⚑", "").split()[0] for row in rows] == ["0", "1"]
        assert all(" ms" in row and "n/a" in row and "MiB" in row for row in rows)  # times; no allocator on CPU; RSS
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, what="the app to exit after q")
    [started] = [e for e in events_of(run_dir) if e["event"] == "run_started"]
    assert len(started["ranks"]) == 2 and not any(alive(rank["pid"]) for rank in started["ranks"])


async def test_a_trainer_killed_mid_run_is_reported_at_its_last_step_and_restarts_from_its_checkpoint(tmp_path):
    import os
    import signal

    from textual.widgets import Label

    run_dir = tmp_path / "run"
    app, links = app_with_trainer(run_dir, f"{TINY}:workload", "--steps", "100000", "--checkpoint-every", "5", "--seed", "3")
    async with app.run_test(size=SIZE) as pilot:
        state = app.run_state
        await until(pilot, lambda: state.step >= 12, what="a few checkpoints")
        link = links[0]
        os.kill(link.pid, signal.SIGKILL)
        await until(pilot, lambda: error_screen_shown(app), what="the error screen")
        reached = link.last_step
        assert reached >= 12 and app.screen.failure.step == reached  # not "failed at step 0"
        assert f"after step {reached}" in app.screen.failure.message
        # what a resume takes is last.pt's step file: a kill between a step file's rename and last.pt's can leave a
        # newer step file on disk, whole, that last.pt does not yet point at (seen once in CI)
        last = (run_dir / "checkpoints" / "last.pt").stat()
        checkpoint = next(p.name for p in (run_dir / "checkpoints").glob("step-*.pt") if os.path.samestat(p.stat(), last))
        keys = str(app.screen.query_one("#error-keys", Label).content)
        assert f"r restarts from {checkpoint}, step {int(checkpoint[5:12])}" in keys
        assert not any(p.exists() for p in (link._endpoint.socket_path, link._endpoint.token_path, link._endpoint.info_path))

        await pilot.press("r")
        await until(pilot, lambda: state.state == "running" and link.pid is not None and alive(link.pid), what="the restarted trainer")
        assert link.process.args[-3:] == ["--", "--resume", str(run_dir)]  # the checkpoint's settings, not the first flags again
        resumed = [e for e in events_of(run_dir) if e["event"] == "resumed_from_checkpoint"]
        assert resumed and resumed[-1]["step"] == int(checkpoint[5:12])
        os.kill(link.pid, signal.SIGKILL)
        await until(pilot, lambda: error_screen_shown(app), what="the error screen again")
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, what="the app to exit")
    assert app.return_code == 1  # the run failed: the exit status says so


MISBEHAVING = str(Path(__file__).parent.parent / "workloads" / "misbehaving.py")


@pytest.mark.parametrize("workload, expected, message", [
    # bad input: the trainer refuses the workload before training, and exits 2
    (f"{TINY}:factory_raises", 2, "the factory factory_raises() raised ValueError"),
    (f"{TINY}:nan_in_forward", 3, "non-finite"),
    # sys.exit(3) in the factory ended the trainer with 3, a non-finite stop to the app; sys.exit() with 0
    (f"{MISBEHAVING}:factory_exits_3", 1, "the workload called sys.exit(3) in its factory factory_exits_3()"),
    (f"{MISBEHAVING}:factory_exits", 1, "the workload called sys.exit() in its factory factory_exits()"),
    (f"{MISBEHAVING}:loss_exits_at_step_3", 1, "the workload called sys.exit(3) while it trained"),
    (f"{MISBEHAVING}:len_minus_one", 2, "Samples.__len__"),
], ids=["bad-input", "non-finite", "factory-exits-3", "factory-exits", "loss-exits", "len-minus-one"])
async def test_the_app_exits_as_the_trainer_did_when_the_user_quits_from_the_error_screen(tmp_path, workload, expected, message):
    app, links = app_with_trainer(tmp_path / "run", workload, "--steps", "50")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: error_screen_shown(app), what="the error screen")
        assert message in app.screen.failure.message
        if expected != 3:  # the user's code named by its line: one paragraph, no traceback panel
            assert "Traceback" not in app.screen.failure.detail
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, what="the app to exit")
    assert links[0].trainer_exit_code == expected
    assert app.return_code == expected


async def test_a_full_disk_mid_run_is_its_paragraph_without_a_traceback_and_the_app_exits_1(small_disk):
    """On a real 3 MB file system filled while the run trains: the error screen showed the trainer's traceback for a
    full disk, torchlab's own words being all there is to say (which file, what is intact)."""
    from tmpfs import leave_free

    run_dir = small_disk / "run"
    app, links = app_with_trainer(run_dir, f"{small_disk / 'workload.py'}:workload", "--steps", "100000",
                                  "--checkpoint-every", "0", "--telemetry-interval", "0", "--eval-every", "0")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.run_state.step >= 2, what="training")
        leave_free(small_disk, 0)
        await until(pilot, lambda: error_screen_shown(app), what="the error screen")
        failure = app.screen.failure
        assert failure.message.startswith("no space left on device writing metrics.jsonl")
        assert failure.detail == "" and not app.screen.query("#error-detail")
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, what="the app to exit")
    assert links[0].trainer_exit_code == 1
    assert app.return_code == 1


async def test_a_spike_the_guard_held_back_is_said_and_marked_on_the_loss_chart_not_drawn_in_its_line(tmp_path):
    """One batch times 1e4 at step 21 (its loss ~2e4) under --spike-guard skip: a warning in the event log, a mark on
    the loss chart's top row and in its title, and the line drawn without it; G cycles the guard on to rollback."""
    from torchlab.tui.widgets.line_chart import MARK, LineChart

    app, links = app_with_trainer(tmp_path / "run", f"{TINY}:spike_at_step_21", "--steps", "100000", "--seed", "3",
                                  "--spike-guard", "skip", "--checkpoint-every", "0", "--eval-every", "0")
    async with app.run_test(size=SIZE) as pilot:
        state = app.run_state
        await until(pilot, lambda: state.step >= 25 and state.spikes, what="the spike and the steps after it")
        assert state.spikes == [21] and max(state.loss.ys) < 100
        shown = "\n".join(app.query_one(EventLog).lines_written)
        assert "spike at step 21: loss" in shown and "its update held back" in shown
        chart = app.query_one("#loss-chart", LineChart)
        await until(pilot, lambda: "spike" in str(chart.border_title), what="the chart's title")
        await until(pilot, lambda: MARK in chart.render_line(0).text, what="the mark (charts redraw in turn)")
        await pilot.press("G")
        await until(pilot, lambda: state.options.get("spike_guard") == "rollback", what="the guard's change acknowledged")
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, what="exit")


async def test_an_out_of_memory_step_rescued_is_said_and_its_rung_shows_in_the_options_panel(tmp_path):
    """A forward of more than 8 samples out of memory, batches of 16: step 1 is retried with split = 2, which the
    event log says and the options panel shows, as a change typed with k would."""
    app, links = app_with_trainer(tmp_path / "run", f"{TINY}:out_of_memory_above_8", "--steps", "100000",
                                  "--checkpoint-every", "0", "--eval-every", "0")
    async with app.run_test(size=SIZE) as pilot:
        state = app.run_state
        await until(pilot, lambda: state.step >= 3 and state.options.get("split") == 2, what="the rescued steps")
        shown = "\n".join(app.query_one(EventLog).lines_written)
        assert "step 1 ran out of memory (CUDA out of memory." in shown and "retried with split = 2 (was 1)" in shown
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, what="exit")


async def test_a_transformers_trainer_in_the_app_says_its_starting_values_and_takes_amp_and_checkpointing_live(tmp_path):
    """A factory that returns a transformers Trainer, in the app at 80x24: the event log says which starting values
    its TrainingArguments gave, the options panel and the LR chart (its decay and no_decay groups) show them, and
    the keys change amp and checkpointing on its GPT-2 while it trains."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from torchlab.tui.widgets.line_chart import LineChart

    hf = str(Path(__file__).parent.parent / "workloads" / "hf_trainer.py")
    app, links = app_with_trainer(tmp_path / "run", f"{hf}:workload", "--steps", "100000", "--checkpoint-every", "0")
    async with app.run_test(size=(80, 24)) as pilot:
        state = app.run_state
        await until(pilot, lambda: state.step >= 2 and state.modules, what="the first steps")
        shown = "\n".join(app.query_one(EventLog).lines_written)
        assert "the workload's own starting values: batch_size 4, accum 2, clip 1.0, eval_every 4" in " ".join(shown.split())
        assert (state.option("accum"), state.option("clip")) == (2, 1.0)
        assert [line.label for line in app.query_one("#lr-chart", LineChart).lines] == ["decay", "no_decay"]
        await pilot.press("a")
        await until(pilot, lambda: state.option("amp") == "bf16", what="amp=bf16 acknowledged")
        await pilot.press("c")
        await until(pilot, lambda: state.option("checkpointing") is True, what="checkpointing acknowledged")
        trainer_pid = links[0].pid
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, what="the app to exit after q")
    assert app.return_code == 0 and not alive(trainer_pid)
