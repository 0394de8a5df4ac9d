"""A transformers Trainer trained as it is (core/engine/adapters/from_transformers.py): its model's loss or its own
compute_loss, its optimizer and schedule, TrainingArguments as the run's starting settings (which flags still
override), the live options on it, a resume; what the engine cannot honour refused with the reason."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from trainers import WORKLOADS, make_trainer  # noqa: E402
from torchlab.core.engine.adapters.loading import load_workload  # noqa: E402
from torchlab.core.engine.seeding import seed_everything  # noqa: E402
from torchlab.core.errors import EXIT_OK, WorkloadError  # noqa: E402
from torchlab.core.launch.cli import main  # noqa: E402

HF = WORKLOADS / "hf_trainer.py"


def hf_trainer_module():
    """The workload file as a module of the test's own (a workload file is imported afresh for each run)."""
    spec = importlib.util.spec_from_file_location("hf_trainer_reference", HF)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def linear_with_warmup(step: int, total: int, warmup: int = 3, peak: float = 3e-3) -> float:
    """The LR transformers' "linear" schedule gives the optimizer step ``step`` (1, 2, ...)."""
    done = step - 1
    return peak * (done / warmup if done < warmup else max(0.0, (total - done) / (total - warmup)))


def test_the_engine_trains_a_trainer_to_the_weights_of_its_own_train(tmp_path):
    """One sequence in every sample (the batches' order cannot matter): each step's loss is the one trainer.train()
    computes, its grad norm the one it logs (to 4 figures), the LRs are its linear schedule's, and after 12 steps of
    accumulation 2, clipping at 1.0, AdamW with weight decay on all but biases and norms the weights are its own.
    The loss is transformers' own figure: the labels' losses over the count it makes of the step's labels (here
    unshifted, so 15/16 of their mean: the model's loss_type is not set), which the engine reproduces."""
    seed_everything(0)
    theirs = hf_trainer_module().one_sequence()
    theirs.args.output_dir = str(tmp_path / "hf")
    losses = []
    compute_loss = theirs.compute_loss

    def recorded(model, inputs, **kwargs):
        loss = compute_loss(model, inputs, **kwargs)
        losses.append(loss.item())
        return loss

    theirs.compute_loss = recorded
    theirs.train()
    logged = [entry for entry in theirs.state.log_history if "loss" in entry]
    trainer, seen = make_trainer(f"{HF}:one_sequence")
    trainer.run()
    rows = seen.metrics
    assert [row.step for row in rows] == list(range(1, 13)) and len(losses) == 24
    assert [row.loss for row in rows] == pytest.approx([a + b for a, b in zip(losses[::2], losses[1::2])], rel=1e-5)
    assert [row.grad_norm_total for row in rows] == pytest.approx([float(entry["grad_norm"]) for entry in logged], rel=1e-3)
    assert [row.lrs["decay"] for row in rows] == pytest.approx([linear_with_warmup(step, 12) for step in range(1, 13)])
    ours = trainer.model.state_dict()
    for name, weight in theirs.model.state_dict().items():
        assert ours[name].float() == pytest.approx(weight.float(), abs=1e-5), name
    assert rows[-1].loss < rows[0].loss - 0.5


def test_training_arguments_are_the_runs_starting_settings_where_no_flag_gives_one():
    trainer, seen = make_trainer(f"{HF}:workload", options={"accum": "1"}, explicit={"accum"})
    config, options = trainer.config, trainer.options
    assert (config.steps, config.batch_size, config.eval_every) == (12, 4, 4)
    assert (options.accum, options.clip, options.amp, options.checkpointing) == (1, 1.0, "off", False)  # --accum 1 wins
    assert trainer.workload_settings == {"steps": 12, "batch_size": 4, "clip": 1.0, "eval_every": 4}
    assert seen.of("log")[0]["text"] == "the workload's own starting values: steps 12, batch_size 4, clip 1.0, eval_every 4"
    assert trainer.parts.from_workload.groups == ("decay", "no_decay")
    epochs = load_workload(f"{HF}:by_epochs").settings  # 100 samples, batches of 8 (12 whole), accumulation 2: 6 a epoch
    assert (epochs["steps"], epochs["eval_every"], epochs["batch_size"]) == (12, 6, 8)
    both = load_workload(f"{HF}:bf16_checkpointed").settings
    assert (both["amp"], both["checkpointing"]) == ("bf16", True)


def test_its_own_compute_loss_is_the_loss_and_the_trainers_state_says_where_the_run_is():
    trainer, seen = make_trainer(f"{HF}:own_compute_loss", steps=2, explicit={"steps"})
    trainer.run()
    theirs = trainer.parts.workload.loss_fn.__self__.trainer
    assert type(theirs).steps_seen == [0, 0, 1, 1]  # two micro-batches a step: global_step before each
    assert [row.step for row in seen.metrics] == [1, 2] and not seen.of("error")


def test_amp_and_checkpointing_change_live_on_a_transformers_model():
    trainer, seen = make_trainer(f"{HF}:workload", steps=6, explicit={"steps"}, at=["3:amp=bf16", "4:checkpointing=on"])
    trainer.run()
    rows = seen.metrics
    assert [(row.options.amp, row.options.checkpointing) for row in rows] == (
        [("off", False)] * 2 + [("bf16", False)] + [("bf16", True)] * 3)
    assert list(trainer.parts.model.checkpointing.blocks) == ["transformer.h.0", "transformer.h.1"]
    assert all(math.isfinite(row.loss) for row in rows) and rows[-1].loss < rows[0].loss


@pytest.mark.parametrize("factory", ["seq2seq", "plain_workload"])
def test_checkpointing_a_t5s_blocks_recomputes_what_their_forward_saved(factory):
    """A T5's decoder keeps a copy of the model's config: with use_cache on there, the cross-attention cache filled in
    the forward made the recomputation save 52 tensors where the forward saved 56 (CheckpointError). The adapter
    turns every config's use_cache off; in a plain Workload, checkpointing calls a block without its cache, as
    transformers' own checkpointing does."""
    settings = {"steps": 6, "explicit": {"steps"}}
    plain, seen_plain = make_trainer(f"{HF}:{factory}", **settings)
    plain.run()
    checkpointed, seen = make_trainer(f"{HF}:{factory}", at=["3:checkpointing=on"], **settings)
    checkpointed.run()
    assert "decoder.block.0" in checkpointed.parts.model.checkpointing.blocks
    assert [row.options.checkpointing for row in seen.metrics] == [False] * 2 + [True] * 4
    assert [row.loss for row in seen.metrics] == pytest.approx([row.loss for row in seen_plain.metrics], rel=1e-5)


def test_config_toml_records_training_arguments_and_a_resume_keeps_them_and_says_what_changed_since(tmp_path, monkeypatch,
                                                                                                    capsys):
    """Headless, as a user runs it: config.toml records TrainingArguments' values and says they are the workload's;
    resumed with --steps 12 alone, accumulation, clipping and the batch are the run's (its checkpoint's
    configuration), the schedule is the Trainer's made again for 12 steps at step 8, and TrainingArguments edited
    since (accumulation 4) are said, not taken."""
    run = tmp_path / "run"
    assert main([f"{HF}:workload", "--headless", "--run-dir", str(run), "--steps", "8", "--telemetry-interval", "0"]) == EXIT_OK
    config = (run / "config.toml").read_text()
    assert ("# the workload's own starting values, where neither the command line nor --config gave one: batch_size, "
            "accum, clip, eval_every\n") in config
    assert "steps = 8\nbatch_size = 4\n" in config and "accum = 2\n" in config and "clip = 1.0\n" in config
    assert 'groups = ["decay", "no_decay"]' in config
    monkeypatch.setenv("TORCHLAB_TEST_ACCUM", "4")
    capsys.readouterr()
    assert main(["--resume", str(run), "--headless", "--steps", "12", "--telemetry-interval", "0"]) == EXIT_OK
    said = capsys.readouterr().err
    assert ("the workload's own starting values differ from the run's: accum 4 (the run's: 2). A resume keeps the "
            "run's; to take the workload's, resume with --accum 4") in " ".join(said.split())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(row["step"], row["accum"], row["clip"]) for row in rows[8:]] == [(step, 2, 1.0) for step in range(9, 13)]
    assert [row["lrs"]["decay"] for row in rows[8:]] == pytest.approx([linear_with_warmup(step, 12) for step in range(9, 13)])


def test_an_optimizer_and_scheduler_given_to_the_trainer_train_and_a_new_total_is_refused_saying_why():
    trainer, seen = make_trainer(f"{HF}:given_optimizer_and_scheduler", at=["4:steps=20"])
    trainer.run()
    rows = seen.metrics
    assert [row.step for row in rows] == list(range(1, 13)) and trainer.parts.from_workload.optimizer == "torch.optim.SGD"
    assert [row.lr for row in rows][:2] == pytest.approx([0.05, 0.05 * (1 - 0.9 / 12)])
    refused = seen.of("option_refused")
    assert [(event["option"], event["step"]) for event in refused] == [("steps", 4)]
    assert "the Trainer was given its scheduler (optimizers=(optimizer, scheduler))" in refused[0]["reason"]


@pytest.mark.parametrize("factory, said", [
    ("overrides_training_step", "overrides training_step(), which the engine does not call"),
    ("early_stopping", "has callbacks the engine does not call (EarlyStoppingCallback)"),
])
def test_what_the_engine_cannot_honour_is_refused_naming_it(factory, said):
    with pytest.raises(WorkloadError, match=said.replace("(", r"\(").replace(")", r"\)")):
        load_workload(f"{HF}:{factory}")
