"""RunState: how protocol events become what the app shows, without a terminal."""

from __future__ import annotations

import math

from fake_link import grad_norms, module_names, record, training_events, welcome

from torchlab.core import protocol
from torchlab.tui.state import (
    RunState,
    combine_norms,
    flag_for,
    format_duration,
    format_ratio,
    group_name,
    sparkline,
)


def fed(events) -> RunState:
    state = RunState()
    for event in events:
        state.apply(event)
    return state


def test_welcome_fills_the_run_and_the_module_list() -> None:
    state = fed([welcome(0)])
    assert (state.workload, state.device, state.total_steps, state.state) == ("tiny_gpt", "cpu", 200, "running")
    assert [m.name for m in state.modules] == module_names()
    assert state.options["amp"] == "off"
    assert "connected to the trainer of tiny_gpt on cpu: 28 modules, at step 0" in [e.text for e in state.take_log()]


def test_metrics_fill_the_curves_and_the_header_figures() -> None:
    state = fed(training_events(120))
    assert len(state.loss) == 120 and state.step == 120
    assert state.loss.ys[76] == 5.0  # the spike at step 77
    assert len(state.val_loss) == 2  # eval steps 50 and 100
    assert state.elapsed_s == record(120)["elapsed_s"]
    eta = state.eta_s()
    assert eta is not None and math.isclose(eta, 80 * sum(state.recent_step_times) / len(state.recent_step_times))


def test_non_finite_and_missing_metric_values_are_left_out_of_the_curves() -> None:
    state = fed([welcome(0), protocol.Metrics.from_records([record(1, loss=None), record(2, loss=float("nan")), record(3)])])
    assert list(state.loss.xs) == [3.0]
    assert state.step == 3


def test_option_changes_in_records_update_the_options() -> None:
    state = fed([welcome(0), protocol.Metrics.from_records([record(1, accum=4)])])
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
    assert state.options["amp"] == "bf16" and not state.pending


def test_amp_cycle_skips_modes_refused_on_this_run() -> None:
    state = fed([welcome(0)])
    assert state.next_amp_mode() == "bf16"
    state.options["amp"] = "bf16"
    assert state.next_amp_mode() == "fp16"
    state.apply(protocol.OptionRefused("amp", "fp16", "fp16 needs CUDA", 3, "app"))
    assert state.next_amp_mode() == "off"


def test_error_and_nonfinite_become_a_failure() -> None:
    state = fed([welcome(0), protocol.Error("boom", "Traceback ...", 5, "ckpt/last.pt")])
    assert state.state == "failed" and state.failure is not None
    assert (state.failure.kind, state.failure.message, state.failure.checkpoint) == ("error", "boom", "ckpt/last.pt")
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
        protocol.Metrics(columns=["loss"], rows=[[1.0]]),
        protocol.Metrics(columns=["step"], rows=[["x"], [1, 2]]),
        protocol.State("levitating", 1),
        protocol.Welcome(run={}, modules=[42], options="?", state="running", step=1),
        protocol.Log("info", "hello", None),
        protocol.Telemetry({"host": {"cpu_percent": 12.0}}),
    ):
        state.apply(event)
    levels = [e.level for e in state.take_log()]
    assert levels.count("warning") >= 6
    assert state.telemetry["host"]["cpu_percent"] == 12.0


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
    state.apply(protocol.Metrics.from_records([record(9), record(10)]))  # amp "off" in force back then
    assert state.options["amp"] == "bf16"
    state.apply(protocol.Metrics.from_records([record(11, amp="bf16"), record(12, amp="off")]))  # later --at change
    assert state.options["amp"] == "off"
