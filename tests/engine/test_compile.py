"""``compile`` as a live option (core/engine/compiling.py): torch.compile at a step boundary, with its compile time
outside the steps, a failure refused with its reason, and checkpoints, trials, checkpointing, AMP and the
probes as they are without it.

Inductor compiles C++ on a CPU: the first compile of a model takes seconds (tens on a cold cache), the next ones
hit torch's caches. These tests compile the tiny workload a few times, so they take a few seconds each.
"""

from __future__ import annotations

from dataclasses import replace
import json
import re
import subprocess
import sys

import pytest
import torch

from metrics_rows import metrics_row
from trainers import TINY, WORKLOADS, make_trainer
from torchlab.core.analysis.impact import ImpactTracker
from torchlab.core.engine.state.checkpoint import load_checkpoint
from torchlab.core.errors import EXIT_OK
from torchlab.core.launch.cli import main
from torchlab.core.records.option_history import option_history

GRADIENT_PENALTY = TINY.replace(":workload", ":gradient_penalty")
RESIDUAL_CNN = TINY.replace(":workload", ":residual_cnn")
#: Its loss_fn returns {"loss": ..., "accuracy": ...}, as a user's with metrics does.
WITH_METRICS = f"{WORKLOADS / 'own_training.py'}:workload"


def losses(seen) -> list[float]:
    return [record.loss for record in seen.metrics]


def applied(seen, option: str) -> list[dict]:
    return [event for event in seen.of("option_applied") if event["option"] == option]


def test_compile_applies_at_a_step_boundary_with_its_compile_time_outside_the_steps():
    trainer, seen = make_trainer(steps=6, at=["3:compile=on", "5:compile=off"], memory_every=1)
    trainer.run()
    on, off = applied(seen, "compile")
    assert (on["step"], on["value"], off["step"], off["value"]) == (3, True, 5, False)
    assert [(event["event"], event["step"]) for event in seen.events if event["event"] not in ("run_started", "longest_batch", "flops_counted", "compile_report")][:2] == [
        ("compile_started", 3), ("option_applied", 3)]
    assert on["detail"].startswith("compiled in ") and on["detail"].endswith(" s, outside the step times")
    assert [record.options.compile for record in seen.metrics] == [False, False, True, True, False, False]
    assert not any(record.compiling for record in seen.metrics)  # it all compiled at the boundary
    # The compiled steps ran the compiled graph: it saves fewer activations than the modules do one by one,
    # as one graph no module hook sees inside (the memory probe charges it to the model as a whole).
    eager, compiled, eager_again = seen.at(2).memory, seen.at(4).memory, seen.at(6).memory
    assert compiled.activations_bytes < eager.activations_bytes == eager_again.activations_bytes
    assert {entry.module for entry in compiled.by_module} == {"(root)", "(loss_fn)"}
    assert trainer.parts.model.running is trainer.model


@pytest.mark.usefixtures("dynamo_only")
def test_a_workload_whose_loss_fn_returns_its_metrics_compiles_and_reports_them_compiled():
    """Seen with a HuggingFace ResNet whose loss_fn returned {"loss", "acc"}: C was refused with
    "'dict' object has no attribute 'backward'" (the compile at the boundary backpropagated loss_fn's mapping)."""
    trainer, seen = make_trainer(WITH_METRICS, steps=4, at=["3:compile=on"])
    trainer.run()
    assert not seen.of("option_refused")
    [event] = applied(seen, "compile")
    assert event["step"] == 3 and event["detail"].startswith("compiled in ")
    assert [record.options.compile for record in seen.metrics] == [False, False, True, True]
    assert all(0.0 <= record.metrics["accuracy"] <= 1.0 for record in seen.metrics)


@pytest.mark.usefixtures("dynamo_only")
def test_headless_says_when_it_compiles_and_how_long_it_took(tmp_path, capsys):
    run = tmp_path / "run"
    assert main([TINY, "--headless", "--steps", "5", "--run-dir", str(run), "--compile", "--at", "4:workers=1",
                 "--telemetry-interval", "0"]) == EXIT_OK
    err = capsys.readouterr().err
    assert "step 1: compiling the model (torch.compile): training waits for it" in err
    assert re.search(r"step 1: compile = on \(was off\): compiled in \d+\.\d s, outside the step times", err)
    assert "step 4: workers = 1 (was 0): the data loader starts again at sample 48 of epoch 0" in err
    journal = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert [event["event"] for event in journal][:4] == ["run_started", "compile_started", "compile_report", "option_applied"]
    assert "step 1: torch.compile: 1 graph, " in err and "; no graph break" in err  # what compile did, said
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[0])["compile"] is True


@pytest.mark.usefixtures("dynamo_only")
def test_a_model_torch_compile_cannot_train_is_refused_with_the_reason_and_trains_on_as_it_was():
    """Its forward takes a gradient (a gradient penalty): torch.compile fails only at the first backward,
    which is why compiling runs a forward and a backward at the boundary, and puts back what they changed."""
    untried, seen_untried = make_trainer(GRADIENT_PENALTY, steps=5)
    untried.run()
    trainer, seen = make_trainer(GRADIENT_PENALTY, steps=5, at=["3:compile=on"])
    trainer.run()
    [refusal] = seen.of("option_refused")
    assert refusal["option"] == "compile" and refusal["step"] == 3
    assert refusal["reason"].startswith("torch.compile could not compile this model: RuntimeError: ")
    assert "does not currently support double backward" in refusal["reason"]
    assert refusal["reason"].endswith("train it uncompiled); it trains on as it was")
    assert "\n" not in refusal["reason"] and "TORCHDYNAMO_VERBOSE" not in refusal["reason"]
    assert not applied(seen, "compile") and trainer.options.compile is False
    assert losses(seen) == losses(seen_untried)  # the attempt changed nothing: RNG, buffers, gradients


def test_without_a_working_cpp_compiler_compile_is_refused_and_training_goes_on(monkeypatch):
    """A machine with no C++ compiler: inductor fails at the first call (a warm cache hides it: skip it)."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(inductor_config.cpp, "cxx", ("/nonexistent/c++",))
    monkeypatch.setattr(inductor_config, "fx_graph_cache", False)
    monkeypatch.setattr(functorch_config, "enable_autograd_cache", False)
    torch._dynamo.reset()  # nor may a graph this process compiled before be reused
    try:
        trainer, seen = make_trainer(steps=4, options={"compile": True})
        trainer.run()
    finally:
        torch._dynamo.reset()
    [refusal] = seen.of("option_refused")
    assert refusal["step"] == 1 and refusal["source"] == "start"
    assert "No working C++ compiler" in refusal["reason"]
    assert refusal["reason"].endswith("install a C++ compiler such as g++, or name one in CXX); it trains on as it was")
    assert [record.options.compile for record in seen.metrics] == [False] * 4


@pytest.mark.usefixtures("dynamo_only")
def test_a_checkpoint_of_a_compiled_run_has_the_models_own_keys_and_resumes_bit_exact(tmp_path):
    settings = dict(steps=8, options={"compile": True})
    straight, seen_straight = make_trainer(**settings)
    straight.run()
    first, _ = make_trainer(checkpoint_dir=tmp_path, checkpoint_every=4, **settings)
    first.run()
    saved = load_checkpoint(tmp_path / "step-0000004.pt")
    assert list(saved["model"]) == list(first.model.state_dict()) and not any("_orig_mod" in key for key in saved["model"])
    assert saved["options"]["compile"] is True
    resumed, seen_resumed = make_trainer(checkpoint_dir=tmp_path, resume_from=tmp_path / "step-0000004.pt", **settings)
    resumed.run()
    [event] = applied(seen_resumed, "compile")  # compiled again at the resumed run's first boundary: in force, no change
    assert (event["step"], event["source"], event["previous"], event["value"]) == (5, "resumed", True, True)
    assert option_history(seen_resumed.of("option_applied")) == []  # the matrix found it listed as off → on at step 5
    assert losses(seen_resumed) == losses(seen_straight)[4:]


@pytest.mark.usefixtures("dynamo_only")  # three compiles of a residual CNN: ~90 s with inductor on a cold cache
def test_checkpointing_and_amp_switched_under_compile_compile_again_at_the_boundary():
    trainer, seen = make_trainer(RESIDUAL_CNN, steps=7, options={"compile": True}, memory_every=1,
                                 at=["3:checkpointing=on", "5:amp=bf16"])
    trainer.run()
    assert applied(seen, "checkpointing")[0]["detail"].startswith("compiled with checkpointing=on in ")
    assert applied(seen, "amp")[0]["detail"].startswith("compiled with amp=bf16 in ")
    assert not seen.of("option_refused") and not any(record.compiling for record in seen.metrics)
    # Checkpointing works compiled: fewer activations saved; BatchNorm's statistics count each step once.
    assert seen.at(4).memory.activations_bytes < seen.at(2).memory.activations_bytes
    assert all(int(buffer) == 7 for name, buffer in trainer.model.named_buffers() if name.endswith("num_batches_tracked"))


@pytest.mark.usefixtures("dynamo_only")
def test_a_trial_on_a_compiled_run_leaves_the_runs_losses_as_they_were():
    """The trial's changed arm compiles the model with checkpointing; putting it back runs the graph compiled
    before, so training goes on with the numbers it would have had without the trial."""
    settings = dict(steps=10, options={"compile": True})
    untried, seen_untried = make_trainer(**settings)
    untried.run()
    trainer, seen = make_trainer(trials=["5:checkpointing=on"], trial_steps=3, **settings)
    trainer.run()
    [result] = seen.of("trial_result")
    assert result["error"] is None and [arm.steps for arm in result["arms"]] == [3, 3]
    assert losses(seen) == losses(seen_untried)
    assert trainer.options == untried.options and trainer.parts.model.running is not trainer.model


@pytest.mark.usefixtures("dynamo_only")
def test_a_checkpointing_change_that_cannot_compile_is_refused_and_leaves_the_blocks_as_they_were(monkeypatch):
    def fails(model, forward_and_backward):
        raise RuntimeError("simulated: inductor cannot lower this")

    trainer, seen = make_trainer(steps=4, options={"compile": True}, at=["3:checkpointing=on"])
    trainer.train_steps(2)
    monkeypatch.setattr("torchlab.core.engine.option_hooks.compile_on_batch", fails)
    trainer.run()
    [refusal] = seen.of("option_refused")
    assert refusal["option"] == "checkpointing"
    assert refusal["reason"].startswith("torch.compile could not compile this model with checkpointing=on: RuntimeError: simulated")
    assert trainer.parts.model.checkpointing.wrapped_blocks() == [] and trainer.options.checkpointing is False


@pytest.mark.usefixtures("dynamo_only")
def test_activation_statistics_under_compile_come_from_an_uncompiled_step_left_out_of_the_impact():
    """Hooks added to a compiled model never fire: a sampled step runs the model uncompiled instead."""
    trainer, seen = make_trainer(steps=6, options={"compile": True}, act_stats_every=3, memory_every=1)
    trainer.run()
    sampled = [record for record in seen.metrics if record.act_stats]
    assert [record.step for record in sampled] == [3, 6]
    assert all(record.eager and record.memory is None for record in sampled)
    assert set(sampled[0].act_stats) >= {"stem", "head", "body.0.0"}
    assert not any(record.eager for record in seen.metrics if record.step % 3)


@pytest.mark.usefixtures("dynamo_only")
def test_the_impact_medians_leave_out_steps_that_compiled_or_ran_uncompiled():
    tracker = ImpactTracker()
    for step in range(1, 31):
        row = metrics_row(step, loss=1.0, step_time_s=0.010, samples_per_s=100.0, data_wait_s=0.001, compile=True)
        if step % 3 == 0:
            row = replace(row, step_time_s=2.0, samples_per_s=0.5, data_wait_s=0.5, **({"compiling": True} if step % 2 else {"eager": True}))
        tracker.on_metrics(row)
    [segment] = tracker.table()
    assert segment.median_step_time_s == 0.010 and segment.step_time_high_s == 0.010
    assert segment.median_data_wait_s == 0.001


@pytest.mark.usefixtures("dynamo_only")
def test_a_step_that_compiles_again_is_marked_as_compile_time():
    """A step during which torch.compile compiles (as after a guard that failed) says so in its record: here
    the compiled graphs are dropped, so the next step compiles its forward and backward as it runs."""
    trainer, seen = make_trainer(steps=4, options={"compile": True})
    trainer.train_steps(2)
    torch._dynamo.reset()  # the compiled graphs are gone: the next step compiles lazily, as after a failed guard
    trainer.run()
    assert [bool(record.compiling) for record in seen.metrics] == [False, False, True, False]


def test_the_trainer_imports_torch_compiles_machinery_and_dtensor_only_once_they_are_used():
    """torch._dynamo (and inductor with it) took 3 s to import at every trainer's start; DTensor, which only a sharded
    model (parallel=fsdp) uses, 0.8 s; the memory trackers the forecast runs under pull in both (the supervisor, over
    the trainer, holds the forecaster's client, which asks its process and imports none of them)."""
    code = ("import sys, torchlab.core.engine.ranks.supervisor; print(*(name in sys.modules for name in "
            "('torch._dynamo', 'torch._inductor', 'torch.distributed.tensor', 'torch.distributed._tools.mem_tracker')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "False", "False", "False"]


def test_compile_warms_up_on_a_piece_of_the_batch_as_the_split_step_runs_it(monkeypatch):
    """Found by the combination matrix: a run split in two because the whole batch does not fit turned compile on,
    and the warm-up ran the whole batch: out of memory, and compile was refused for it. (torch.compile replaced by
    the model itself: which batch the warm-up takes is the point, not what inductor makes of it.)"""
    monkeypatch.setattr("torchlab.core.engine.option_hooks.compile_model", lambda module, dynamic: module)
    trainer, seen = make_trainer(f"{WORKLOADS / 'tiny.py'}:out_of_memory_above_8", steps=3, options={"split": 2},
                                 at=["2:compile=on"])
    assert trainer.run().status == "finished"
    assert not seen.of("option_refused") and not seen.of("oom_rescued")
    assert [e["option"] for e in seen.of("option_applied")] == ["compile"]
