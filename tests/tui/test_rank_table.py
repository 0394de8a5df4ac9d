"""The app above world size 1 (issue 5, app side): the rank table, its summary line, the world-size prompt,
and what the app shows while the trainer relaunches its ranks. Driven by a FakeLink."""

from __future__ import annotations

from dataclasses import replace

from fake_link import FakeLink, quiet_app, ranks, telemetry, training_events

from torchlab.core.wire import protocol
from torchlab.core.wire.payloads import RankProcess
from torchlab.core.wire.straggler import Straggler
from torchlab.tui.app import TorchlabApp
from torchlab.tui.screens.prompt import OptionPrompt
from torchlab.tui.widgets.event_log import EventLog
from torchlab.tui.widgets.grad_table import GradTable
from torchlab.tui.widgets.options_panel import OptionsPanel
from torchlab.tui.widgets.rank_table import RankTable
from torchlab.tui.widgets.run_header import RunHeader

WIDE = (160, 48)
SMALL = (80, 24)
STRAGGLER = {1: {"data_wait_s": 0.05}}  # rank 1 waits 50 ms for its batches, rank 0 0.4 ms


def app_at(world_size: int, *events: protocol.Message) -> tuple[TorchlabApp, FakeLink]:
    link = FakeLink(training_events(world_size=world_size) + [telemetry()] + list(events))
    link.options["world_size"] = world_size
    return quiet_app(link), link


def table(app: TorchlabApp) -> RankTable:
    return app.query_one("#ranks", RankTable)


def line(app: TorchlabApp) -> RankTable:
    return app.query_one("#ranks-line", RankTable)


def shown(widget: RankTable) -> list[str]:
    return widget.render().plain.splitlines()


def log_text(app: TorchlabApp) -> str:
    return "\n".join(app.query_one(EventLog).lines_written)


def header_text(app: TorchlabApp) -> str:
    return str(app.query_one(RunHeader).content)


async def answer(app: TorchlabApp, pilot) -> None:
    app.poll_now()
    await pilot.pause()


async def test_rank_figures_become_rows_and_the_straggler_is_flagged() -> None:
    app, _ = app_at(2, ranks(120, slow=STRAGGLER))
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        assert table(app).display and not line(app).display
        header, rank0, rank1 = shown(table(app))
        assert header.split() == ["rank", "step", "vs", "others", "data", "wait", "alloc", "rss"]
        assert rank0.split() == ["0", "250", "ms", "-2", "%", "0.40", "ms", "n/a", "380", "MiB"]  # no allocator on CPU
        assert rank1.split()[:2] == ["⚑", "1"] and "50.0 ms" in rank1 and rank1.rstrip().endswith("data wait 125× others")
        assert table(app).border_title == "2 ranks · step 120"
        assert table(app).region.height == 2 + 3  # a border, a header and two rows, under the gradient table
        assert app.query_one(GradTable).region.bottom == table(app).region.y


async def test_the_trainers_straggler_verdict_is_under_the_table_and_in_the_log_until_cleared() -> None:
    """The verdict over the window (core/analysis/stragglers.py), not one report's flag; each rank's phases where the
    width allows."""
    phases = {"copy_s": 0.0001, "forward_s": 0.012, "backward_s": 0.21, "optimizer_s": 0.004, "communication_s": 0.001}
    figures = ranks(120, slow=STRAGGLER)
    figures = replace(figures, ranks=[replace(rank, **phases) for rank in figures.ranks])
    verdict = Straggler(step=120, rank=1, host="node-b", excess_s=0.0496, step_share=0.2, since_step=88, part="data wait")
    app, link = app_at(2, figures, verdict)
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        _, _, _, said = shown(table(app))
        assert said == "⚑ rank 1 +49.6 ms a step (20 %) for 32 steps: data wait"
        await pilot.press("t")  # the full-size table: room for each rank's phases
        header = shown(app.screen.query_one(RankTable))[0]
        assert header.split()[:9] == ["rank", "step", "vs", "others", "data", "wait", "forward", "backward", "optim"]
        await pilot.press("escape")
        assert "straggler: rank 1 (node-b) 49.6 ms a step behind" in log_text(app)
        link.push(replace(verdict, step=200, cleared=True))
        await answer(app, pilot)
        assert len(shown(table(app))) == 3 and "rank 1 (node-b) no longer holds the others back" in log_text(app)


async def test_a_hang_is_in_the_header_with_its_step_until_a_report_of_that_step() -> None:
    """The hang watch's sentence (core/engine/parallel/hang_watch.py) is said and toasted; the header says the run is
    hung, not running, for as long as no step after it is reported: a slow node that caught up clears it."""
    from fake_link import record
    from torchlab.core.wire.hang import Hang

    hang = Hang(step=121, waited_s=41.0, explanation="step 121 has run 41 s, its steps 210 ms: rank 1 at model.py:88",
                folder="runs/x/hangs/step-0000121", checkpoint="runs/x/checkpoints/step-0000120.pt", checkpoint_step=120)
    app, link = app_at(2, ranks(120), hang)
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        assert "⚠ hung at step 121" in header_text(app)
        assert "a stop (q in the app, `torchlab-tui stop`, Ctrl-C headless) ends it now" in " ".join(log_text(app).split())
        assert "its last checkpoint is step 120's, runs/x/checkpoints/step-0000120.pt" in " ".join(log_text(app).split())
        link.push(protocol.Metrics.from_rows([record(121, world_size=2)]))
        await answer(app, pilot)
        assert "hung" not in header_text(app) and "running" in header_text(app)


async def test_allocator_memory_shows_on_gpu_ranks() -> None:
    app, _ = app_at(2, ranks(120, on_gpu=True))
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.pause()
        header, rank0, _ = shown(table(app))
        assert header.split()[6:10] == ["alloc", "reserved", "peak", "rss"]
        assert "11 GiB    13 GiB    12 GiB   380 MiB" in rank0


async def test_a_small_terminal_gets_one_summary_line_and_t_shows_the_table() -> None:
    app, _ = app_at(2, ranks(120, slow=STRAGGLER))
    async with app.run_test(size=SMALL) as pilot:
        await pilot.pause()
        assert line(app).display and not table(app).display and line(app).region.height == 1
        [summary] = shown(line(app))
        assert summary.startswith("2 ranks · ⚑ rank 1 straggles: data wait 125× others · slowest rank 1 +2 %")
        assert "…" not in summary  # whole figures: one that does not fit is left out
        await pilot.press("t")
        detail = app.screen.query_one(RankTable)
        assert detail.display and len(shown(detail)) == 3 and shown(detail)[2].split()[:2] == ["⚑", "1"]
        await pilot.press("escape")
        await pilot.resize_terminal(*WIDE)  # larger: the table takes the line's place
        await pilot.pause()
        assert table(app).display and not line(app).display


async def test_many_ranks_show_the_flagged_and_the_slowest_and_count_the_rest() -> None:
    app, _ = app_at(16, ranks(120, count=16, slow={3: {"step_time_s": 0.5}}))
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        rows = shown(table(app))
        assert len(rows) == 1 + 8  # the header, 7 ranks, and a line for the rest
        assert rows[1].split()[:2] == ["⚑", "3"] and rows[1].split()[2:5] == ["500", "ms", "+72"] and "step time 1.7× others" in rows[1]
        assert [row.split()[0] for row in rows[2:8]] == ["10", "11", "12", "13", "14", "15"]  # the slowest
        assert rows[-1] == "… and 9 more ranks, none flagged"


async def test_ranks_on_several_hosts_get_a_host_column() -> None:
    first = training_events(world_size=2)
    run = replace(first[0].run, ranks=[RankProcess(rank=0, host="node-a", pid=11, device="cuda:0"),
                                       RankProcess(rank=1, host="node-b", pid=12, device="cuda:0")])
    first[0] = protocol.Welcome(run=run, modules=first[0].modules, options=first[0].options, state="running", step=0)
    link = FakeLink(first + [ranks(120, on_gpu=True)])
    app = quiet_app(link)
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        header, rank0, rank1 = shown(table(app))
        assert header.split()[:3] == ["rank", "host", "step"]
        assert rank0.split()[:2] == ["0", "node-a"] and rank1.split()[:2] == ["1", "node-b"]


async def test_ranks_on_two_nodes_of_one_host_are_told_apart_by_their_node() -> None:
    """Two torchrun agents on one machine (tests/process/test_two_nodes.py): one host name, two nodes."""
    first = training_events(world_size=2)
    run = replace(first[0].run, ranks=[RankProcess(rank=0, host="vm", pid=11, device="cpu", node=0),
                                       RankProcess(rank=1, host="vm", pid=12, device="cpu", node=1)])
    first[0] = protocol.Welcome(run=run, modules=first[0].modules, options=first[0].options, state="running", step=0)
    figures = ranks(120)
    figures = replace(figures, ranks=[replace(rank, host_cpu_percent=40.0 + 50 * rank.rank, host_available_bytes=8 * 2**30)
                                      for rank in figures.ranks])
    app = quiet_app(FakeLink(first + [figures]))
    async with app.run_test(size=WIDE) as pilot:
        await pilot.press("t")  # the full-size table: each node's machine beside its rank
        header, rank0, rank1 = shown(app.screen.query_one(RankTable))[:3]
        assert header.split()[:3] == ["rank", "host", "step"] and "host cpu  host free" in header
        assert rank0.split()[:4] == ["0", "node", "0", "(vm)"] and rank1.split()[:4] == ["1", "node", "1", "(vm)"]
        assert rank0.split()[-4:] == ["40", "%", "8", "GiB"] and rank1.split()[-4:] == ["90", "%", "8", "GiB"]


async def test_at_world_size_1_nothing_rank_related_takes_space() -> None:
    app, _ = app_at(1, ranks(120))  # figures from a single process (torchrun with one): nothing to compare
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        assert not table(app).display and not line(app).display and app.run_state.ranks == []
        grads, charts = app.query_one(GradTable).region, app.query_one("#charts").region
        assert grads.bottom == charts.bottom  # the gradient table keeps its full height
        await pilot.resize_terminal(*SMALL)
        await pilot.pause()
        assert not line(app).display


async def test_the_world_size_prompt_refuses_a_bad_value_with_a_reason_and_sends_a_good_one() -> None:
    app, link = app_at(1)
    async with app.run_test(size=WIDE) as pilot:
        await pilot.press("w")
        prompt = app.screen
        assert isinstance(prompt, OptionPrompt) and "relaunches" in str(prompt.query_one("#prompt-hint").content)
        await pilot.press("backspace", "0", "enter")
        assert app.screen is prompt and prompt.error_text == "world_size must be a whole number from 1 to 1024, got '0'"
        await pilot.press("backspace", "t", "w", "o", "enter")
        assert app.screen is prompt and "got 'two'" in prompt.error_text
        assert link.sent == []
        await pilot.press("backspace", "backspace", "backspace", "3", "enter")  # one the trainer would refuse
        assert app.screen is prompt and prompt.error_text.startswith("world size 3 does not divide the batch of 32")
        assert link.sent == []  # the prompt knows the batch: refused before it is sent
        await pilot.press("backspace", "2", "enter")
        assert link.sent == [protocol.SetCommand("world_size", 2)]


async def test_from_1_to_2_the_app_says_relaunching_then_shows_the_new_ranks() -> None:
    app, link = app_at(1)
    async with app.run_test(size=WIDE) as pilot:
        await pilot.press("w", "2", "enter")
        assert link.sent == [protocol.SetCommand("world_size", 2)]
        assert "world size    1 → 2…" in str(app.query_one(OptionsPanel).content)
        assert "requested world_size = 2 (checkpoint and relaunch at the next step)" in log_text(app)
        await answer(app, pilot)  # the checkpoint for the relaunch; then the trainer is silent for seconds
        assert "↻ relaunching 1 → 2" in header_text(app) and "ETA" not in header_text(app)
        assert "120 ◆ checkpoint saved (world-size change): checkpoints/step-0000120.pt" in log_text(app)
        assert "relaunching as 2 processes from the checkpoint of step 120" in log_text(app)
        assert table(app).display and shown(table(app)) == ["relaunching as 2 processes… figures once the new ranks train"]
        await answer(app, pilot)  # the new ranks train
        assert "● running" in header_text(app) and app.run_state.world_size == 2
        assert "world_size = 2 applied at step 121 (was 1)" in log_text(app)
        assert "world size    2" in str(app.query_one(OptionsPanel).content)
        assert shown(table(app)) == ["2 ranks: waiting for their first figures (gathered at each probe, about once a second)"]
        link.push(ranks(121))
        await answer(app, pilot)
        assert [row.split()[0] for row in shown(table(app))[1:]] == ["0", "1"]


async def test_a_relaunch_for_parallel_says_what_the_same_ranks_relaunch_with() -> None:
    app, link = app_at(2, ranks(120))
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        await pilot.press("D")  # ddp -> fsdp: the same two ranks, holding the model another way
        assert link.sent == [protocol.SetCommand("parallel", "fsdp")]
        await answer(app, pilot)
        assert shown(table(app)) == ["relaunching the 2 ranks with parallel=fsdp… figures once they train"]
        await answer(app, pilot)  # the new ranks train
        assert "parallel = fsdp applied at step 121 (was ddp)" in log_text(app)
        assert shown(table(app)) == ["2 ranks: waiting for their first figures (gathered at each probe, about once a second)"]


async def test_back_to_world_size_1_the_rank_table_goes() -> None:
    app, link = app_at(2, ranks(120, slow=STRAGGLER))
    async with app.run_test(size=SMALL) as pilot:
        await pilot.pause()
        assert line(app).display
        assert "ws 2" in str(app.query_one(OptionsPanel).content)
        await pilot.press("w", "1", "enter")
        await answer(app, pilot)
        assert "↻ relaunching 2 → 1" in header_text(app)
        assert shown(line(app)) == ["ranks: relaunching as a single process…"]
        await answer(app, pilot)
        assert "world_size = 1 applied at step 121 (was 2)" in log_text(app)
        assert not line(app).display and not table(app).display and app.run_state.ranks == []
        # At its default the world size leaves the one-line panel (eight options do not fit in 80 columns).
        assert "ws" not in str(app.query_one(OptionsPanel).content)


async def test_pause_is_passed_on_while_the_ranks_relaunch() -> None:
    app, link = app_at(2)
    async with app.run_test(size=SMALL) as pilot:
        await pilot.press("w", "1", "enter")
        await answer(app, pilot)
        assert app.run_state.state == "relaunching"
        await pilot.press("space")  # the supervisor hands it to the new ranks
        assert link.sent[-1] == protocol.PauseCommand()
