"""The live-option registry: every option's flag, key, prompt, panel row, palette entry and trainer hook
come from its one object in core/options.py, so none can be missing or disagree with another."""

from __future__ import annotations

import pytest

from torchlab.core.engine.option_hooks import _ENACT_HOOKS
from torchlab.core.launch.arguments import build_parser, resolve_config
from torchlab.core.wire import protocol as p
from torchlab.core.options import CHECKPOINTING, LIVE_OPTIONS, OPTION_NAMES, Choice, LiveOptions, Number, OptionChangeError, Switch
from torchlab.tui.app_keys import KEY_ACTIONS

#: A value each option accepts that is not its default, as typed on a command line, and its parsed form.
TYPED = {"amp": ("bf16", "bf16"), "checkpointing": (None, True), "clip": ("0.5", 0.5), "accum": ("4", 4), "split": ("2", 2), "oom_rescue": (None, False),
         "spike_guard": ("rollback", "rollback"), "lr_scale": ("0.25", 0.25), "world_size": ("2", 2), "parallel": ("fsdp", "fsdp"), "compile": (None, True), "dynamic": ("on", "on"), "workers": ("2", 2),
         "pin_memory": (None, True), "steps": ("500", 500)}


def test_a_setting_given_in_the_config_file_or_as_a_flag_is_explicit(tmp_path) -> None:
    """What a workload's own starting values may not replace (Workload.settings): a file's settings and options, and
    the flags', and nothing the user left to its default."""
    file = tmp_path / "run.toml"
    file.write_text('lr = 0.01\n[options]\nclip = 1.0\n')
    _, explicit = resolve_config(build_parser().parse_args(["mlp", "--config", str(file), "--steps", "9", "--accum", "2"]))
    assert explicit == {"lr", "clip", "steps", "accum"}
    _, explicit = resolve_config(build_parser().parse_args(["mlp"]))
    assert explicit == set()


def test_the_examples_cover_every_option() -> None:
    assert set(TYPED) == set(OPTION_NAMES)


@pytest.mark.parametrize("option", LIVE_OPTIONS, ids=lambda o: o.name)
def test_each_option_has_a_flag_that_sets_it(option) -> None:
    text, value = TYPED[option.name]
    typed = option.flag_arguments(value) if isinstance(option, Switch) else [option.flag, text]  # --no-oom-rescue
    args = build_parser().parse_args(["mlp", *typed])
    config, explicit = resolve_config(args)
    # A setting's flag (--steps) sets the setting, which the option starts from: given, by the setting's name.
    assert getattr(config.options, option.name) == value and explicit == {option.name}
    assert getattr(LiveOptions(), option.name) == option.default


@pytest.mark.parametrize("option", LIVE_OPTIONS, ids=lambda o: o.name)
def test_the_words_that_set_an_option_on_a_command_line_read_back_as_its_value(option) -> None:
    """What the app passes to the trainer it restarts with options set on the error screen."""
    for value in (TYPED[option.name][1], option.default):
        words = option.flag_arguments(value)  # none for a switch's auto: the flag not given
        config, explicit = resolve_config(build_parser().parse_args(["mlp", *words]))
        assert getattr(config.options, option.name) == value
        assert explicit == (set() if not words else {option.name})


@pytest.mark.parametrize("option", LIVE_OPTIONS, ids=lambda o: o.name)
def test_each_option_has_its_key_and_the_trainer_a_hook(option) -> None:
    keys = {key.key: key for key in KEY_ACTIONS}
    assert keys[option.key].action == f"change_option('{option.name}')"
    assert keys[option.key].help == option.help
    assert option.name in _ENACT_HOOKS


def test_no_two_options_share_a_key_and_no_option_takes_another_actions_key() -> None:
    keys = [key.key for key in KEY_ACTIONS]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize("option", LIVE_OPTIONS, ids=lambda o: o.name)
def test_what_an_option_shows_reads_back_as_the_same_value(option) -> None:
    _, value = TYPED[option.name]
    assert option.parse(option.format(value)) == value
    assert option.parse(option.format(option.default)) == option.default


def test_checkpointing_takes_block_names_as_one_text_and_its_key_turns_them_off() -> None:
    """Some of the blocks (the OOM rescue's rungs): a comma-separated text, a JSON scalar wherever options travel."""
    chosen = CHECKPOINTING.parse(" layer.3, layer.1 ,layer.3")
    assert chosen == "layer.3,layer.1" and CHECKPOINTING.parse(["layer.3", "layer.1"]) == chosen  # a TOML array
    assert CHECKPOINTING.names(chosen) == ["layer.3", "layer.1"] and CHECKPOINTING.names(True) is None
    assert CHECKPOINTING.brief(chosen) == "2 blocks" and CHECKPOINTING.format(chosen) == chosen
    assert CHECKPOINTING.parse("1") is True and CHECKPOINTING.next_value(chosen, lambda value: False) is False
    config, _ = resolve_config(build_parser().parse_args(["mlp", *CHECKPOINTING.flag_arguments(chosen)]))
    assert config.options.checkpointing == chosen
    with pytest.raises(OptionChangeError, match="block names separated by commas"):
        CHECKPOINTING.parse("layer.1,,layer.2")


def test_a_mode_cycles_past_what_this_run_refused_and_a_switch_toggles() -> None:
    amp = next(o for o in LIVE_OPTIONS if isinstance(o, Choice))
    assert amp.next_value("off", lambda mode: False) == "bf16"
    assert amp.next_value("bf16", lambda mode: mode == "fp16") == "off"
    switch = next(o for o in LIVE_OPTIONS if isinstance(o, Switch))
    assert switch.next_value(False, lambda value: False) is True


@pytest.mark.parametrize("option", [o for o in LIVE_OPTIONS if isinstance(o, Number)], ids=lambda o: o.name)
def test_a_number_refuses_what_is_out_of_its_bounds_saying_what_it_must_be(option) -> None:
    too_large = [str(option.bounds.maximum * 2)] if option.bounds.maximum != float("inf") else []
    for bad in ["-1", "nan", "x", True, *too_large]:
        with pytest.raises(OptionChangeError, match=rf"^{option.name} must be "):
            option.parse(bad)


@pytest.mark.parametrize("command", [
    p.SetCommand("clip", "0.5", "--at"), p.SetCommand("amp", None), p.StopCommand("interrupted"),
    p.ProfileCommand(3, "--profile-at"), p.PauseCommand(), p.ResumeCommand(), p.SaveCheckpointCommand(),
], ids=lambda c: c.type)
def test_a_trainer_command_travels_between_ranks_as_its_own_protocol_text(command) -> None:
    assert p.trainer_command(command.json_text()) == command


@pytest.mark.parametrize("command", [p.DetachCommand(), p.Hello(version=p.PROTOCOL_VERSION, token="t")], ids=lambda c: c.type)
def test_what_is_not_the_trainers_is_not_taken_as_a_trainer_command(command) -> None:
    with pytest.raises(p.ProtocolError, match="is not a command for the trainer"):
        p.trainer_command(command.json_text())


def test_a_live_clip_of_zero_turns_clipping_off_as_the_flag_does():
    """``--clip 0`` meant off, while the same 0 sent to a running trainer (a JSON number) was refused."""
    from trainers import make_trainer

    trainer, seen = make_trainer(steps=3, options={"clip": "1.0"})
    trainer.submit(p.SetCommand("clip", 0, "test"))
    assert trainer.run().status == "finished"
    assert not seen.of("option_refused")
    [applied] = seen.of("option_applied")
    assert (applied["option"], applied["value"], applied["previous"]) == ("clip", None, 1.0)
    assert [record.options.clip for record in seen.metrics] == [None, None, None]
