"""OOM rescue (core/engine/guards/oom_rescue.py): a step out of memory is retried one rung down, and the run goes on."""

from __future__ import annotations

import json
import re

import pytest
import torch

from trainers import WORKLOADS, make_trainer
from torchlab.core.errors import EXIT_OK
from torchlab.core.launch.cli import main
from torchlab.core.units import format_bytes

TINY = WORKLOADS / "tiny.py"


def test_a_model_out_of_memory_above_half_its_batch_trains_to_the_end_with_the_losses_of_one_without_the_limit():
    """Batches of 16, any forward of more than 8 out of memory: step 1 is retried with split = 2 (8 and 8), which
    stays; every step's loss is the unlimited model's, to float rounding."""
    settings = dict(steps=6, seed=3, checkpoint_every=0)
    rescued, seen = make_trainer(f"{TINY}:out_of_memory_above_8", **settings)
    assert rescued.run().status == "finished"
    [event] = seen.of("oom_rescued")
    assert (event["step"], event["option"], event["value"], event["previous"]) == (1, "split", 2, 1)
    assert (event["samples_before"], event["samples_after"]) == (16, 8)
    assert event["error"] == "CUDA out of memory. Tried to allocate 2.00 GiB for 16 samples"
    assert event["note"].startswith("predicted peak ") and event["note"].endswith(" this process can reach")
    assert [row.options.split for row in seen.metrics] == [2] * 6  # step 1's row says what it trained with
    unlimited, plain = make_trainer(f"{TINY}:without_dropout", **settings)
    unlimited.run()
    assert [row.loss for row in seen.metrics] == pytest.approx([row.loss for row in plain.metrics], rel=1e-5)


def test_a_retry_draws_the_random_numbers_of_the_step_run_at_the_rungs_value_from_the_start():
    """The failed forward drew its dropout masks before it ran out of memory: the retry draws them again from where
    the step began, so the rescued run is the run at split = 2 from its first step, bit for bit."""
    settings = dict(steps=4, seed=3, checkpoint_every=0)
    rescued, seen = make_trainer(f"{TINY}:out_of_memory_above_8_after_dropout", **settings)
    assert rescued.run().status == "finished" and len(seen.of("oom_rescued")) == 1
    split_from_the_start, plain = make_trainer(f"{TINY}:dropout_within_memory", options={"split": 2}, **settings)
    split_from_the_start.run()
    assert [row.loss for row in seen.metrics] == [row.loss for row in plain.metrics]


def test_with_every_rung_tried_the_run_stops_with_a_paragraph_saying_what_was_tried(tmp_path, capsys):
    run = tmp_path / "run"
    assert main([f"{TINY}:out_of_memory_always", "--headless", "--steps", "3", "--run-dir", str(run)]) != EXIT_OK
    err = capsys.readouterr().err
    rescued = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()
               if json.loads(line)["event"] == "oom_rescued"]
    # every split predicted out of memory (the model's own forward refuses any size): 1 → 16 (pieces of one sample)
    # at once, then checkpointing, then the stop; one rung at a time it took five
    assert [(event["option"], event["value"]) for event in rescued] == [("split", 16), ("checkpointing", True)]
    assert rescued[0]["note"].startswith("none predicted to fit in the ")
    assert "split = 2 (the model ran out of memory on fake tensors)" in rescued[0]["note"]
    assert "step 1 ran out of memory (CUDA out of memory." in err and "retried with split = 16 (was 1)" in err
    assert "Step 1 ran out of memory" in err and "with split = 16 (pieces of one sample: the batch has 16) and " \
        "checkpointing = on: the OOM rescue has no rung left" in err
    assert "Memory by kind: parameters 3.82 KiB, optimizer state 0 B." in " ".join(err.split())  # no AdamW step yet


def test_the_split_taken_is_the_first_the_forecast_predicts_to_fit_passing_over_those_it_does_not(monkeypatch):
    """The memory this process can reach set between split 2's predicted peak and split 4's: the rescue goes from 1 to
    4 at once (split 2 would have fit the model's own limit, but not the memory), and says why."""
    from torchlab.core.engine.adapters.loading import load_workload
    from torchlab.core.engine.forecast.capacity import FITS_SHARE
    from torchlab.core.engine.forecast.for_workload import workload_forecast
    from torchlab.core.engine.forecast.step_shape import StepShape
    from torchlab.core.engine.guards import rescue_forecast
    from torchlab.core.records.config import build_config

    spec = f"{TINY}:out_of_memory_above_8"
    forecast = workload_forecast(load_workload(spec), build_config({}, {"workload": spec}), torch.device("cpu"))
    two, four = (forecast.predict(StepShape(batch_size=16, split=split)).peak_bytes for split in (2, 4))
    assert four < two
    monkeypatch.setattr(rescue_forecast, "reachable_memory", lambda parts: int((two + four) / 2 / FITS_SHARE))
    trainer, seen = make_trainer(spec, steps=3, checkpoint_every=0)
    assert trainer.run().status == "finished"
    [event] = seen.of("oom_rescued")
    assert (event["option"], event["value"], event["previous"]) == ("split", 4, 1)
    assert event["note"].startswith("predicted peak ") and event["note"].endswith(
        f"this process can reach; passed over: split = 2 ({format_bytes(two)}, over 90 %)")
    assert [row.options.split for row in seen.metrics] == [4, 4, 4]


def test_with_the_rescue_off_an_out_of_memory_step_stops_the_run_as_it_did():
    trainer, seen = make_trainer(f"{TINY}:out_of_memory_above_8", steps=3, checkpoint_every=0,
                                 options={"oom_rescue": False})
    assert trainer.run().status == "failed"
    assert not seen.of("oom_rescued") and not seen.metrics


def test_a_split_says_that_the_models_batch_norm_now_sees_each_pieces_statistics():
    trainer, seen = make_trainer(f"{TINY}:out_of_memory_above_8_with_batch_norm", steps=2, checkpoint_every=0)
    assert trainer.run().status == "finished"
    [event] = seen.of("oom_rescued")
    assert event["note"].startswith("1 BatchNorm layer now sees each piece's statistics, not the batch's; predicted peak ")


# ---------------------------------------------------------------------- with ranks: their supervisor's decision

def supervisor_at(tmp_path, step: int, checkpoint_step: int | None, batch_norm_layers: int = 0, rung_to_fit=None,
                  **options):
    """The OOM rescue of a supervisor of 2 ranks as rank 0's reports left it at ``step``: batch 16 (8 a rank), blocks
    to checkpoint, and a checkpoint of ``checkpoint_step`` where given; its ``_rescue_from`` decides on a failure."""
    from torchlab.core.engine.ranks.rescue import RankRescue
    from torchlab.core.wire.events import RunStarted
    from torchlab.core.options import LiveOptions
    from torchlab.core.wire.protocol import CheckpointSaved

    rescue = RankRescue(resume_from=None, rung_to_fit=rung_to_fit)
    in_force = LiveOptions(world_size=2, **options).as_dict()
    rescue.observe(RunStarted(step=0, device="cpu", batch_size=16, steps=200, options=in_force, modules=[],
                              module_params=[], checkpoint_blocks=["body.0"], world_size=2, ranks=None,
                              batch_norm_layers=batch_norm_layers))
    if checkpoint_step is not None:
        rescue.observe(CheckpointSaved(step=checkpoint_step, path=str(tmp_path / "step.pt")))

    class At:
        rescue = None

        def _rescue_from(self, rank: int, message: str):
            return rescue.rescue_from(rank, message, step=step + 1, world_size=2)

    at = At()
    at.rescue = rescue
    return at


OOM = "rank 1 failed: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\nmore"


def test_with_ranks_a_rank_out_of_memory_at_the_first_step_starts_them_again_from_the_start_one_rung_down(tmp_path):
    rescue = supervisor_at(tmp_path, step=0, checkpoint_step=None)._rescue_from(1, OOM)
    assert rescue.resume is None and rescue.options.split == 2 and rescue.options.world_size == 2
    assert (rescue.event.step, rescue.event.option, rescue.event.error) == (1, "split", "CUDA out of memory. Tried to allocate 2.00 GiB")
    assert rescue.event.note == "on rank 1 of 2: the ranks start again from the start, with the options in force at step 1"
    assert (rescue.event.samples_before, rescue.event.samples_after) == (8, 4)  # a rank's 8 of the batch of 16
    with_batch_norm = supervisor_at(tmp_path, step=0, checkpoint_step=None, batch_norm_layers=2)._rescue_from(1, OOM)
    assert with_batch_norm.event.note.endswith("step 1; 2 BatchNorm layers now see each piece's statistics, not the batch's")


def test_with_ranks_the_split_taken_is_the_one_the_runs_forecaster_predicts_to_fit(tmp_path):
    """The supervisor holds no model: it asks the run's forecaster (``Forecaster.rung_to_fit``, whose process the
    ranks' process test runs) which rung from the ladder's next on fits a rank, and takes it, saying so."""
    asked = []

    def rung_to_fit(options, option, values, world_size):
        asked.append((options.split, option.name, values, world_size))
        return 8, "predicted peak 5.2 GiB of the 8 GiB each of 2 ranks has; passed over: split = 2 (9.1 GiB, over 90 %), split = 4 (7.3 GiB, over 90 %)"

    rescue = supervisor_at(tmp_path, step=0, checkpoint_step=None, rung_to_fit=rung_to_fit)._rescue_from(1, OOM)
    assert asked == [(1, "split", [2, 4, 8], 2)] and rescue.options.split == 8
    assert rescue.event.note.endswith("step 1; predicted peak 5.2 GiB of the 8 GiB each of 2 ranks has; passed over: "
                                      "split = 2 (9.1 GiB, over 90 %), split = 4 (7.3 GiB, over 90 %)")
    assert (rescue.event.samples_before, rescue.event.samples_after) == (8, 1)


def test_with_ranks_the_rungs_go_on_to_checkpointing_and_then_stop_with_the_paragraph(tmp_path):
    rescue = supervisor_at(tmp_path, step=9, checkpoint_step=5, split=8)._rescue_from(0, OOM)
    assert (rescue.event.option, rescue.event.value, rescue.resume.name) == ("checkpointing", True, "step.pt")
    assert "(steps 6-9 train again)" in rescue.event.note
    said = supervisor_at(tmp_path, step=9, checkpoint_step=5, split=8, checkpointing=True)._rescue_from(0, OOM)
    assert "the OOM rescue has no rung left" in said and "pieces of one sample: the batch has 8" in said


def test_with_ranks_the_checkpointing_rung_takes_the_blocks_rank_0_measured_saving_most_and_the_stop_says_memory(tmp_path):
    """The supervisor holds no tensor, but rank 0's rows carry memory by kind: it ranks the blocks by them, as one
    process does, and its last paragraph says the memory as last measured."""
    from metrics_rows import metrics_row

    from torchlab.core.engine.ranks.rescue import RankRescue
    from torchlab.core.wire.events import RunStarted
    from torchlab.core.options import LiveOptions
    from torchlab.core.wire.payloads import MemoryBreakdown, ModuleBytes

    blocks = [f"blocks.{index}" for index in range(4)]
    measured = MemoryBreakdown(step=6, parameters_bytes=4096, gradients_bytes=4096, optimizer_bytes=8192,
                               activations_bytes=7000, allocator_peak_bytes=None,
                               by_module=[ModuleBytes("blocks.2.mlp", 4000), ModuleBytes("blocks.0.attn", 2000),
                                          ModuleBytes("blocks.2", 500), ModuleBytes("head", 500)])

    def supervisor(**options):
        rescue = RankRescue(resume_from=tmp_path / "step.pt")
        rescue.observe(RunStarted(step=4, device="cpu", batch_size=16, steps=200, modules=[], module_params=[],
                                  options=LiveOptions(world_size=2, split=8, **options).as_dict(),
                                  checkpoint_blocks=blocks, world_size=2, ranks=None))
        rescue.observe_row(metrics_row(6, memory=measured))
        rescue.observe_row(metrics_row(7))  # a row without a measurement leaves the last one
        return rescue

    rescue = supervisor().rescue_from(1, OOM, step=9, world_size=2)
    assert (rescue.event.option, rescue.event.value) == ("checkpointing", "blocks.2")
    assert rescue.event.note.endswith("the 1 of 4 blocks that saved the most activations at step 6 (blocks.2 4.39 KiB)")
    said = supervisor(checkpointing=True).rescue_from(1, OOM, step=9, world_size=2)
    assert said.endswith("Memory by kind at step 6 (the last measured, rank 0): parameters 4 KiB, gradients 4 KiB, "
                         "optimizer state 8 KiB, activations saved for backward 6.84 KiB.")


def test_with_ranks_a_split_the_ranks_refused_at_their_start_is_followed_by_the_checkpointing_rung(tmp_path):
    """A batch of the user's own type cannot be split; the supervisor, which never sees a batch, learns it when the
    ranks started again at split = 2 end at their start with the refusal: the same failure, the next rung."""
    supervisor = supervisor_at(tmp_path, step=4, checkpoint_step=3)
    first = supervisor._rescue_from(1, OOM)
    assert first.options.split == 2
    again = supervisor.rescue.split_refused()
    assert (again.event.step, again.event.option, again.event.value, again.event.previous) == (5, "checkpointing", True, False)
    assert again.options.split == 1 and again.event.samples_before is None
    assert again.event.note.endswith("this run's batches cannot be split (the ranks refused split = 2 at their start)")
    assert supervisor.rescue.split_refused() is None  # once: a usage error after that is the run's own


def test_with_ranks_no_rescue_is_made_that_cannot_hold(tmp_path):
    without_checkpoint = supervisor_at(tmp_path, step=4, checkpoint_step=None)
    assert "--checkpoint-every N" in without_checkpoint._rescue_from(1, OOM)
    supervisor = supervisor_at(tmp_path, step=4, checkpoint_step=3)
    assert supervisor._rescue_from(1, OOM).options.split == 2
    assert "something set it back" in supervisor._rescue_from(1, OOM)  # the same step, the same rung again
    assert supervisor_at(tmp_path, step=4, checkpoint_step=3)._rescue_from(1, "rank 1 failed: RuntimeError: boom") == ""
    off = supervisor_at(tmp_path, step=4, checkpoint_step=3, oom_rescue=False)
    assert off._rescue_from(1, OOM) == ""
    trial = "rank 1 failed: TrialOutOfMemory: out of memory in a trial's arm (DefaultCPUAllocator: can't allocate memory)"
    assert supervisor_at(tmp_path, step=4, checkpoint_step=3)._rescue_from(1, trial) == ""


def test_checkpointing_rungs_take_the_blocks_that_saved_the_most_activations_first_and_a_resume_keeps_them(tmp_path):
    """Measured at steps 1 and 2, blocks.1 saves the most, then blocks.3; step 3 runs out of memory with fewer than
    two blocks checkpointed: after the last split (every split predicted out of memory: the model's own refusal, which
    its forward gives on fake tensors too), half the blocks (blocks.1, blocks.3) at once, a quarter (blocks.1) being
    predicted out of memory too: one failed attempt fewer than rung by rung."""
    spec = f"{TINY}:out_of_memory_until_two_blocks_are_checkpointed"
    trainer, seen = make_trainer(spec, steps=4, memory_every=1, checkpoint_dir=tmp_path)
    assert trainer.run().status == "finished"
    rungs = [(event["step"], event["option"], event["value"]) for event in seen.of("oom_rescued")]
    assert rungs == [(3, "split", 4), (3, "checkpointing", "blocks.1,blocks.3")]
    note = seen.of("oom_rescued")[1]["note"]
    assert note.startswith("the 2 of 4 blocks that saved the most activations at step 2 (blocks.1 ")
    assert re.search(r"; predicted peak [0-9.]+ KiB of the [0-9.]+ GiB this process can reach; passed over: "
                     r"checkpointing = 1 block \(the model ran out of memory on fake tensors\)$", note), note
    assert [row.options.checkpointing for row in seen.metrics][2:] == ["blocks.1,blocks.3"] * 2
    resumed, _ = make_trainer(spec, steps=6, memory_every=1, resume_from=tmp_path / "last.pt")
    assert resumed.parts.model.checkpointing.wrapped_names() == ["blocks.1", "blocks.3"]
    assert resumed.run().status == "finished"


def test_a_batch_the_engine_cannot_split_goes_to_checkpointing_saying_why():
    trainer, seen = make_trainer(f"{TINY}:out_of_memory_until_two_blocks_are_checkpointed_with_batches_of_its_own_type",
                                 steps=4, memory_every=1, checkpoint_every=0)
    assert trainer.run().status == "finished"
    first, second = seen.of("oom_rescued")
    assert [(event["option"], event["value"]) for event in (first, second)] == [
        ("checkpointing", "blocks.1"), ("checkpointing", "blocks.1,blocks.3")]
    assert first["note"].startswith("this run's batches cannot be split (no first dimension their tensors share); "
                                    "the 1 of 4 blocks that saved the most activations at step 2")
    assert first["note"].endswith("; not predicted (the batch is an object of the workload's own type, whose tensors "
                                  "the forecast cannot reach to make them fake; a dict, list, tuple or dataclass of "
                                  "tensors it can)")  # the ladder one rung at a time, as before the forecast
    assert first["samples_before"] is None and first["samples_after"] is None


def test_the_ladder_below_splits_checkpoints_a_quarter_of_the_blocks_then_half_then_all_or_all_at_once_unmeasured():
    from torchlab.core.engine.guards.oom_rescue import rung_after
    from torchlab.core.options import LiveOptions

    blocks = [f"layer.{index}" for index in range(8)]
    saved = {name: 100 + 10 * index for index, name in enumerate(blocks)}  # the last saves the most
    options, values = LiveOptions(split=4), []
    while (rung := rung_after(options, 4, blocks, saved)) is not None:
        values.append(rung[1])
        options = options.with_value(rung[0].name, rung[1])
    assert values == ["layer.7,layer.6", "layer.7,layer.6,layer.5,layer.4", True]
    assert rung_after(LiveOptions(split=4), 4, blocks, None)[1] is True
    assert rung_after(LiveOptions(split=4), 4, [], saved) is None
