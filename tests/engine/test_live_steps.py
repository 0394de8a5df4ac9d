"""``steps`` as a live option (issue 15): extend or shorten a run while it trains, the schedule going on as a
resume with ``--steps`` would take it, never below the current step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainers import TINY, WORKLOADS, make_trainer
from workloads.own_training import onecycle_head_lrs
from torchlab.core.errors import EXIT_OK
from torchlab.core.launch.cli import main
from torchlab.core.records.config import ConfigError, build_config, settings_from_toml
from torchlab.core.wire.protocol import TrialCommand


def rows(run_dir: Path) -> dict[int, dict]:
    return {row["step"]: row for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def test_extending_while_it_trains_equals_resuming_with_more_steps_bit_for_bit(tmp_path):
    common = [TINY, "--headless", "--seed", "3", "--eval-every", "0", "--schedule", "onecycle"]
    live = tmp_path / "live"
    assert main([*common, "--steps", "40", "--at", "20:steps=60", "--run-dir", str(live)]) == EXIT_OK
    stopped = tmp_path / "stopped"
    assert main([*common, "--steps", "40", "--checkpoint-every", "19", "--run-dir", str(stopped)]) == EXIT_OK
    resumed = tmp_path / "resumed"
    assert main(["--resume", str(stopped / "checkpoints" / "step-0000019.pt"), "--headless", "--steps", "60",
                 "--run-dir", str(resumed)]) == EXIT_OK
    changed, extended = rows(live), rows(resumed)
    assert sorted(changed) == list(range(1, 61)) and changed[19]["steps"] == 40 and changed[20]["steps"] == 60
    assert [changed[step]["lr"] for step in range(20, 61)] == [extended[step]["lr"] for step in range(20, 61)]
    assert [changed[step]["loss"] for step in range(20, 61)] == [extended[step]["loss"] for step in range(20, 61)]


def test_the_lr_goes_on_without_a_jump_at_the_change():
    plain, seen_plain = make_trainer(TINY, steps=40, checkpoint_every=0)
    plain.run()
    longer, seen_longer = make_trainer(TINY, steps=40, checkpoint_every=0, at=["20:steps=80"])
    longer.run()
    assert [seen_longer.at(step).lr for step in range(1, 21)] == [seen_plain.at(step).lr for step in range(1, 21)]
    assert seen_longer.metrics[-1].step == 80
    before, at_change, after = (seen_longer.at(step).lr for step in (19, 20, 21))
    assert before > at_change > after and (before - at_change) > (at_change - after)  # slower decay from here


def test_shortening_ends_the_run_there_with_its_final_checkpoint_and_never_below_the_step(tmp_path):
    trainer, seen = make_trainer(TINY, steps=40, checkpoint_every=0, checkpoint_dir=tmp_path, at=["10:steps=15"])
    outcome = trainer.run()
    assert not seen.of("option_refused")  # 3 before the first step is a run of 3 steps, replaced by --at 10 later
    assert outcome.status == "finished" and outcome.step == 15 and seen.metrics[-1].step == 15
    assert [event["step"] for event in seen.of("checkpoint")] == [15]


def test_a_total_below_the_current_step_is_refused_with_the_step():
    trainer, seen = make_trainer(TINY, steps=12, checkpoint_every=0, at=["9:steps=5"])
    trainer.run()
    [refused] = seen.of("option_refused")
    assert refused["reason"] == "the run is at step 8 already: train to step 8 or later"
    assert seen.metrics[-1].step == 12


def test_a_workloads_own_scheduler_is_built_again_for_the_new_total():
    """OneCycleLR raises once stepped past its total: extended live, it is the factory's for the new total."""
    trainer, seen = make_trainer(f"{WORKLOADS / 'own_training.py'}:onecycle", steps=10, checkpoint_every=0, at=["6:steps=20"])
    assert trainer.run().step == 20
    planned = onecycle_head_lrs(20)
    assert [seen.at(step).lrs["head"] for step in range(6, 21)] == pytest.approx(planned[5:], rel=1e-9)


def test_where_a_workloads_own_scheduler_moves_the_lr_at_the_change_the_acknowledgement_says_so():
    """Seen with a HuggingFace GPT-2's cosine over 3,000 steps cut to 150 at step 119: the LR fell from 1.0e-03 to
    1.0e-04 at the change while the prompt promised no jump, and nothing said so."""
    own = f"{WORKLOADS / 'own_training.py'}:workload"
    unchanged, seen_unchanged = make_trainer(own, steps=40, checkpoint_every=0)
    unchanged.run()
    trainer, seen = make_trainer(own, steps=40, checkpoint_every=0, at=["20:steps=22"])
    trainer.run()
    [event] = [event for event in seen.of("option_applied") if event["option"] == "steps"]
    planned, moved = seen_unchanged.at(20).lrs["body"], seen.at(20).lrs["body"]
    assert moved < planned / 2  # the cosine planned for 22 steps is near its end at step 20
    assert event["detail"] == f"the workload's scheduler, built for 22 steps, moves the LR (group body) {planned:.1e} → {moved:.1e}"


def test_torchlabs_own_schedule_goes_on_without_a_word_about_the_lr():
    trainer, seen = make_trainer(TINY, steps=40, checkpoint_every=0, at=["20:steps=80"])
    trainer.run()
    [event] = [event for event in seen.of("option_applied") if event["option"] == "steps"]
    assert not event["detail"]


def test_a_trial_of_steps_is_refused():
    trainer, seen = make_trainer(TINY, steps=4, checkpoint_every=0)
    trainer.submit(TrialCommand("steps", 100, 2, source="test"))
    trainer.run()
    [result] = seen.of("trial_result")
    assert result["error"].startswith("a trial cannot change the run's length")


def test_steps_is_a_setting_at_the_top_level_of_a_toml_file_not_an_option():
    config = build_config(settings_from_toml("steps = 70\n", "f.toml"))
    assert config.steps == config.options.steps == 70
    assert "[options]" in config.to_toml() and "\nsteps = 70\n" in config.to_toml()
    assert config.to_toml().count("steps = 70") == 1
    with pytest.raises(ConfigError, match=r"options.steps is set at the top level, as steps = \.\.\., not in \[options\]"):
        settings_from_toml("[options]\nsteps = 70\n", "f.toml")
