"""The wire protocol: every message round-trips, and malformed input is refused with a reason."""

from __future__ import annotations

import dataclasses
import inspect
import json
import threading
from typing import Any, get_args, get_origin
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metrics_rows import metrics_row
from torchlab.core.wire import communication, compile_report, events, payloads
from torchlab.core.wire import protocol as p
from torchlab.core.wire.outbox import Cursor, Outbox
from torchlab.core.wire.compile_report import CompileReport, GraphBreak, Recompile
from torchlab.core.wire.hang import Hang
from torchlab.core.wire.straggler import Straggler
from torchlab.core.wire.communication import CollectiveTime, CommunicationShare
from torchlab.core.wire.payloads import (
    AllocatorSample,
    ModuleFlops,
    OpFlops,
    GpuSample,
    HostSample,
    ImpactSegment,
    ModuleInfo,
    ProcessSample,
    RankFigures,
    RankProcess,
    RunInfo,
    TelemetrySample,
)
from torchlab.core.wire.protocol import PROTOCOL_VERSION

#: How a line of the protocol begins: its version (a test's line stays one of today's when it moves on).
V = f'{{"v": {PROTOCOL_VERSION}'.encode()

RUN = RunInfo(workload="tiny_gpt", run_dir="/runs/x", device="cpu", steps=200, batch_size=32, pid=7, started=1.7e9,
              checkpoint_blocks=["blocks.0", "blocks.1"], world_size=2,
              ranks=[RankProcess(rank=0, host="node-a", pid=11, device="cpu"), RankProcess(rank=1, host="node-a", pid=12, device="cpu")])
SAMPLE = TelemetrySample(
    time=1.7e9, step=12, gpu_status="1 GPU(s)",
    host=HostSample(cpu_percent=12.5, cpu_count=16, trainer_cpu_percent=98.0, ram_used_bytes=5 << 30, ram_total_bytes=16 << 30,
                    trainer_rss_bytes=812 << 20, trainer_processes=3, cpu_percent_per_core=[12.5, 0, 100.0],
                    processes=[ProcessSample(pid=4242, name="trainer", cpu_percent=98.0, rss_bytes=700 << 20, read_bytes_per_s=0.0,
                                             write_bytes_per_s=None)],
                    io_read_bytes_per_s=0.0, io_write_bytes_per_s=None),
    gpus=[GpuSample(index=0, name="NVIDIA H100", memory_used_bytes=41 << 30, memory_total_bytes=80 << 30, utilization_percent=87.0,
                    temperature_c=62.0, power_w=312.4, power_limit_w=None, sm_clock_mhz=1980.0, this_run_memory_bytes=None)],
    torch=AllocatorSample(device="cuda:0", allocated_bytes=12 << 30, reserved_bytes=14 << 30, peak_allocated_bytes=None),
)
SEGMENT = ImpactSegment(
    change="start", options={"amp": "off", "clip": None}, first_step=1, last_step=40, median_step_time_s=0.12,
    step_time_low_s=0.11, step_time_high_s=0.13, median_samples_per_s=266.7, median_data_wait_s=0.002, peak_allocated_bytes=None, nvml_run_bytes=None, others_cpu_percent=None,
    activations_bytes=48 << 20, tensor_bytes=61 << 20, loss_slope_per_100_steps=-2.4, speedup=None, memory_change=None,
    activations_change=None, verdict="start",
)

_PREDICTED_SETTINGS = {"amp": "bf16", "checkpointing": False, "split": 1, "accum": 1, "batch_size": 32, "world_size": 1,
                       "parallel": "ddp", "reshard_after_forward": True}

EXAMPLES = [
    p.Hello(version=1, token="ab" * 32, client="test"),
    p.PauseCommand(), p.ResumeCommand(), p.StopCommand(), p.StopCommand(reason="interrupted"),
    p.SetCommand(option="amp", value="bf16"), p.SetCommand(option="clip", value=None), p.SetCommand(option="accum", value=4, source="--at"),
    p.ProfileCommand(steps=5), p.ProfileCommand(steps=3, source="--profile-at"), p.SaveCheckpointCommand(), p.DetachCommand(),
    p.Welcome(run=RUN, modules=[ModuleInfo(name="blocks.0.attn.qkv", params=49536),
                                ModuleInfo(name="transformer.wte", params=38597376, tied=["lm_head"])],
              options={"amp": "off", "clip": None}, state="running", step=12),
    p.Replayed(events=16),
    p.State(state="paused", step=3, detail="from the app"),
    p.Metrics.from_rows([metrics_row(1, loss=2.5), metrics_row(2, loss=2.4, val_loss=2.6, phases=payloads.StepPhases(
        data_s=0.021, copy_s=0.0001, forward_s=0.011, backward_s=0.016, optimizer_s=0.001, communication_s=0.0,
        probes_s=0.0002, other_s=0.0005, steps=5))]),
    p.GradNorms(step=4, norms=[0.5, None, 1.25], total=1.4),
    p.TrialCommand(option="amp", value="bf16", steps=20, source="app"),
    p.TrialResult(step=40, option="amp", value="bf16", steps=20, source="app", arms=[
        payloads.TrialArm(label=label, steps=20, median_step_time_s=0.01, step_time_low_s=0.0098, step_time_high_s=0.0103,
                          activations_bytes=1 << 20, tensor_bytes=3 << 20, losses=[2.5, 2.25], error=None)
        for label in ("amp=bf16", "as it is")],
        speed=payloads.TrialSpeed(ratio=0.58, low=0.55, high=0.61, verdict="faster", pairs=10, steps=20)),
    p.TrialResult(step=41, option="amp", value="fp16", steps=20, arms=[], error="amp=fp16 cannot run here: fp16 needs CUDA"),
    p.Memory(breakdown=payloads.MemoryBreakdown(
        step=4, parameters_bytes=4096, gradients_bytes=4096, optimizer_bytes=8200, activations_bytes=65536,
        allocator_peak_bytes=None, by_module=[payloads.ModuleBytes("blocks.0.attn", 65000), payloads.ModuleBytes("(loss_fn)", 536)],
    )),
    p.Telemetry(sample=SAMPLE),
    p.OptionApplied(option="amp", value="bf16", previous="off", step=8, source="app"),
    p.OptionRefused(option="amp", value="fp16", reason="fp16 needs CUDA", step=8, source="app"),
    p.Detached(step=9),
    p.CheckpointSaved(step=100, path="/runs/x/checkpoints/step-0000100.pt", reason="periodic"),
    p.Log(level="warning", text="step skipped", step=3),
    p.Error(message="RuntimeError: boom", traceback="Traceback ...", step=4, checkpoint="/runs/x/last.pt"),
    p.NonFinite(step=6, phase="forward", module="blocks.2.mlp", detail="output non-finite", message="step 6: ..."),
    p.ProfileReady(first_step=11, last_step=15, dir="/runs/x/profiles/0000010",
                   rows=[{"name": "aten::mm", "calls": 30, "self_cpu_us": 1200.5}], sort="self_cpu_us", build_s=0.4,
                   communication=CommunicationShare(steps_us=866000.0, us=154000.0, share=0.1778, source="gloo",
                                                    by_kind=[CollectiveTime("all_gather", 92000.0),
                                                             CollectiveTime("all_reduce", 62000.0)])),
    p.Impact(segments=[SEGMENT]),
    p.Ranks(step=12, ranks=[RankFigures(rank=0, step_time_s=0.05, data_wait_s=0.001, allocated_bytes=None,
                                        reserved_bytes=None, peak_allocated_bytes=None, rss_bytes=3.3e8)]),
    p.Refused(reason="wrong token"),
    p.TrialProgress(step=40, label="amp=bf16", arm=1, done=7, steps=20),
    # the trainer's own events (core/wire/events.py): messages of the same protocol
    events.RunStarted(step=0, device="cpu", batch_size=32, steps=200, options={"amp": "off", "accum": 1},
                      modules=["blocks.0", "head"], module_params=[49536, 2570], checkpoint_blocks=["blocks.0"],
                      world_size=2, ranks=[{"rank": r, "host": "box", "pid": 41 + r, "device": "cpu"} for r in (0, 1)],
                      module_tied=[[], []], from_workload={"optimizer": "AdamW"}, workload_settings={"steps": 200},
                      batch_norm_layers=1),
    events.RunEnded(step=200, status="finished"),
    events.Paused(step=12), events.Resumed(step=12),
    events.StepSkipped(step=7, reason="fp16 gradients overflowed", scale=32768.0),
    events.OomRescued(step=7, option="split", value=2, previous=1, error="CUDA out of memory.", samples_before=16, samples_after=8),
    events.SpikeGuarded(step=21, measure="loss", value=184.0, median=0.76, z=81.5, threshold=6.0, window=50,
                        action="rolled_back", loss=184.0, grad_norm=3.5, rolled_back_to=10, samples=[3, 17]),
    events.SpikeGuarded(step=1703, measure="loss", value=9.1, median=2.3, z=12.0, threshold=6.0, window=50,
                        action="let_through", loss=9.1, held_back=36),
    events.ProfileStarted(step=8, steps=5, source="app"),
    events.TrialStarted(step=4, option="amp", value="bf16", steps=12, source="app"),
    events.CompileStarted(step=6, detail="with amp=bf16"),
    events.ResumedFromCheckpoint(step=9, options={"amp": "bf16"}),
    events.ResumeChangedSettings(step=9, level="info", message="resumed with steps 20 → 40",
                                 changes=[{"setting": "steps", "stored": 20, "value": 40, "breaks_exactness": False}]),
    events.Relaunching(step=30, option="world_size", value=2, previous=1, world_size=2),
    events.LineRefused(step=3, channel="app", reason="message is not valid JSON", before_hello=True, held_back=2),
    events.LinesRefusedUnrecorded(step=50, channel="app", count=4),
    events.JournalRepaired(step=0, file="metrics.jsonl", bytes_dropped=37, message="metrics.jsonl ended in a torn line"),
    events.MetricsMovedAside(step=9, rows=3, first_step=10, last_step=12, file="metrics.replayed-1.jsonl",
                             message="steps 10-12 are trained again"),
    events.StopRequested(step=10, reason="stopped by `torchlab-tui stop`"),
    p.ForecastCommand(),
    events.MemoryPredicted(step=40, settings=_PREDICTED_SETTINGS, change="amp=bf16", capacity_bytes=80 * 2**30,
                           capacity="80.0 GiB per rank (NVIDIA H100 80GB HBM3, by NVML)", verdict="yes", ratio=1.06,
                           longest_batch_elements=32_800,
                           prediction=payloads.MemoryPrediction(
                               settings=_PREDICTED_SETTINGS, peak_bytes=28_200_000,
                               at_peak={"parameters": 4_000_000, "gradients": 4_000_000, "optimizer": 8_000_000,
                                        "activations": 11_000_000, "gathered": 0, "other": 1_200_000},
                               parameters_bytes=4_000_000, gradients_bytes=4_000_000, optimizer_bytes=8_000_000,
                               activations_bytes=12_500_000, gathered_bytes=0, seconds=0.41)),
    events.MemoryPredicted(step=40, settings={**_PREDICTED_SETTINGS, "world_size": 8, "parallel": "fsdp"},
                           change="world_size=8, parallel=fsdp", prediction=None, capacity_bytes=80 * 2**30,
                           capacity="80.0 GiB per rank", error="a tensor's value read in Python (.item()) at model.py:12"),
    events.PredictionChecked(step=46, settings=_PREDICTED_SETTINGS, measure=events.ALLOCATOR_PEAK,
                             predicted_bytes=28_200_000, measured_bytes=29_900_000, error=0.0603, ratio=1.0603),
    events.LongestBatch(step=840, shapes=[[32, 512], [32, 512], [32]], elements=32_800, previous_elements=29_216),
    CompileReport(step=12, compile_s=41.5, graphs=3, recompile_limit=8, watch_s=0.2, breaks=[
        GraphBreak("/home/me/model.py", 17, "if y.sum() > 0:", "Data-dependent branching", "Detected data-dependent branching",
                   "consider making the code branchless", count=2)],
        recompiles=[Recompile("forward", "/home/me/model.py", 15, "tensor 'x' size mismatch at index 1. expected 61, actual 64",
                              count=1, compiled=2)],
        eager_ops=3, graphs_run=2, eager_most=["aten::is_nonzero x2", "aten::_local_scalar_dense x1"]),
    Hang(step=4812, waited_s=41.0, explanation="step 4812 has run 41 s, its steps 210 ms: rank 2 at model.py:88 in "
         "forward, past collective #9623; ranks 0, 1, 3 at step.py:214 in _backward, past collective #9623",
         folder="/runs/big/hangs/step-0004812", checkpoint="/runs/big/checkpoints/step-0004800.pt", checkpoint_step=4800),
    Straggler(step=240, rank=1, host="node-b", excess_s=0.0152, step_share=0.31, since_step=40, part="data wait"),
    events.FlopsCounted(step=1, flops=83_456, ops=140, shapes=[[16, 8], [16, 1]],
                        settings={"checkpointing": True, "split": 1, "accum": 1},
                        by_module=[ModuleFlops("body.0.0", 8192, 16384, 8192), ModuleFlops("stem", 4096, 4096)],
                        by_op=[OpFlops("aten::mm", 54_272), OpFlops("aten::addmm", 29_184)]),
]


def test_every_message_type_has_an_example():
    """Each message the protocol registers, the trainer's events too: the readers' tests (test_every_reader.py) feed
    these, so a new event has to come with one."""
    assert {type(m) for m in EXAMPLES} == set(p.Message.registry.values())


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: m.type)
def test_every_message_round_trips_as_one_json_line(message):
    line = message.encode()
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line)["v"] == p.PROTOCOL_VERSION
    assert p.decode(line) == message
    assert p.decode(line.decode().strip()) == message


def test_metrics_travel_as_columns_and_read_back_as_rows():
    rows = [metrics_row(1, loss=2.5, grad_norms={"head": 0.5}), metrics_row(2, loss=2.4, val_loss=2.6, amp="bf16")]
    message = p.Metrics.from_rows(rows)
    assert message.columns["step"] == [1, 2] and message.columns["loss"] == [2.5, 2.4]
    assert message.columns["val_loss"] == [None, 2.6] and message.columns["amp"] == ["off", "bf16"]
    assert "grad_norms" not in message.columns  # the norms travel as GradNorms, aligned with the module names
    assert p.decode(message.encode()).rows == [dataclasses.replace(rows[0], grad_norms=None), rows[1]]


def test_non_finite_numbers_travel_as_null():
    line = p.GradNorms(step=1, norms=[float("nan"), float("inf"), 1.0]).encode()
    assert b"NaN" not in line and b"Infinity" not in line
    assert p.decode(line).norms == [None, None, 1.0]


@pytest.mark.parametrize("line, reason", [
    (b"{", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b'{"type": "pause"}', "protocol version None is not supported"),
    (b'{"v": 99, "type": "pause"}', f"protocol version 99 is not supported; this side speaks version {p.PROTOCOL_VERSION}"),
    (V + b'}', "unknown message type None"),
    (V + b', "type": "format_disk"}', "unknown message type 'format_disk'"),
    (V + b', "type": "set", "option": "amp"}', "set: missing field 'value'"),
    (V + b', "type": "set", "option": ["amp"], "value": 1}', "set.option: expected str, got list"),
    (V + b', "type": "set", "option": "amp", "value": {"x": 1}}', "set.value: expected str or int or float or bool or null, got dict"),
    (V + b', "type": "profile", "steps": true}', "profile.steps: expected int, got a boolean"),
    (V + b', "type": "pause", "now": true}', "pause: unknown field(s) now"),
    (V + b', "type": "trial_progress", "step": 4, "label": "clip=0.5", "arm": 3, "done": 1, "steps": 2}',
     "trial_progress: arm must be 1 or 2, got 3"),
    (V + b', "type": "trial_progress", "step": 4, "label": "clip=0.5", "arm": 1, "done": 3, "steps": 2}',
     "trial_progress: done must be from 0 to steps (2), got 3"),
    (V + b', "type": "hello", "version": 1}', "hello: missing field 'token'"),
    (b"\xff\xfe", "not UTF-8"),
    (V + b', "type": "metrics", "columns": {"step": [1], "loss": [2.5, 2.4]}}', "columns must be of one length, got lengths [1, 2]"),
    (V + b', "type": "metrics", "columns": {"step": 1}}', "every column must be a list of values"),
    (V + b', "type": "metrics", "columns": ["step"], "rows": [[1]]}', "unknown field(s) rows"),
    (b"[" * 100000, "not valid JSON"),
    (b" " * (p.MAX_LINE_BYTES + 1), "exceeds the limit"),
])
def test_malformed_messages_are_refused_with_the_reason(line, reason):
    with pytest.raises(p.ProtocolError, match=reason.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        p.decode(line)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(payload=st.dictionaries(st.sampled_from(["v", "type", "option", "value", "steps", "token", "x"]), json_values))
def test_arbitrary_json_objects_decode_or_are_refused_never_crash(payload):
    try:
        p.decode(json.dumps(payload))
    except p.ProtocolError:
        pass


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_are_refused_never_crash(data):
    try:
        p.decode(data)
    except p.ProtocolError:
        pass


# ------------------------------------------------------------------------------ nested payloads

#: the payload types: payloads.py's, and those of a part of the protocol in a module of its own (compile_report.py)
PAYLOAD_TYPES = {kind for module in (payloads, compile_report, communication) for _, kind in inspect.getmembers(module, inspect.isclass)
                 if dataclasses.is_dataclass(kind) and not issubclass(kind, p.Message) and kind.__module__ == module.__name__}


def payloads_in(value: Any) -> list[Any]:
    """Every payload object inside ``value`` (a message, a payload, a list), depth first."""
    if isinstance(value, list):
        return [found for item in value for found in payloads_in(item)]
    if isinstance(value, p.Metrics):  # its rows' payloads (``phases``) travel in its columns, as the objects of their fields
        return [found for row in value.rows for spec in dataclasses.fields(row) if spec.name != "options"
                for found in payloads_in(getattr(row, spec.name))]
    if not dataclasses.is_dataclass(value):
        return []
    inner = [found for spec in dataclasses.fields(value) for found in payloads_in(getattr(value, spec.name))]
    return inner if isinstance(value, p.Message) else [value, *inner]


def test_every_payload_type_has_an_example_and_round_trips_inside_its_message():
    assert {type(found) for message in EXAMPLES for found in payloads_in(message)} == PAYLOAD_TYPES
    for message in EXAMPLES:
        decoded = p.decode(message.encode())
        assert payloads_in(decoded) == payloads_in(message)
        assert [type(found) for found in payloads_in(decoded)] == [type(found) for found in payloads_in(message)]


def test_payloads_keep_their_json_field_names():
    """The wire, system.jsonl, metrics.jsonl and impact.json write a payload as the object of its fields."""
    sample = json.loads(p.Telemetry(sample=SAMPLE).encode())["sample"]
    assert set(sample) == {"time", "step", "host", "gpus", "gpu_status", "torch"}
    assert sample["gpus"][0]["memory_used_bytes"] == 41 << 30 and sample["torch"]["peak_allocated_bytes"] is None
    assert json.loads(p.Impact(segments=[SEGMENT]).encode())["segments"] == [dataclasses.asdict(SEGMENT)]


def line_with(message: p.Message, path: list[str | int], value: Any) -> str:
    """``message`` as a line of JSON, with the value at ``path`` (keys and indices) replaced by ``value``."""
    data = json.loads(message.encode())
    target = data
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return json.dumps(data)


TELEMETRY, WELCOME, IMPACT, RANKS = (next(m for m in EXAMPLES if isinstance(m, kind)) for kind in (p.Telemetry, p.Welcome, p.Impact, p.Ranks))


@pytest.mark.parametrize("message, path, value, reason", [
    (TELEMETRY, ["sample", "gpus", 0, "memory_used_bytes"], "41",
     "telemetry.sample.gpus[0].memory_used_bytes: expected int or null, got str"),
    (TELEMETRY, ["sample", "host"], [], "telemetry.sample.host: expected dict, got list"),
    (TELEMETRY, ["sample", "host", "cpu_percent"], None, "telemetry.sample.host.cpu_percent: expected float, got null"),
    (TELEMETRY, ["sample", "torch", "allocated_bytes"], 10**30, "telemetry.sample.torch.allocated_bytes: 1000000000000000000000000000000 is out of range"),
    (TELEMETRY, ["sample", "gpus", 0, "power_w"], float("inf"), "telemetry.sample.gpus[0].power_w: inf is not a finite number"),
    (WELCOME, ["run", "ranks", 1, "pid"], True, "welcome.run.ranks[1].pid: expected int, got a boolean"),
    (WELCOME, ["run", "checkpoint_blocks", 1], 3, "welcome.run.checkpoint_blocks[1]: expected str, got int"),
    (WELCOME, ["modules", 0], "blocks.0", "welcome.modules[0]: expected dict, got str"),
    (WELCOME, ["modules", 0, "nom"], 1, "welcome.modules[0]: unknown field(s) nom"),
    (WELCOME, ["run"], {"workload": "tiny_gpt"}, "welcome.run: missing field 'run_dir'"),
    (IMPACT, ["segments", 0, "speedup"], "fast", "impact.segments[0].speedup: expected float or null, got str"),
    (IMPACT, ["segments"], {"change": "start"}, "impact.segments: expected list, got dict"),
    (RANKS, ["ranks", 0, "step_time_s"], float("nan"), "ranks.ranks[0].step_time_s: nan is not a finite number"),
    (RANKS, ["ranks", 0, "rank"], 0.5, "ranks.ranks[0].rank: expected int, got float"),
], ids=lambda value: "" if not isinstance(value, str) else value[:40])
def test_a_malformed_nested_payload_is_refused_with_its_path(message, path, value, reason):
    with pytest.raises(p.ProtocolError) as refused:
        p.decode(line_with(message, path, value))
    assert str(refused.value).startswith(reason)


def conforms(value: Any, accepted: tuple) -> bool:
    """Whether ``value`` is of a schema's ``accepted`` types, nested payloads and their lists checked through."""
    for kind in accepted:
        if dataclasses.is_dataclass(kind) and isinstance(value, kind):
            return all(conforms(getattr(value, spec.name), kind.schema[spec.name]) for spec in dataclasses.fields(kind))
        if get_origin(kind) is list and isinstance(value, list):
            return all(conforms(item, get_args(kind)) for item in value)
        if isinstance(kind, type) and not dataclasses.is_dataclass(kind) and isinstance(value, kind) and not (
                isinstance(value, bool) and kind is not bool):
            return True
    return False


def locations(value: Any, path: tuple = ()) -> list[tuple]:
    """The path of every value inside a decoded JSON ``value``."""
    found = [path] if path else []
    if isinstance(value, dict):
        found += [location for key, item in value.items() for location in locations(item, (*path, key))]
    elif isinstance(value, list):
        found += [location for index, item in enumerate(value) for location in locations(item, (*path, index))]
    return found


def shown_path(kind: str, path: tuple) -> str:
    return kind + "".join(f"[{step}]" if isinstance(step, int) else f".{step}" for step in path)


any_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=20), children, max_size=3),
    max_leaves=6,
)


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_a_nested_payload_changed_anywhere_decodes_typed_or_is_refused_at_that_path(data):
    """Replace any value inside a payload, drop a field, or add one: decode either reads a message whose every
    payload has its declared types (the app reads them as they are), or refuses it naming where it went wrong."""
    message = data.draw(st.sampled_from([TELEMETRY, WELCOME, IMPACT, RANKS]))
    original = json.loads(message.encode())
    path = data.draw(st.sampled_from([location for location in locations(original) if location[0] not in ("v", "type")]))
    edit = data.draw(st.sampled_from(["replace", "drop", "add"]))
    changed = json.loads(message.encode())
    parent = changed
    for step in path[:-1]:
        parent = parent[step]
    if edit == "replace" or isinstance(parent, list):
        parent[path[-1]] = data.draw(any_json)
    elif edit == "drop":
        del parent[path[-1]]
    else:
        # a field of its own: a name the object has already would be a replace (drawn "v": the version changed)
        parent[data.draw(st.text(min_size=1, max_size=20).filter(lambda name: name not in parent))] = data.draw(any_json)
        path = path[:-1]
    try:
        decoded = p.decode(json.dumps(changed))
    except p.ProtocolError as error:
        reason = str(error)
        assert len(reason) <= MAX_REASON_CHARS
        where = shown_path(message.type, path)
        # At the value changed, or at the object it is in (a field dropped or added, or a list's whole type).
        assert reason.startswith(where) or reason.startswith(shown_path(message.type, path[:-1]) + ":"), (reason, where)
        return
    for spec in dataclasses.fields(decoded):
        assert conforms(getattr(decoded, spec.name), type(decoded).schema[spec.name]), spec.name


# ------------------------------------------------------------------------------ the outbox


def test_outbox_sends_everything_in_order_to_a_reader_that_keeps_up():
    outbox, cursor = Outbox(), Cursor()
    outbox.add_metrics(metrics_row(1))
    outbox.add_event(p.State(state="running", step=1))
    outbox.add_metrics(metrics_row(2))
    taken = outbox.take(cursor, timeout=0)
    assert [m.type for m in taken] == ["metrics", "state"]
    assert [r.step for r in taken[0].rows] == [1, 2]
    assert outbox.take(cursor, timeout=0) == []


def test_outbox_keeps_only_the_latest_grad_norms_and_telemetry():
    outbox, cursor = Outbox(), Cursor()
    for step in range(1, 100):
        outbox.add_latest(p.GradNorms(step=step, norms=[float(step)]))
        outbox.add_latest(p.Telemetry(sample=dataclasses.replace(SAMPLE, step=step)))
    taken = outbox.take(cursor, timeout=0)
    assert [(m.type, getattr(m, "step", None)) for m in taken] == [("grad_norms", 99), ("telemetry", None)]
    assert taken[1].sample.step == 99


def test_a_slow_reader_loses_old_metrics_but_never_an_acknowledgement():
    outbox, slow = Outbox(metrics_capacity=100), Cursor()
    for step in range(1, 5001):
        outbox.add_metrics(metrics_row(step))
        if step % 1000 == 0:
            outbox.add_event(p.OptionApplied(option="accum", value=step, previous=None, step=step))
    taken = outbox.take(slow, timeout=0)
    rows = [r for m in taken if isinstance(m, p.Metrics) for r in m.rows]
    assert [r.step for r in rows] == list(range(4901, 5001))  # bounded: the newest 100
    assert [m.step for m in taken if isinstance(m, p.OptionApplied)] == [1000, 2000, 3000, 4000, 5000]


def test_a_new_reader_gets_the_history_replayed_in_batches():
    outbox = Outbox()
    for step in range(1, 2501):
        outbox.add_metrics(metrics_row(step))
    taken = outbox.take(Cursor(), timeout=0)
    assert [len(m.columns["step"]) for m in taken] == [1000, 1000, 500]


def test_a_connections_past_is_what_the_outbox_holds_then_a_marker_with_its_events_counted():
    outbox, cursor = Outbox(events_capacity=3), Cursor()
    for step in range(1, 6):
        outbox.add_metrics(metrics_row(step))
        outbox.add_event(p.State(state="running", step=step))
    past = outbox.take_past(cursor)
    assert [r.step for r in past[0].rows] == [1, 2, 3, 4, 5]
    assert [m.step for m in past[1:-1]] == [3, 4, 5]  # the oldest events left the ring
    assert past[-1] == p.Replayed(events=3)
    outbox.add_event(p.State(state="paused", step=6))
    assert outbox.take(cursor, timeout=0) == [p.State(state="paused", step=6)]


def test_a_sender_letting_reports_gather_is_woken_by_an_event_not_by_reports():
    outbox, cursor = Outbox(), Cursor()
    outbox.take(cursor, timeout=0)
    waiter = threading.Thread(target=outbox.wait_for_event, args=(cursor, 60.0))
    waiter.start()
    for step in range(1, 101):
        outbox.add_metrics(metrics_row(step))
        outbox.add_latest(p.GradNorms(step=step, norms=[1.0]))
    waiter.join(timeout=0.2)
    assert waiter.is_alive(), "reports and latest-wins values do not cut the gathering short"
    outbox.add_event(p.OptionApplied(option="clip", value=1.0, previous=None, step=100))
    waiter.join(timeout=60.0)
    assert not waiter.is_alive(), "an acknowledgement goes at once"
    outbox.wait_for_event(cursor, 60.0)  # an event not yet taken: no wait at all
    outbox.take(cursor, timeout=0)
    outbox.close()
    outbox.wait_for_event(cursor, 60.0)  # closed: no wait either


def test_closing_wakes_the_reader_and_ends_it_after_what_is_left():
    outbox, cursor = Outbox(), Cursor()
    outbox.add_event(p.State(state="finished", step=9))
    outbox.close()
    assert [m.type for m in outbox.take(cursor, timeout=10)] == ["state"]
    assert outbox.take(cursor, timeout=10) is None


# ------------------------------------------------------------------------------ reasons are short

#: Every reason goes back to the peer and into events.jsonl: a few hundred characters at most.
MAX_REASON_CHARS = 300

long_texts = st.builds(lambda char, count: char * count, st.characters(), st.integers(0, 100_000))
huge_ints = st.builds(lambda digits, sign: sign * int("9" * digits), st.integers(1, 4300), st.sampled_from([1, -1]))
hostile_values = st.recursive(
    st.none() | st.booleans() | st.integers() | huge_ints | st.floats() | st.text(max_size=20) | long_texts,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8) | long_texts, children, max_size=4),
    max_leaves=8,
)
hostile_keys = st.sampled_from(["v", "type", "option", "value", "steps", "token", "version", "columns"]) | long_texts
hostile_objects = st.builds(
    lambda payload, version, kind: {**payload, **version, **kind},
    st.dictionaries(hostile_keys, hostile_values, max_size=6),
    st.sampled_from([{}, {"v": p.PROTOCOL_VERSION}]),  # half the time past the version check
    st.sampled_from([{}] + [{"type": message.type} for message in (*p.COMMANDS, *p.EVENTS)]),  # and the type check
)


def reason_of(line: str) -> str | None:
    try:
        p.decode(line)
    except p.ProtocolError as error:
        return str(error)
    return None


@settings(max_examples=300, deadline=None)
@given(payload=hostile_objects | hostile_values)
def test_a_refusal_never_echoes_more_than_a_few_hundred_characters(payload):
    """Whatever JSON a peer sends (a 100k-character type or field name, a 4,300-digit version), the
    reason is short: it is sent back and written to the run's journal."""
    reason = reason_of(json.dumps(payload))
    assert reason is None or len(reason) <= MAX_REASON_CHARS


@pytest.mark.parametrize("payload, shown", [
    ({"v": PROTOCOL_VERSION, "type": "x" * 1_000_000}, "unknown message type 'xxxxxxxxxxxxxxxxx...xxxxxxxxxxxxxxxxxx'"),
    ({"v": int("9" * 4000), "type": "pause"}, "protocol version 999999999999999999...9999999999999999999 is not supported"),
    ({"v": "v" * 100_000}, "protocol version 'vvvvvvvvvvvvvvvvv...vvvvvvvvvvvvvvvvvv' is not supported"),
    ({"v": PROTOCOL_VERSION, "type": ["pause"] * 100_000}, "unknown message type ['pause', 'pause', 'pause', ...]"),
    ({"v": {str(n) * 50: {str(m) * 50: "v" * 50 for m in range(3)} for n in range(3)}}, "protocol version {'000000"),
    ({"v": PROTOCOL_VERSION, "type": "pause", **{f"{n:06d}" + "f" * 1000: 1 for n in range(1000)}},
     "pause: unknown field(s) 000000" + "f" * 31 + "..., 000001"),
    ({"v": PROTOCOL_VERSION, "type": "pause", **{f"{n:06d}": 1 for n in range(1000)}}, "unknown field(s) 000000, 000001, 000002 and 997 more"),
    ({"v": PROTOCOL_VERSION, "type": "metrics", "columns": {str(n): [0] * n for n in range(2000)}}, "got lengths [0, 1, 2 and 1997 more]"),
])
def test_what_a_peer_sent_is_echoed_cut_short(payload, shown):
    reason = reason_of(json.dumps(payload))
    assert shown in reason and len(reason) <= MAX_REASON_CHARS


# ------------------------------------------------------------------------------ text that is not Unicode
# JSON may escape half of a surrogate pair ("\ud800"); json.loads takes it, and the str it makes fails later, far
# from the socket: encoding a hello's token to compare it killed the rank channel's accept thread (issue 26).

LONE_SURROGATES = [
    V + b', "type": "hello", "version": 8, "token": "\\ud800"}',  # a high half alone
    V + b', "type": "hello", "version": 8, "token": "ab\\uDFFFcd"}',  # a low half alone, in capitals
    V + b', "type": "hello", "version": 8, "token": "\\ude00\\ud83d"}',  # both halves, the wrong way round
    V + b', "type": "set", "option": "amp", "value": "\\ud800"}',
    V + b', "type": "pause", "\\ud800": 1}',  # in a name
    V + b', "type": "metrics", "columns": {"step": [1], "note": [["\\udbff"]]}}',  # deep inside a value
]


@pytest.mark.parametrize("line", LONE_SURROGATES)
def test_text_that_is_not_unicode_is_refused_as_a_message(line):
    for form in (line, line.decode("ascii")):
        with pytest.raises(p.ProtocolError, match=r"^message holds text that is not Unicode \(half of a surrogate pair"):
            p.decode(form)


def test_a_pair_of_escaped_surrogates_is_the_one_character_it_stands_for():
    """strict_json escapes every character past ASCII, an emoji as its surrogate pair: that is valid text."""
    hello = p.decode(V + b', "type": "hello", "version": 8, "token": "\\ud83d\\ude00 \\u00e9"}')
    assert hello.token == "\U0001f600 \u00e9"
    assert p.decode(p.Hello(version=8, token="\U0001f600").encode()).token == "\U0001f600"


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=st.characters(blacklist_categories=()), max_size=12))
def test_whatever_decodes_can_be_encoded_compared_and_echoed(text):
    """Any text a peer can put in a line, surrogates included: refused, or a message whose every string is Unicode."""
    line = json.dumps({"v": p.PROTOCOL_VERSION, "type": "hello", "version": p.PROTOCOL_VERSION, "token": text})
    try:
        hello = p.decode(line)
    except p.ProtocolError as error:
        assert p.Refused(reason=str(error)).encode()
        return
    hello.token.encode("utf-8")  # what the socket does to compare it
    assert hello.token == text and hello.encode()


def test_a_line_in_a_bytearray_reads_as_in_bytes():
    """The app's link splits a bytearray buffer into lines: each is a bytearray, checked as bytes are."""
    assert p.decode(bytearray(p.PauseCommand().encode())) == p.PauseCommand()
    with pytest.raises(p.ProtocolError, match="not Unicode"):
        p.decode(bytearray(LONE_SURROGATES[0]))


def test_a_trial_recorded_before_its_arms_were_interleaved_reads_with_no_speed_and_is_judged_off_its_arms():
    """A ``trials.jsonl`` line of protocol 9 has no ``speed``: it reads as it did, its speed compared off the arms."""
    from torchlab.core.analysis.trial_words import trial_verdict

    old_line = {"event": "trial_result", "step": 40, "time": 1764150000.0, "option": "checkpointing", "value": "on",
                "steps": 20, "source": "--trial", "error": None, "arms": [
                    {"label": label, "steps": 20, "median_step_time_s": ms / 1000, "step_time_low_s": 0.98 * ms / 1000,
                     "step_time_high_s": 1.02 * ms / 1000, "activations_bytes": 100, "tensor_bytes": 200,
                     "losses": [2.5], "error": None, "others_cpu_percent": 3.0}
                    for label, ms in (("checkpointing=on", 13.3), ("as it is", 10.0))]}
    fields = {key: value for key, value in old_line.items() if key not in ("event", "time")}
    result = p.decode(json.dumps({"v": p.PROTOCOL_VERSION, "type": "trial_result", **fields}))
    assert result.speed is None and [arm.label for arm in result.arms] == ["checkpointing=on", "as it is"]
    assert trial_verdict(result).startswith("1.33x slower, same activations, same memory")


def test_every_protocol_version_says_what_it_added_in_the_docs():
    """The changelog once sat on PROTOCOL_VERSION's line, 1,500 characters long: it is docs/protocol-versions.md now,
    and a bump without its line there fails here."""
    table = (Path(__file__).parents[2] / "docs" / "protocol-versions.md").read_text()
    versions = [int(line.split("|")[1]) for line in table.splitlines() if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    assert versions == list(range(1, p.PROTOCOL_VERSION + 1))
