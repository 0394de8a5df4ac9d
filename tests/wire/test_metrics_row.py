"""The metrics row (core/wire/metrics_row.py): one typed record per report step, written to metrics.jsonl as the
lines have always been, and read back from old lines and from lines someone else wrote."""

from __future__ import annotations

import math
import time

import pytest

from metrics_rows import metrics_row
from torchlab.core.engine.measure.step_report import StepReport, metrics_row as row_of_report
from torchlab.core.records.rundir import SkippedLine, metrics_rows, to_json_line
from torchlab.core.wire import strict_json
from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.options import LiveOptions
from torchlab.core.wire.payloads import MemoryBreakdown, ModuleBytes, RankFigures
from torchlab.core.wire.typed_json import UnreadableValue

NOW = 1795729330.8084817

# Written by metrics_record() before the row was typed (commit 624f216), from the reports below; "split" and
# "oom_rescue", "spike_guard" and "parallel" (live options since) added where the options' order puts them, and memory's
# "gathered_bytes" (parallel=fsdp's gathered parameters) where its fields' order does.
FULL_LINE = (
    '{"step":7,"time":1795729330.8084817,"elapsed_s":12.346,"epoch":1,"loss":2.5,"lr":0.001,"samples_per_s":128.0,'
    '"step_time_s":0.125,"grad_norm_total":1.25,"clipped":true,"grad_norms":{"a":0.5,"b.c":null},"skipped":true,'
    '"data_wait_s":0.001,"amp":"bf16","checkpointing":false,"compile":false,"dynamic":"auto","clip":1.0,"accum":2,"split":1,"oom_rescue":true,"spike_guard":"off","lr_scale":1.0,'
    '"workers":0,"pin_memory":null,"world_size":2,"parallel":"ddp","steps":100,"lrs":{"body":0.001,"head":0.002},"metrics":{"acc":0.5},'
    '"compiling":true,"eager":true,"act_stats":{"a":[0.1,0.2,3.0]},"memory":{"step":7,"parameters_bytes":10,'
    '"gradients_bytes":10,"optimizer_bytes":20,"activations_bytes":30,"allocator_peak_bytes":null,"by_module":'
    '[{"module":"a","bytes":30}],"gathered_bytes":0,"longest_batch":true},"ranks":[{"rank":0,"step_time_s":0.1,"data_wait_s":0.0,"allocated_bytes":null,'
    '"reserved_bytes":null,"peak_allocated_bytes":null,"rss_bytes":1000000000.0,"copy_s":null,"forward_s":null,"backward_s":null,"optimizer_s":null,"communication_s":null,"host_cpu_percent":null,"host_available_bytes":null},{"rank":1,'
    '"step_time_s":0.12,"data_wait_s":null,"allocated_bytes":null,"reserved_bytes":null,"peak_allocated_bytes":null,'
    '"rss_bytes":1000000000.0,"copy_s":null,"forward_s":null,"backward_s":null,"optimizer_s":null,"communication_s":null,"host_cpu_percent":null,"host_available_bytes":null}],"val_loss":2.25,"val_metrics":{"acc":0.75}}\n'
)
MINIMAL_LINE = (
    '{"step":3,"time":1795729330.8084817,"elapsed_s":1.0,"epoch":0,"loss":4.0,"lr":0.01,"samples_per_s":8.0,'
    '"step_time_s":0.5,"grad_norm_total":null,"clipped":null,"grad_norms":null,"skipped":false,"data_wait_s":0.0,'
    '"amp":"off","checkpointing":false,"compile":false,"dynamic":"auto","clip":null,"accum":1,"split":1,"oom_rescue":true,"spike_guard":"off","lr_scale":1.0,"workers":0,'
    '"pin_memory":null,"world_size":1,"parallel":"ddp","steps":200}\n'
)
#: An evaluation whose loss was not finite: val_loss is there, as null.
NONFINITE_EVAL_LINE = MINIMAL_LINE[:-2] + ',"val_loss":null}\n'
#: As the first version wrote a row (commit 921966e): no data wait, and only the six options there were then.
OLD_LINE = (
    '{"step":5,"time":1763800000.5,"elapsed_s":2.5,"epoch":0,"loss":3.5,"lr":0.0005,"samples_per_s":640.0,'
    '"step_time_s":0.05,"grad_norm_total":0.9,"clipped":null,"grad_norms":null,"skipped":false,"amp":"off",'
    '"checkpointing":true,"clip":null,"accum":1,"lr_scale":1.0,"world_size":1,"act_stats":{"head":[0.0,1.0,2.5]},'
    '"val_loss":3.75}\n'
)


def full_report() -> StepReport:
    memory = MemoryBreakdown(step=7, parameters_bytes=10, gradients_bytes=10, optimizer_bytes=20, activations_bytes=30,
                             allocator_peak_bytes=None, by_module=[ModuleBytes(module="a", bytes=30)])
    return StepReport(step=7, options=LiveOptions(amp="bf16", clip=1.0, accum=2, steps=100, world_size=2), loss=2.5,
                      lr=0.001, stepped=False, grad_norm_total=1.25, clipped=True, grad_norms={"a": 0.5, "b.c": math.nan},
                      act_stats={"a": [0.1, 0.2, 3.0]}, step_time_s=0.125, data_wait_s=0.001, memory=memory,
                      metrics={"acc": 0.5}, lrs={"body": 0.001, "head": 0.002}, compiling=True, ran_eagerly=True)


def minimal_report() -> StepReport:
    return StepReport(step=3, options=LiveOptions(), loss=4.0, lr=0.01, stepped=True, grad_norm_total=None, clipped=None,
                      grad_norms=None, act_stats=None, step_time_s=0.5, data_wait_s=0.0)


RANKS = [RankFigures(rank=0, step_time_s=0.1, data_wait_s=0.0, allocated_bytes=None, reserved_bytes=None,
                     peak_allocated_bytes=None, rss_bytes=1e9),
         RankFigures(rank=1, step_time_s=0.12, data_wait_s=None, allocated_bytes=None, reserved_bytes=None,
                     peak_allocated_bytes=None, rss_bytes=1e9)]


@pytest.fixture
def frozen_clock(monkeypatch):
    monkeypatch.setattr(time, "time", lambda: NOW)


def test_a_full_row_is_written_as_the_line_the_untyped_row_was_byte_for_byte(frozen_clock):
    row = row_of_report(full_report(), elapsed_s=12.34567, epoch=1, batch_size=8, rank_figures=RANKS,
                        evaluate=lambda: (2.25, {"acc": 0.75}))
    assert to_json_line(row.json_object()) == FULL_LINE


def test_a_minimal_row_leaves_out_what_it_does_not_have_as_the_untyped_row_did(frozen_clock):
    row = row_of_report(minimal_report(), elapsed_s=1.0, epoch=0, batch_size=4, rank_figures=None, evaluate=None)
    assert to_json_line(row.json_object()) == MINIMAL_LINE
    evaluated = row_of_report(minimal_report(), elapsed_s=1.0, epoch=0, batch_size=4, rank_figures=None,
                              evaluate=lambda: (math.inf, None))
    assert to_json_line(evaluated.json_object()) == NONFINITE_EVAL_LINE


@pytest.mark.parametrize("line", [FULL_LINE, MINIMAL_LINE, NONFINITE_EVAL_LINE], ids=["full", "minimal", "nonfinite-eval"])
def test_a_line_reads_back_as_the_row_that_writes_it_again(line):
    row = MetricsRow.from_json(strict_json.loads(line))
    assert to_json_line(row.json_object()) == line


def test_a_row_reads_back_typed():
    row = MetricsRow.from_json(strict_json.loads(FULL_LINE))
    assert row.memory == full_report().memory and row.ranks == RANKS
    assert row.options == LiveOptions(amp="bf16", clip=1.0, accum=2, steps=100, world_size=2)
    assert row.grad_norms == {"a": 0.5, "b.c": None}  # a norm that was not finite
    assert (row.compiling, row.eager, row.skipped, row.val_loss) == (True, True, True, 2.25)
    evaluated = MetricsRow.from_json(strict_json.loads(NONFINITE_EVAL_LINE))
    assert evaluated.val_loss is not None and math.isnan(evaluated.val_loss)  # evaluated; its loss was not finite
    assert MetricsRow.from_json(strict_json.loads(MINIMAL_LINE)).val_loss is None  # not evaluated


def test_an_old_line_reads_back_with_what_it_lacks_at_none_or_the_options_default():
    row = MetricsRow.from_json(strict_json.loads(OLD_LINE))
    assert (row.step, row.loss, row.val_loss, row.act_stats) == (5, 3.5, 3.75, {"head": [0.0, 1.0, 2.5]})
    assert row.data_wait_s is None  # before the data wait was measured
    assert row.options == LiveOptions(checkpointing=True)  # compile, workers, pin_memory, steps: as before they existed


def test_a_loss_written_as_null_reads_back_as_nan():
    """A step the precision skipped may have a loss that is not finite: strict JSON writes it as null."""
    row = MetricsRow.from_json({**strict_json.loads(MINIMAL_LINE), "loss": None})
    assert math.isnan(row.loss)


def test_a_key_the_row_does_not_have_is_not_read():
    row = MetricsRow.from_json({**strict_json.loads(MINIMAL_LINE), "note": "added by hand", "tokens_per_s": 5})
    assert row == MetricsRow.from_json(strict_json.loads(MINIMAL_LINE))


HOSTILE = {
    "not an object": ("[1, 2]", "metrics row: expected a JSON object, got [1, 2]"),
    "no loss": ('{"step": 1}', "metrics row: missing field 'time'"),
    "a step that is text": (MINIMAL_LINE.replace('"step":3', '"step":"3"'), "metrics row.step: expected int, got str"),
    "a float step": (MINIMAL_LINE.replace('"step":3', '"step":3.5'), "metrics row.step: expected int, got float"),
    "a loss that is text": (MINIMAL_LINE.replace('"loss":4.0', '"loss":"4"'), "metrics row.loss: expected float, got str"),
    "a skipped that is a number": (MINIMAL_LINE.replace('"skipped":false', '"skipped":0'),
                                   "metrics row.skipped: expected bool, got int"),
    "a module's norm that is text": (MINIMAL_LINE.replace('"grad_norms":null', '"grad_norms":{"head":"big"}'),
                                     "metrics row.grad_norms.head: expected float or null, got str"),
    "memory of another shape": (MINIMAL_LINE[:-2] + ',"memory":{"step":3}}\n', "metrics row.memory: missing field 'parameters_bytes'"),
    "a rank's figure that is text": (FULL_LINE.replace('"rank":1,"step_time_s":0.12', '"rank":1,"step_time_s":"slow"'),
                                     "metrics row.ranks[1].step_time_s: expected float or null, got str"),
    "an option that is a list": (MINIMAL_LINE.replace('"amp":"off"', '"amp":["off"]'),
                                 "metrics row.amp: expected str or int or float or bool or null, got list"),
}


@pytest.mark.parametrize("line, reason", list(HOSTILE.values()), ids=list(HOSTILE))
def test_a_line_of_another_shape_is_refused_with_where_it_is_wrong(line, reason):
    with pytest.raises(UnreadableValue) as refusal:
        MetricsRow.from_json(strict_json.loads(line))
    assert str(refusal.value) == reason


def test_metrics_rows_skips_a_line_of_another_shape_with_its_number_and_why(tmp_path):
    journal = tmp_path / "metrics.jsonl"
    lines = [OLD_LINE, *(line if line.endswith("\n") else line + "\n" for line, _ in HOSTILE.values()), '{"step": 9, "loss\n', MINIMAL_LINE]
    journal.write_text("".join(lines))
    skipped: list[SkippedLine] = []
    assert [row.step for row in metrics_rows(journal, skipped)] == [5, 3]
    assert [line.number for line in skipped] == list(range(2, 2 + len(HOSTILE) + 1))
    assert [line.reason for line in skipped[: len(HOSTILE)]] == [reason for _, reason in HOSTILE.values()]
    assert skipped[-1].reason.startswith("not JSON")  # a line torn by a crash


def test_the_test_rows_are_rows_that_read_back():
    """tests/helpers/metrics_rows.py builds the rows the other tests feed the readers: each is one a journal could hold."""
    row = metrics_row(4, amp="bf16", val_loss=1.5, lrs={"head": 0.1})
    assert MetricsRow.from_json(strict_json.loads(to_json_line(row.json_object()))) == row


def test_a_reader_names_a_column_through_column_which_refuses_a_name_that_is_none():
    """The app's reader of metrics batches names its columns through ``column`` (tui/state_metrics.py): a field renamed
    here fails as the app loads, not as an empty chart."""
    from torchlab.core.wire.metrics_row import column

    assert [column(name) for name in ("step", "loss", "val_metrics", "amp")] == ["step", "loss", "val_metrics", "amp"]
    with pytest.raises(KeyError, match="'losses' is no column"):
        column("losses")
