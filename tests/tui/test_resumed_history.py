"""A resumed run in the app: its earlier steps come from the run's journals, and the log says it resumed."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from fake_link import FakeLink, quiet_app, record, welcome

from torchlab.core.wire import protocol, strict_json
from torchlab.tui.widgets.event_log import EventLog

RESUMED_AT = 71


def resumed_run(run_dir: Path) -> FakeLink:
    """A run whose first process trained steps 1-71 (its journals hold them, an amp change at 40 among them)
    and whose second process resumed from the checkpoint of step 71: it reports only 72 on."""
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(strict_json.dumps(record(step).json_object()) + "\n" for step in range(1, RESUMED_AT + 1)))
    (run_dir / "events.jsonl").write_text(json.dumps(
        {"event": "option_applied", "step": 40, "time": 0.0, "option": "amp", "value": "bf16", "previous": "off", "source": "app"}) + "\n")
    hello = welcome(RESUMED_AT)
    hello = replace(hello, run=replace(hello.run, run_dir=str(run_dir)))
    return FakeLink([
        hello, protocol.State("starting", 0),
        protocol.Log(level="info", text=f"resumed from the checkpoint of step {RESUMED_AT}", step=RESUMED_AT),
        protocol.State("running", RESUMED_AT), protocol.Replayed(events=3),
        protocol.Metrics.from_rows([record(step) for step in range(RESUMED_AT + 1, 81)]),
    ])


async def test_a_resumed_run_draws_its_steps_from_before_the_resume_and_says_it_resumed(tmp_path: Path) -> None:
    """After --resume the loss chart started at step 72 although metrics.jsonl held 1-71, and the log said
    "0 · starting at step 0" before "71 · resumed"."""
    app = quiet_app(resumed_run(tmp_path / "run"))
    async with app.run_test(size=(200, 50)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        state = app.run_state
        assert list(state.loss.xs) == list(range(1, 81))
        assert list(state.loss.ys)[:RESUMED_AT] == [record(step).loss for step in range(1, RESUMED_AT + 1)]
        assert 50.0 in state.val_loss.xs  # the journal's eval step
        log = "\n".join(app.query_one(EventLog).lines_written)
        assert "starting at step 0" not in log
        assert f"resuming at step {RESUMED_AT}" in log
        assert "steps 1–71 of this run read from its metrics.jsonl; option changes then: step 40: amp = bf16" in log


async def test_a_run_directory_without_journals_adds_nothing(tmp_path: Path) -> None:
    """A viewer of a run whose journals are gone (or not there yet) shows what the trainer sends, no warning."""
    link = resumed_run(tmp_path / "run")
    (tmp_path / "run" / "metrics.jsonl").unlink()
    app = quiet_app(link)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert list(app.run_state.loss.xs) == list(range(RESUMED_AT + 1, 81))
        assert not any("earlier steps" in line for line in app.query_one(EventLog).lines_written)


async def test_a_journal_that_is_a_link_is_not_read_and_the_log_says_why(tmp_path: Path) -> None:
    link = resumed_run(tmp_path / "run")
    metrics = tmp_path / "run" / "metrics.jsonl"
    metrics.rename(tmp_path / "elsewhere.jsonl")
    metrics.symlink_to(tmp_path / "elsewhere.jsonl")
    app = quiet_app(link)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert list(app.run_state.loss.xs) == list(range(RESUMED_AT + 1, 81))
        assert "the run's earlier steps are not shown" in "\n".join(app.query_one(EventLog).lines_written)


async def test_the_heatmap_holds_the_journals_measured_steps_from_before_the_resume(tmp_path: Path) -> None:
    """The heatmap of a run attached to, or resumed, began empty at the step the app joined: its journal's measured
    steps (grad norms, update ratios, weight norms by module) are its earlier columns."""
    from fake_link import grad_norms, module_names

    names = module_names()

    def measured(step: int):
        sent = grad_norms(step, updates=True)
        return record(step, grad_norms=dict(zip(names, sent.norms)), update_ratios=dict(zip(names, sent.ratios)),
                      weight_norms=dict(zip(names, sent.weights)))

    link = resumed_run(tmp_path / "run")
    rows = [measured(step) if step % 10 == 0 else record(step) for step in range(1, RESUMED_AT + 1)]
    (tmp_path / "run" / "metrics.jsonl").write_text("".join(strict_json.dumps(row.json_object()) + "\n" for row in rows))
    link.queue.append(grad_norms(75, updates=True))
    app = quiet_app(link)
    async with app.run_test(size=(200, 50)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        health = app.run_state.health
        assert list(health.steps) == [10, 20, 30, 40, 50, 60, 70, 75]
        frozen = names.index("blocks.3.ln_1")
        assert health.columns["update ratio"][0][frozen] == 1e-7 and health.columns["weight norm"][0][0] == 1.0
        assert health.columns["grad norm"][-1] == [pytest.approx(n) for n in grad_norms(75).norms]


async def test_after_attach_the_gradient_tables_trend_holds_the_journals_measured_steps(tmp_path: Path) -> None:
    """After ``attach`` every module's trend was one bar: the trainer sends only its newest gradient norms (latest wins)
    to an app that connects; the run's earlier measured steps are in its metrics.jsonl, and now fill the trend."""
    from fake_link import grad_norms, module_names

    from torchlab.tui.formatting import sparkline
    from torchlab.tui.state_metrics import TREND_LENGTH
    from torchlab.tui.widgets.grad_table import GradTable

    names = module_names()
    attached_at = 120
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rows = [record(step, grad_norms=dict(zip(names, grad_norms(step).norms))) if step % 2 == 0 else record(step)
            for step in range(1, attached_at + 1)]
    (run_dir / "metrics.jsonl").write_text("".join(strict_json.dumps(row.json_object()) + "\n" for row in rows))
    hello = welcome(attached_at)
    hello = replace(hello, run=replace(hello.run, run_dir=str(run_dir)))
    # What a running trainer's outbox replays to an app that attaches: its recent rows, the newest norms, the marker.
    link = FakeLink([hello, protocol.Metrics.from_rows([record(step) for step in range(101, attached_at + 1)]),
                     grad_norms(attached_at), protocol.Replayed(events=0)])
    app = quiet_app(link)
    async with app.run_test(size=(200, 50)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        app.poll_now()
        await pilot.pause()
        head = app.run_state.modules[names.index("head")]
        expected = [grad_norms(step).norms[names.index("head")] for step in range(attached_at - 2 * (TREND_LENGTH - 1), attached_at + 1, 2)]
        assert list(head.trend) == pytest.approx(expected)
        table = app.query_one(GradTable)
        drawn = sparkline(head.trend, table.layout_columns.trend)
        assert len(set(drawn)) > 1
        assert any("│head " in line and drawn in line for line in screen_lines(app))


def screen_lines(app) -> list[str]:
    return [strip.text for strip in app.screen._compositor.render_strips()]
