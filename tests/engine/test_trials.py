"""Controlled trials (core/engine/trials.py): two arms on the same batches from the same state, then undone."""

from __future__ import annotations

import json

import pytest

from trainers import TINY, WORKLOADS, make_trainer
from trial_records import trial_arm
from torchlab.core.analysis.trial_words import describe_trial
from torchlab.core.engine.trials import timing_cap
from torchlab.core.errors import EXIT_OK
from torchlab.core.launch.cli import main
from torchlab.core.wire import strict_json
from torchlab.core.wire.protocol import TrialCommand

RESIDUAL_CNN = f"{WORKLOADS / 'tiny.py'}:residual_cnn"


def trial_results(seen) -> list[dict]:
    """The trial_result records as trials.jsonl holds them (their arms as JSON objects)."""
    return [json.loads(strict_json.dumps(record)) for record in seen.of("trial_result")]


def losses(seen) -> list[float]:
    return [record.loss for record in seen.metrics]


@pytest.mark.parametrize("option, value", [("lr_scale", "0.5"), ("amp", "bf16"), ("checkpointing", "on"), ("clip", "0.1"),
                                           ("accum", "2"), ("compile", "on"), ("workers", "2")])
def test_a_run_with_a_trial_has_the_losses_of_the_run_without_one_bit_for_bit(option, value):
    settings = dict(steps=16, seed=5, checkpoint_every=0, options={"clip": 1.0} if option != "clip" else {})
    untried_trainer, untried = make_trainer(TINY, **settings)
    untried_trainer.run()
    trainer, tried = make_trainer(TINY, trials=[f"6:{option}={value}"], trial_steps=4, **settings)
    trainer.run()
    [result] = trial_results(tried)
    assert result["error"] is None and [arm["steps"] for arm in result["arms"]] == [4, 4]
    assert result["speed"]["per_sample"] == (option == "accum")  # accum=2's steps take twice the samples
    assert losses(tried) == losses(untried)  # every training step, bit for bit
    assert trainer.options == untried_trainer.options


def test_the_arms_start_from_the_same_state_on_the_same_batches():
    trainer, seen = make_trainer(TINY, steps=8, seed=2, trials=["5:lr_scale=1.0"], trial_steps=5)
    trainer.run()
    changed, as_it_is = trial_results(seen)[0]["arms"]
    assert changed["label"] == "lr_scale=1.0" and as_it_is["label"] == "as it is"
    assert changed["losses"] == as_it_is["losses"]  # the same option value: the same steps, bit for bit
    straight_trainer, straight = make_trainer(TINY, steps=8, seed=2)
    straight_trainer.run()
    assert as_it_is["losses"][0] == losses(straight)[4]  # an arm's first step is the training's next one


def test_a_trial_of_lr_scale_shows_the_same_memory_and_another_loss():
    trainer, seen = make_trainer(RESIDUAL_CNN, steps=4, trials=["3:lr_scale=4"], trial_steps=2)
    trainer.run()
    result = trial_results(seen)[0]
    changed, as_it_is = result["arms"]
    assert changed["activations_bytes"] == as_it_is["activations_bytes"] and changed["tensor_bytes"] == as_it_is["tensor_bytes"]
    assert changed["losses"][0] == as_it_is["losses"][0] and changed["losses"][1:] != as_it_is["losses"][1:]


def test_a_trial_of_checkpointing_shows_fewer_activation_bytes_in_the_changed_arm():
    trainer, seen = make_trainer(RESIDUAL_CNN, steps=4, trials=["3:checkpointing=on"], trial_steps=2)
    trainer.run()
    changed, as_it_is = trial_results(seen)[0]["arms"]
    assert changed["activations_bytes"] < 0.8 * as_it_is["activations_bytes"]
    assert changed["losses"] == as_it_is["losses"]  # the same numbers, less memory
    assert trainer.parts.model.checkpointing.wrapped_blocks() == []  # and it is off again


@pytest.mark.parametrize("option, value, reason", [
    ("amp", "fp16", "amp=fp16 cannot run here: fp16 needs CUDA"),
    ("world_size", "2", "a trial cannot change the world size"),
    ("clip", "-1", "clip must be a positive max grad norm"),
])
def test_a_trial_that_cannot_run_says_why_and_training_goes_on(option, value, reason):
    trainer, seen = make_trainer(TINY, steps=6, checkpoint_every=0)
    trainer.submit(TrialCommand(option, value, 3, source="test"))
    outcome = trainer.run()
    [result] = trial_results(seen)
    assert result["arms"] == [] and reason in result["error"]
    assert outcome.status == "finished" and outcome.step == 6


def test_an_arm_that_runs_out_of_memory_on_the_cpu_says_so_and_training_goes_on():
    settings = dict(steps=8, seed=3, checkpoint_every=0)
    trainer, seen = make_trainer(f"{WORKLOADS / 'tiny.py'}:out_of_memory_under_bf16", trials=["4:amp=bf16"], trial_steps=3, **settings)
    outcome = trainer.run()
    changed, as_it_is = trial_results(seen)[0]["arms"]
    assert changed["steps"] == 0 and changed["error"].startswith("out of memory: [enforce fail")
    assert "can't allocate memory" in changed["error"]
    assert as_it_is["error"] is None and len(as_it_is["losses"]) == 3
    assert outcome.status == "finished" and outcome.step == 8
    untried_trainer, untried = make_trainer(f"{WORKLOADS / 'tiny.py'}:out_of_memory_under_bf16", **settings)
    untried_trainer.run()
    assert losses(seen) == losses(untried)


def test_headless_writes_every_trial_to_trials_jsonl_and_prints_it(tmp_path, capsys):
    run = tmp_path / "run"
    assert main([TINY, "--headless", "--steps", "10", "--run-dir", str(run), "--trial", "4:amp=bf16", "--trial", "7:amp=fp16",
                 "--trial-steps", "12"]) == EXIT_OK
    first, second = [json.loads(line) for line in (run / "trials.jsonl").read_text().splitlines()]
    assert (first["step"], first["option"], first["value"], first["steps"], first["source"]) == (4, "amp", "bf16", 12, "--trial")
    assert [arm["label"] for arm in first["arms"]] == ["amp=bf16", "as it is"]
    assert all(len(arm["losses"]) == 12 and arm["median_step_time_s"] > 0 and arm["step_time_low_s"] for arm in first["arms"])
    assert all(arm["others_cpu_percent"] is None or 0 <= arm["others_cpu_percent"] <= 100 for arm in first["arms"])
    assert second["arms"] == [] and "fp16 needs CUDA" in second["error"]
    err = capsys.readouterr().err
    assert "step 4: trying amp = bf16 for 12 steps against as many as it is" in err
    assert "step 4: trial amp=bf16 from step 4, 12 steps each on the same batches: " in err and "loss " in err
    assert "step 7: trial amp=fp16 from step 7 could not run" in err


def test_a_trial_says_how_far_it_is_at_each_arms_start_and_the_journal_keeps_only_its_start_and_result(tmp_path):
    trainer, seen = make_trainer(TINY, steps=6, checkpoint_every=0, trials=["4:clip=0.5"], trial_steps=3)
    trainer.run()
    progress = seen.of("trial_progress")
    starts = [(record["arm"], record["done"]) for record in progress if record["done"] == 0]
    assert starts == [(1, 0), (2, 0)]
    assert all((record["step"], record["label"]) == (4, "clip=0.5") for record in progress)
    # K = 3 steps compared; blocks past K that time the speed (more of them on a loaded box) say the timing's cap
    assert all(record["steps"] == (timing_cap(3) if record["timing"] else 3) for record in progress)
    run = tmp_path / "run"
    assert main([TINY, "--headless", "--steps", "6", "--run-dir", str(run), "--trial", "4:clip=0.5", "--trial-steps", "3"]) == EXIT_OK
    journal = [json.loads(line)["event"] for line in (run / "events.jsonl").read_text().splitlines()]
    assert "trial_started" in journal and "trial_result" in journal and "trial_progress" not in journal


def test_the_bar_says_how_far_a_trial_is_while_it_runs():
    import io

    from rich.console import Console

    from torchlab.core.launch.headless import HeadlessProgress
    from torchlab.core.wire.protocol import TrialProgress, TrialResult

    progress = HeadlessProgress(100, Console(file=io.StringIO()))
    progress.on_event(TrialProgress(step=41, label="amp=bf16", arm=2, done=12, steps=20))
    console = Console(file=io.StringIO(), width=100, color_system=None)
    with console.capture() as captured:
        console.print(progress._live.renderable)
    assert captured.get().startswith("trying amp=bf16: as it is 12/20 ━")
    progress.on_event(TrialProgress(step=41, label="amp=bf16", arm=1, done=34, steps=100, timing=True))
    with console.capture() as captured:
        console.print(progress._live.renderable)
    assert captured.get().startswith("timing amp=bf16 34/100 ━")  # past its K steps, timing on (at most 100)
    progress.on_event(TrialResult(step=41, option="amp", value="bf16", steps=20, arms=[], error="stopped"))
    assert progress.trial is None


def test_a_bad_trial_flag_is_a_usage_error_naming_the_flag(tmp_path, capsys):
    assert main([TINY, "--headless", "--steps", "3", "--run-dir", str(tmp_path / "run"), "--trial", "4:turbo=on"]) == 2
    assert "--trial '4:turbo=on': unknown option 'turbo'" in capsys.readouterr().err


def test_the_description_reads_the_two_arms():
    from torchlab.core.wire.protocol import TrialResult

    result = TrialResult(step=40, option="checkpointing", value="on", steps=20,
                         arms=[trial_arm("checkpointing=on", 13.3, activations=100, losses=(2.5, 2.25)),
                               trial_arm("as it is", 10.0, activations=1000, losses=(2.5, 2.25))])
    assert describe_trial(result) == ["trial checkpointing=on from step 40, 20 steps each on the same batches: 1.33x slower, "
                                      "activations -90 %, memory -82 %, loss 2.3750 vs 2.3750 (mean), 2.2500 vs 2.2500 (last)"]


def test_a_trial_whose_arms_are_too_noisy_to_compare_says_how_far_apart_their_step_times_may_be():
    """The trial's line words the noise as the impact table does (one definition: ``noise_words``)."""
    from torchlab.core.wire.payloads import TrialArm
    from torchlab.core.wire.protocol import TrialResult

    def arm(label, low, median, high):
        return TrialArm(label=label, steps=20, median_step_time_s=median, step_time_low_s=low, step_time_high_s=high,
                        activations_bytes=100, tensor_bytes=200, losses=[2.5], error=None)

    result = TrialResult(step=60, option="amp", value="bf16", steps=20,
                         arms=[arm("amp=bf16", 0.17, 0.26, 0.50), arm("as it is", 0.16, 0.38, 2.03)])
    [line] = describe_trial(result)
    assert "no clear difference (step times varied up to 3.1x)" in line  # 0.50 s against 0.16 s


@pytest.mark.parametrize("neighbour", ["came", "steady"])
def test_a_trial_whose_arms_ran_under_another_load_of_other_processes_compares_no_speed(neighbour):
    """A trial's arms run one after the other: a neighbour's job that starts between them slows the second, and
    "1.33x slower" would be the machine's doing. Where the load held steady, the verdict stands."""
    from torchlab.core.wire.protocol import TrialResult

    result = TrialResult(step=40, option="amp", value="bf16", steps=20,
                         arms=[trial_arm("amp=bf16", 13.3, others=2.0),
                               trial_arm("as it is", 10.0, others=52.0 if neighbour == "came" else 4.0)])
    [line] = describe_trial(result)
    if neighbour == "came":
        assert ": speed not judged: other processes' CPU use went 52 % → 2 %, same activations" in line
    else:
        assert ": 1.33x slower, same activations" in line


def test_the_meter_counts_a_neighbours_cpu_and_not_the_runs_own(tmp_path):
    """OthersCpuMeter: this process's own work is the run's, a busy process outside its tree is a neighbour's."""
    import subprocess
    import sys
    import time

    import psutil

    from torchlab.core.engine.measure.telemetry import OthersCpuMeter

    meter = OthersCpuMeter()
    meter.start()
    spin_until = time.monotonic() + 0.5
    while time.monotonic() < spin_until:  # the run's own work: a whole core of it
        pass
    own = meter.stop()
    # A neighbour: started by a shell that exits at once, so it is no descendant of this process.
    pid_file = tmp_path / "neighbour.pid"
    spin = "import time\nt = time.time()\nwhile time.time() - t < 30: pass"
    subprocess.run(["sh", "-c", '"$0" -c "$1" & echo $! > "$2"', sys.executable, spin, str(pid_file)], check=True)
    neighbour = psutil.Process(int(pid_file.read_text()))
    try:
        meter.start()
        burned = sum(neighbour.cpu_times()[:2])
        deadline = time.monotonic() + 60
        while sum(neighbour.cpu_times()[:2]) - burned < 0.5:  # until the neighbour has burned half a CPU second
            assert time.monotonic() < deadline, "the neighbour got no CPU"
            time.sleep(0.05)
        theirs = meter.stop()
    finally:
        neighbour.kill()
    one_core = 100 / (psutil.cpu_count() or 1)
    assert own is not None and theirs is not None
    assert theirs > own + 0.3 * one_core, (own, theirs)


def test_each_arm_runs_its_k_consecutive_steps_across_its_interleaved_blocks():
    """Blocks of an arm go on from where its last block left it: the arm as it is takes, over its blocks, the very
    steps training then takes, and the changed arm those of a run changed at that step (``--at``), bit for bit."""
    settings = dict(steps=12, seed=7, checkpoint_every=0)
    trainer, seen = make_trainer(TINY, trials=["5:lr_scale=0.5"], trial_steps=7, **settings)
    trainer.run()
    changed, as_it_is = trial_results(seen)[0]["arms"]
    straight_trainer, straight = make_trainer(TINY, **settings)
    straight_trainer.run()
    assert as_it_is["losses"] == losses(straight)[4:11]  # steps 5 to 11, through 3 blocks
    changed_trainer, changed_run = make_trainer(TINY, at=["5:lr_scale=0.5"], **settings)
    changed_trainer.run()
    assert changed["losses"] == losses(changed_run)[4:11]


def test_a_trial_records_its_speed_verdict_in_trials_jsonl_and_says_it(tmp_path, capsys):
    from torchlab.core.analysis.trial_speed import speed_verdict, speed_words
    from torchlab.core.wire.payloads import TrialSpeed

    run = tmp_path / "run"
    assert main([TINY, "--headless", "--steps", "6", "--run-dir", str(run), "--trial", "4:checkpointing=on",
                 "--trial-steps", "12"]) == EXIT_OK
    [line] = [json.loads(text) for text in (run / "trials.jsonl").read_text().splitlines()]
    speed = line["speed"]
    assert set(speed) == {"ratio", "low", "high", "verdict", "pairs", "steps", "per_sample"}
    # 12 steps: 6 blocks of 2, and as many more as it took to narrow the interval (timed up to 60 steps an arm)
    assert 12 <= speed["steps"] <= 60 and speed["pairs"] == speed["steps"] // 2
    assert 0 < speed["low"] <= speed["ratio"] <= speed["high"]
    assert speed["verdict"] == speed_verdict(speed["low"], speed["high"])
    timed = f" over {speed['steps']} steps each" if speed["steps"] > 12 else ""
    assert f"step 4: trial checkpointing=on from step 4, 12 steps each on the same batches: " \
           f"{speed_words(TrialSpeed(**speed))}{timed}, " in capsys.readouterr().err
    assert len(line["arms"][0]["losses"]) == len(line["arms"][1]["losses"]) == 12  # the steps past 12 time alone


def test_an_a_a_trial_whose_interval_straddles_the_margin_names_no_direction():
    """Both arms the same code (lr_scale at the value it has), their step times a few per cent apart at random: the
    interval holds 1 and reaches past the margin, and the verdict names no direction. The step times are set (a
    seeded draw in place of the clock), so that the test says the same on any machine."""
    import dataclasses
    import random

    from torchlab.core.analysis.trial_speed import NO_CLEAR_DIFFERENCE, SPEED_MARGIN

    trainer, seen = make_trainer(TINY, steps=6, seed=2, checkpoint_every=0, trials=["4:lr_scale=1.0"], trial_steps=20)
    draws, step = random.Random(11), trainer.trials.train_step

    def jittered(plan):
        return dataclasses.replace(step(plan), step_time_s=0.010 * (1 + draws.uniform(-0.08, 0.08)))

    trainer.trials.train_step = jittered
    trainer.run()
    [result] = trial_results(seen)
    speed = result["speed"]
    assert speed["pairs"] == 10 and speed["verdict"] == NO_CLEAR_DIFFERENCE
    assert speed["low"] < 1 < speed["high"] and (speed["low"] < 1 - SPEED_MARGIN or speed["high"] > 1 + SPEED_MARGIN)
    assert result["arms"][0]["losses"] == result["arms"][1]["losses"]


def _timed_trial(times_ms, steps=10, trial_steps=10, stop_at=None):
    """A trial of lr_scale=1.0 (both arms the same code) whose steps take ``times_ms(call)`` milliseconds, the
    ``call``-th of the trial's steps counted across both arms: the clock set, so the timing rule is what is tested.
    ``stop_at``: that call's loss is NaN (raises as an arm's NaN loss does)."""
    import dataclasses

    from torchlab.core.engine.trials import TrialStopped

    trainer, seen = make_trainer(TINY, steps=steps, seed=3, checkpoint_every=0, trials=["3:lr_scale=1.0"],
                                 trial_steps=trial_steps)
    step, calls = trainer.trials.train_step, []

    def clocked(plan):
        calls.append(plan)
        if len(calls) == stop_at:
            raise TrialStopped(float("nan"))
        return dataclasses.replace(step(plan), step_time_s=times_ms(len(calls)) / 1000)

    trainer.trials.train_step = clocked
    trainer.run()
    [result] = trial_results(seen)
    return result, len(calls)


def test_a_trial_whose_pairs_leave_a_wide_interval_times_on_past_its_k_steps_until_it_is_narrow():
    """Ten steps an arm on a machine that wobbles by ±30 % step to step, then steady: the arms go on, a pair of
    blocks at a time, until the interval is within PRECISE_WIDTH; their losses are still their first ten."""
    from torchlab.core.analysis.trial_speed import PRECISE_WIDTH

    result, calls = _timed_trial(lambda call: 10 * (1.3 if call % 3 == 0 else 0.75) if call <= 20 else 10.0)
    speed = result["speed"]
    assert 10 < speed["steps"] < 50 and calls == 2 * speed["steps"]  # both arms, no step more than they timed
    assert speed["high"] <= PRECISE_WIDTH * speed["low"] and speed["pairs"] == speed["steps"] // 2
    assert [len(arm["losses"]) for arm in result["arms"]] == [10, 10] and result["error"] is None


def test_timing_stops_at_five_times_k_however_wide_the_interval_and_at_k_where_it_is_narrow_at_once():
    from torchlab.core.engine.trials import timing_cap

    draws = __import__("random").Random(5)
    wide, calls = _timed_trial(lambda call: 10 * draws.choice([0.5, 1.0, 2.0]))
    assert wide["speed"]["steps"] == timing_cap(10) == 50 and calls == 100
    steady, calls = _timed_trial(lambda call: 10.0)
    assert steady["speed"]["steps"] == 10 and calls == 20
    assert timing_cap(1) == 5 and timing_cap(40) == 100 and timing_cap(300) == 300


def test_a_nan_loss_past_the_k_steps_ends_the_timing_not_the_arm():
    """Step 13 of the changed arm (the trial's 25th step: blocks of two, A B B A ...) turns NaN: its ten compared
    steps stand, the speed rests on the pairs timed before it, and training goes on."""
    result, calls = _timed_trial(lambda call: 10 * (1.3 if call % 3 == 0 else 0.75), stop_at=25)
    assert [arm["error"] for arm in result["arms"]] == [None, None]
    assert [len(arm["losses"]) for arm in result["arms"]] == [10, 10]
    assert result["speed"] is not None and result["speed"]["pairs"] == 6 and calls == 25


def test_a_snapshots_copy_shares_nothing_training_can_change():
    """``copy_of_state`` (a trial's snapshot, at every change of arm) in place of ``copy.deepcopy``: what the
    steps change in place (tensors, the optimizer's per-parameter dicts, a numpy array) is copied, a module's
    ``_metadata`` (its state's versions, which ``load_state_dict`` reads) is kept."""
    import collections

    import numpy
    import torch

    from torchlab.core.engine.checkpointer import copy_of_state

    model = torch.nn.BatchNorm1d(3)
    weights = model.state_dict()
    optimizer_state = {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.ones(2)}},
                       "param_groups": [{"lr": 0.1, "betas": (0.9, 0.95), "params": [0]}], "extra": numpy.zeros(2)}
    copied_weights, copied_optimizer = copy_of_state(weights), copy_of_state(optimizer_state)
    weights["running_mean"].add_(1)
    optimizer_state["state"][0]["exp_avg"].add_(1)
    optimizer_state["state"][0]["step"] = torch.tensor(4.0)
    optimizer_state["param_groups"][0]["lr"] = 0.2
    optimizer_state["extra"][0] = 5
    assert torch.equal(copied_weights["running_mean"], torch.zeros(3))
    assert isinstance(copied_weights, collections.OrderedDict) and copied_weights._metadata == weights._metadata
    assert torch.equal(copied_optimizer["state"][0]["exp_avg"], torch.ones(2))
    assert copied_optimizer["state"][0]["step"].item() == 3.0 and copied_optimizer["param_groups"][0]["lr"] == 0.1
    assert copied_optimizer["extra"][0] == 0
    model.load_state_dict(copied_weights)  # as a trial's restore does


@pytest.mark.parametrize("drift, clock", [
    ("a machine slowing step by step", lambda call: 10 + 0.3 * call),
    ("a neighbour arriving a third of the way in", lambda call: 10 if call < 14 else 30),
])
def test_interleaved_arms_leave_a_load_that_drifts_over_the_trial_out_of_its_verdict(drift, clock):
    """Both arms the same code, the machine changing under them: run one after the other, the second arm would
    take all of the slowdown (3x here) and be judged slower; interleaved, each pair of blocks sees the same machine."""
    result, calls = _timed_trial(clock)
    speed = result["speed"]
    assert speed["verdict"] == "no clear difference" and speed["low"] < 1 < speed["high"], drift
    assert calls >= 20
