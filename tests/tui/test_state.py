"""RunState: how protocol events become what the app shows, without a terminal."""

from __future__ import annotations

import math
import statistics

from fake_link import grad_norms, module_names, past_ended, ranks, record, training_events, welcome

from torchlab.core.wire import protocol
from torchlab.core.options import AMP
from torchlab.core.wire.payloads import RankFigures
from torchlab.tui.formatting import format_duration, format_ratio, sparkline
from torchlab.tui.gradient_flags import combine_norms, flag_for, group_name
from torchlab.tui.state import RunState
from torchlab.tui.state_figures import ETA_MIN_STEPS
from torchlab.core.analysis.stragglers import ComparedRank, flag_stragglers


def fed(events) -> RunState:
    state = RunState()
    for event in past_ended(list(events)):
        state.apply(event)
    return state


def test_welcome_fills_the_run_and_the_module_list() -> None:
    state = fed([welcome(0)])
    assert (state.workload, state.device, state.total_steps, state.state) == ("tiny_gpt", "cpu", 200, "running")
    assert [m.name for m in state.modules] == module_names()
    assert state.options["amp"] == "off"
    assert ("info", "connected to the trainer of tiny_gpt on cpu: 28 modules", 0) in [(e.level, e.text, e.step) for e in state.take_log()]


def test_metrics_fill_the_curves_and_the_header_figures() -> None:
    state = fed(training_events(120))
    assert len(state.loss) == 120 and state.step == 120
    assert state.loss.ys[76] == 5.0  # the spike at step 77
    assert len(state.val_loss) == 2  # eval steps 50 and 100
    assert state.elapsed_s == record(120).elapsed_s
    eta = state.eta_s()
    assert eta is not None and math.isclose(eta, 80 * statistics.median(state.recent_step_times))


def test_the_eta_waits_for_enough_steps_and_passes_over_the_slow_first_ones() -> None:
    """At step 1 of a ~20 s run the header said ETA 7:34: the first step (start-up, a compile) took seconds, and the
    ETA was its time for every step left. Until enough steps were measured it is pending ("ETA …" in the header);
    then the recent steps' median leaves the slow first ones out."""
    first_steps = [2.4, 0.9, 0.3]  # start-up, a compile's second graph, cold caches
    state = fed([welcome(0), protocol.Metrics.from_rows([record(step, step_time_s=first_steps[step - 1]) for step in (1, 2, 3)])])
    assert state.eta_s() is None and state.eta_pending
    state.apply(protocol.Metrics.from_rows([record(step, step_time_s=0.1) for step in range(4, ETA_MIN_STEPS + 1)]))
    assert not state.eta_pending
    assert math.isclose(state.eta_s(), (200 - ETA_MIN_STEPS) * 0.1)
    state.apply(protocol.State("paused", ETA_MIN_STEPS))
    assert state.eta_s() is None and not state.eta_pending  # a paused run has no ETA, and none is coming


def test_non_finite_and_missing_metric_values_are_left_out_of_the_curves() -> None:
    state = fed([welcome(0), protocol.Metrics.from_rows([record(1, loss=None), record(2, loss=float("nan")), record(3)])])
    assert list(state.loss.xs) == [3.0]
    assert state.step == 3


def test_option_changes_in_records_update_the_options() -> None:
    state = fed([welcome(0), protocol.Metrics.from_rows([record(1, accum=4)])])
    assert state.options["accum"] == 4


def test_applied_and_refused_answers_are_logged_with_their_step() -> None:
    state = fed([welcome(10)])
    state.take_log()
    state.note_request("amp", "bf16")
    assert state.option("amp") == "bf16"  # pending counts for the next key press
    state.apply(protocol.OptionApplied("amp", "bf16", "off", 11, "app"))
    state.apply(protocol.OptionRefused("amp", "fp16", "fp16 needs CUDA", 12, "app"))
    state.apply(protocol.OptionApplied("clip", None, 1.0, 13, "app"))
    entries = state.take_log()
    assert [(e.level, e.step) for e in entries] == [("info", None), ("applied", 11), ("refused", 12), ("applied", 13)]
    assert entries[1].text == "amp = bf16 applied at step 11 (was off)"
    assert entries[2].text == "amp = fp16 refused: fp16 needs CUDA"
    assert entries[3].text == "clip = off applied at step 13 (was 1.0)"
    assert all(e.notify for e in entries[1:])
    state.apply(protocol.OptionApplied("amp", "bf16", "bf16", 14, "--at"))  # a scripted change to what is in force
    assert state.take_log()[0].text == "amp = bf16 at step 14: in force already, nothing changed"
    assert state.options["amp"] == "bf16" and not state.pending


def test_amp_cycle_skips_modes_refused_on_this_run() -> None:
    state = fed([welcome(0)])

    def next_amp_mode() -> str:
        return AMP.next_value(state.option("amp"), lambda mode: state.was_refused("amp", mode))

    assert next_amp_mode() == "bf16"
    state.options["amp"] = "bf16"
    assert next_amp_mode() == "fp16"
    state.apply(protocol.OptionRefused("amp", "fp16", "fp16 needs CUDA", 3, "app"))
    assert next_amp_mode() == "off"


def test_error_and_nonfinite_become_a_failure() -> None:
    state = fed([welcome(0), protocol.Error("boom", "Traceback ...", 5, "ckpt/last.pt")])
    assert state.state == "failed" and state.failure is not None
    assert (state.failure.kind, state.failure.message, state.failure.checkpoint) == ("failed", "boom", "ckpt/last.pt")
    state.apply(protocol.NonFinite(6, "forward", "blocks.1.attn", "output max |x| = inf", ""))
    assert state.failure.kind == "nonfinite"
    assert "blocks.1.attn" in state.failure.detail and "step 6" in state.failure.message
    state.mark_restarting()
    assert state.failure is None and state.state == "starting"


def test_a_resumed_welcome_drops_steps_after_the_checkpoint() -> None:
    state = fed(training_events(120))
    state.apply(welcome(100))
    assert state.loss.xs[-1] == 100 and state.step == 100


def test_grad_norms_set_ratio_trend_and_flags() -> None:
    state = fed([welcome(0)] + [grad_norms(step) for step in range(100, 121, 2)])
    by_name = {m.name: m for m in state.modules}
    assert by_name["blocks.3.ln_1"].flag == "vanishing"
    assert by_name["head"].flag == "exploding"
    assert by_name["tok_emb"].flag == ""
    assert len(by_name["tok_emb"].trend) == 11
    assert by_name["tok_emb"].ratio is not None


def test_surprising_payloads_become_warnings() -> None:
    state = fed([welcome(0)])
    state.take_log()
    for event in (
        protocol.GradNorms(1, [1.0]),
        protocol.Metrics(columns={"loss": [1.0]}),
        protocol.Metrics(columns={"step": ["x", "y"], "loss": [1.0, 2.0]}),
        protocol.Metrics(columns={"step": [1], "loss": 1.0}),
        protocol.State("levitating", 1),
        protocol.Welcome(run=welcome(0).run, modules=welcome(0).modules, options="?", state="running", step=1),
        protocol.Log("info", "hello", None),
    ):
        state.apply(event)
    levels = [e.level for e in state.take_log()]
    assert levels.count("warning") >= 6


def test_flag_rules() -> None:
    assert flag_for(None, None, []) == ""
    assert flag_for(float("inf"), None, []) == "non-finite"
    assert flag_for(1e-9, 1.0, []) == "vanishing"
    assert flag_for(0.1, 1e-4, []) == "vanishing"
    assert flag_for(500.0, 200.0, []) == "exploding"
    assert flag_for(5.0, 2.0, [0.3, 0.3, 0.3, 0.3, 5.0]) == "exploding"  # rising fast against its own past
    assert flag_for(0.35, 1.0, [0.3, 0.3, 0.3, 0.35]) == ""


def test_small_helpers() -> None:
    assert group_name("blocks.0.attn.qkv") == "blocks.0" and group_name("head") == "head" and group_name("tok_emb.weight") == "tok_emb"
    assert math.isclose(combine_norms([3.0, 4.0, None]) or 0, 5.0) and combine_norms([None]) is None
    assert sparkline([1, 2, 3, 4, 5, 6, 7, 8]) == "▁▂▃▄▅▆▇█" and sparkline([2, 2]) == "▄▄" and sparkline([]) == ""
    assert format_duration(3725) == "1:02:05" and format_duration(65) == "1:05" and format_duration(None) == "–"
    assert format_ratio(0.001) == "<.01" and format_ratio(5000) == ">999" and format_ratio(0.42) == "0.42" and format_ratio(None) == "–"


def test_a_late_batch_of_earlier_steps_does_not_undo_an_acknowledged_change() -> None:
    state = fed([welcome(0)])
    state.apply(protocol.OptionApplied("amp", "bf16", "off", 11, "app"))
    state.apply(protocol.Metrics.from_rows([record(9), record(10)]))  # amp "off" in force back then
    assert state.options["amp"] == "bf16"
    state.apply(protocol.Metrics.from_rows([record(11, amp="bf16"), record(12, amp="off")]))  # later --at change
    assert state.options["amp"] == "off"


def test_a_change_is_pending_until_its_own_answer_and_never_after_a_refusal_or_the_end_of_the_run() -> None:
    state = fed([welcome(10)])
    state.note_request("checkpointing", True)
    state.note_request("checkpointing", False)  # the second press supersedes the first
    assert state.pending == {"checkpointing": False}
    state.apply(protocol.OptionApplied("checkpointing", True, False, 11, "app"))
    assert state.pending == {"checkpointing": False}  # the first answer is not the one still on its way
    state.apply(protocol.OptionApplied("checkpointing", False, True, 11, "app"))
    assert state.pending == {}

    state.note_request("amp", "fp16")
    version = state.options_version
    state.apply(protocol.OptionApplied("amp", "bf16", "off", 12, "--at"))  # a scripted change: not our answer
    assert state.pending == {"amp": "fp16"}
    state.apply(protocol.OptionRefused("amp", "fp16", "fp16 needs CUDA", 12, "app"))
    assert state.pending == {} and state.options_version > version  # the options panel redraws without it

    state.note_request("clip", 1.0)
    version = state.options_version
    state.apply(protocol.State("finished", 13))  # the trainer will never answer it
    assert state.pending == {} and state.options_version > version
    assert state.option("clip") is None


# ---------------------------------------------------------------------- ranks


def figures(rank: int, step_time_s: float, data_wait_s: float = 0.0004) -> ComparedRank:
    return ComparedRank(RankFigures(rank, step_time_s, data_wait_s, None, None, None, 400 * 2**20))


def test_a_rank_is_a_straggler_above_1_3x_the_other_ranks_median() -> None:
    flagged = flag_stragglers([figures(0, 0.20), figures(1, 0.21), figures(2, 0.28), figures(3, 0.19)])
    assert [f.flag for f in flagged] == ["", "", "step time", ""]
    assert math.isclose(flagged[2].step_vs_others, 0.28 / 0.20)  # the others' median, not one that includes it
    # 1.25x is within the spread of ranks of one run: not flagged.
    assert [f.flag for f in flag_stragglers([figures(0, 0.20), figures(1, 0.25)])] == ["", ""]
    # Two ranks: the one 1.35x the other is flagged, never both.
    assert [f.flag for f in flag_stragglers([figures(0, 0.20), figures(1, 0.27)])] == ["", "step time"]


def test_a_slow_loader_is_flagged_by_its_data_wait_but_not_a_negligible_one() -> None:
    slow_loader = flag_stragglers([figures(0, 0.25, 0.0004), figures(1, 0.25, 0.05)])
    assert [f.flag for f in slow_loader] == ["", "data wait"]
    assert math.isclose(slow_loader[1].wait_vs_others, 125.0)
    # 0.9 ms against 0.4 ms is 2x, but well under 5 % of a 250 ms step: noise, not a straggler.
    assert [f.flag for f in flag_stragglers([figures(0, 0.25, 0.0004), figures(1, 0.25, 0.0009)])] == ["", ""]


def test_rank_figures_are_read_above_world_size_1_only() -> None:
    state = fed(training_events(20, world_size=2) + [ranks(20, slow={1: {"data_wait_s": 0.05, "rss_bytes": None}})])
    assert state.world_size == 2 and state.has_ranks and state.ranks_step == 20
    assert [(f.figures.rank, f.flag, f.figures.allocated_bytes, f.figures.rss_bytes) for f in state.ranks] == [
        (0, "", None, 380 * 2**20), (1, "data wait", None, None)]
    single = fed(training_events(20) + [ranks(20)])  # e.g. torchrun with one process: nothing to compare
    assert single.ranks == [] and not single.has_ranks


def test_a_world_size_change_is_a_relaunch_until_it_is_acknowledged() -> None:
    state = fed(training_events(20))
    state.note_request("world_size", 2)
    state.apply(protocol.CheckpointSaved(20, "runs/x/checkpoints/step-0000020.pt", "world_size"))
    assert (state.state, state.state_detail, state.relaunch_to, state.has_ranks) == ("relaunching", "1 → 2", 2, True)
    assert state.eta_s() is None  # nothing trains meanwhile
    state.apply(protocol.State("running", 20))
    state.apply(protocol.OptionApplied("world_size", 2, 1, 21, "app"))
    assert (state.state, state.world_size, state.relaunch_to) == ("running", 2, None)
    texts = [entry.text for entry in state.take_log()]
    assert "relaunching as 2 processes from the checkpoint of step 20…" in texts
    assert "training at step 20" not in texts  # the acknowledgement says it, with its step
    assert "world_size = 2 applied at step 21 (was 1)" in texts
    state.apply(ranks(19))  # gathered before the change, by ranks that are gone
    assert state.ranks == []
    state.apply(ranks(22))
    assert [f.figures.rank for f in state.ranks] == [0, 1]


def test_back_to_world_size_1_forgets_the_ranks() -> None:
    state = fed(training_events(20, world_size=2) + [ranks(20)])
    state.apply(protocol.CheckpointSaved(20, "runs/x/checkpoints/step-0000020.pt", "world_size"))  # --at: no request
    assert state.state == "relaunching" and state.state_detail == "" and state.ranks == []
    state.apply(protocol.OptionApplied("world_size", 1, 2, 21, "script"))
    assert (state.state, state.world_size, state.has_ranks, state.ranks) == ("running", 1, False, [])


def test_the_runs_past_is_logged_above_connected_with_one_toast_for_all_of_it() -> None:
    """Attaching to a run that took changes: a toast per old acknowledgement covered an 80x24 screen, and the
    replayed past came after the "connected" line, so the log ended with old news."""
    state = RunState()
    past = [protocol.State("starting", 0), protocol.State("running", 0), protocol.OptionApplied("amp", "bf16", "off", 40, "app"),
            protocol.OptionApplied("clip", 1.0, None, 80, "app"), protocol.State("paused", 90),
            protocol.State("running", 90)]
    for event in [welcome(120), *past, protocol.Replayed(events=len(past))]:
        state.apply(event)
    entries = state.take_log()
    assert entries[-2].text.startswith("connected to the trainer of tiny_gpt") and entries[-2].step == 120
    assert entries[-1].text == "attached at step 120: the run's 6 earlier events are above" and entries[-1].notify
    assert not any(entry.notify for entry in entries[:-1])
    assert [entry.step for entry in entries[:-2]] == [None, 0, 40, 80, 90, 90]  # oldest first; "starting the trainer" knows no step
    state.apply(protocol.OptionApplied("clip", None, 1.0, 121, "app"))
    assert [entry.notify for entry in state.take_log()] == [True]  # news is told as before


def test_a_past_with_nothing_to_tell_adds_no_line() -> None:
    state = RunState()
    for event in [welcome(0, state="starting"), protocol.State("running", 0), protocol.Replayed(events=1)]:
        state.apply(event)
    assert [entry.text for entry in state.take_log()] == ["training at step 0",
                                                          "connected to the trainer of tiny_gpt on cpu: 28 modules"]


def test_a_spike_the_guard_let_through_is_marked_and_offers_its_key_in_a_toast_one_held_back_only_in_the_log() -> None:
    from torchlab.core.wire.events import SpikeGuarded

    spike = dict(measure="loss", value=1370.0, median=0.04, z=28.1, threshold=6.0, window=50)
    state = fed([welcome(0), SpikeGuarded(step=126, action="let_through", **spike),
                 SpikeGuarded(step=254, action="skipped", **spike)])
    assert state.spikes == [126, 254]
    offered, held = [entry for entry in state.take_log() if "spike at step" in entry.text]
    assert offered.notify and offered.toast == "spike at step 126: G turns on the spike guard"
    assert not held.notify and held.level == "warning"
