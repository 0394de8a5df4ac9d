"""Configuration and live-option parsing: typed values, and refusals that say what to change."""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import fields

import pytest

from torchlab.core.engine.adapters.loading import check_spec, workload_label
from torchlab.core.errors import ConfigError, WorkloadError
from torchlab.core.launch.arguments import build_parser, resolve_config
from torchlab.core.records.config import ScheduledChange, TrainConfig, build_config, load_config_file
from torchlab.core.records.settings import SETTINGS, STEPS_SETTING, NumberSetting
from torchlab.core.options import (
    LIVE_OPTIONS, STEPS, Bounds, LiveOptions, Number, OptionChangeError, format_option_value, parse_option_value,
)


@pytest.mark.parametrize("option, text, value", [
    ("amp", "BF16", "bf16"), ("amp", "none", "off"),
    ("checkpointing", "on", True), ("checkpointing", False, False),
    ("clip", "1.5", 1.5), ("clip", "off", None), ("clip", None, None), ("clip", 2, 2.0), ("clip", "0", None),
    ("accum", "4", 4), ("lr_scale", "0.25", 0.25), ("world_size", 1, 1),
])
def test_option_values_parse_from_text_and_json(option, text, value):
    assert parse_option_value(option, text) == value


@pytest.mark.parametrize("option, text, reason", [
    ("amp", "fp8", "amp must be one of off, bf16, fp16"),
    ("checkpointing", 3, "checkpointing must be on, off or block names separated by commas, got 3"),
    ("clip", "-1", "positive max grad norm"), ("clip", "nan", "finite number"), ("clip", True, "must be a number"),
    ("accum", "0", "whole number from 1"), ("accum", "2.5", "whole number"), ("accum", True, "whole number"),
    ("lr_scale", "-1", "above 0"), ("lr_scale", "inf", "finite"),
    ("speed", "11", "unknown option 'speed'; the live options are: amp, checkpointing, compile, dynamic, clip, accum, split, oom_rescue, spike_guard, lr_scale, workers, pin_memory, world_size"),
])
def test_bad_option_values_are_refused_with_the_reason(option, text, reason):
    with pytest.raises(OptionChangeError, match=reason.replace("(", r"\(")):
        parse_option_value(option, text)


def test_option_values_format_as_a_user_types_them():
    assert [format_option_value(k, v) for k, v in LiveOptions(clip=None, checkpointing=True).as_dict().items()] == [
        "off", "on", "off", "auto", "off", "1", "1", "on", "off", "1.0", "0", "auto", "1", "ddp", "200"]


def test_scheduled_change_parses_and_refuses_bad_forms():
    assert ScheduledChange.parse(" 50 : amp = bf16 ") == ScheduledChange(50, "amp", "bf16")
    for text, reason in [("0:amp=bf16", r"STEP must be an optimizer step from 1 to 10\^9, got .0."), ("amp=bf16", "STEP:OPTION=VALUE"),
                         ("5:accum=-2", "whole number")]:
        with pytest.raises(ConfigError, match=reason):
            ScheduledChange.parse(text)


def test_flags_override_the_file_and_options_merge():
    config = build_config(
        {"steps": 10, "lr": 0.01, "options": {"clip": 1.0, "amp": "bf16"}, "at": ["3:accum=2"]},
        {"steps": 20, "options": {"clip": "off"}, "at": ["4:amp=off"]},
    )
    assert (config.steps, config.lr) == (20, 0.01)
    assert config.options == LiveOptions(clip=None, amp="bf16", steps=20)
    assert [str(change) for change in config.at] == ["3:accum=2", "4:amp=off"]


def test_written_toml_reads_back_to_the_same_config():
    config = build_config({}, {"workload": 'odd "name".py:make', "steps": 7, "options": {"clip": "0.5"}, "at": ["2:amp=bf16"]})
    data = tomllib.loads(config.to_toml())
    options = data.pop("options")
    assert build_config(data | {"options": options}, {}) == config


def test_warmup_defaults_to_five_percent_of_steps():
    assert TrainConfig(steps=400).resolved_warmup_steps == 20
    assert TrainConfig(steps=10).resolved_warmup_steps == 1
    assert TrainConfig(steps=400, warmup_steps=0).resolved_warmup_steps == 0


@pytest.mark.parametrize("settings, setting", [
    ({"batch_size": 0}, "batch_size (--batch-size)"), ({"seed": -1}, "seed (--seed)"),
    ({"optimizer": "lion"}, "optimizer (--optimizer) must be one of adamw, sgd"),
    ({"schedule": "linear"}, "schedule (--schedule)"),
    ({"steps": True}, "steps (--steps)"), ({"weight_decay": float("nan")}, "weight_decay (--weight-decay)"),
    ({"probe_every": -1}, "probe_every (--probe-every)"), ({"checkpoint_every": -5}, "checkpoint_every (--checkpoint-every)"), ({"workload": " "}, "workload (--workload)"),
    ({"shared_run_dir": "yes"}, "shared_run_dir (--shared-run-dir) must be true or false; got 'yes'"),
    ({"telemetry_interval": 1e30}, "telemetry_interval (--telemetry-interval) must be 0 (off) or a number of seconds from 0.1 to 3600; got 1e+30"),
    ({"profile_steps": 10**30}, "profile_steps (--profile-steps) must be a whole number from 1 to 1000"),
    ({"profile_at": (3, 0)}, "profile_at (--profile-at) must be optimizer steps from 1 to 10^9; got 0."),
    ({"tensorboard": " "}, "tensorboard (--tensorboard) must be a directory to write TensorBoard event files to; got ' '."),
    ({"device": "cuda:128"}, "device (--device) must be auto, cpu, cuda or cuda:N with N from 0 to 127; got 'cuda:128'."),
])
def test_invalid_settings_name_the_setting(settings, setting):
    with pytest.raises(ConfigError) as raised:
        TrainConfig(**settings)
    assert str(raised.value).startswith(setting)


def test_profile_steps_in_a_config_file_must_be_a_list(tmp_path):
    (tmp_path / "c.toml").write_text("profile_at = 50\n")
    with pytest.raises(ConfigError, match=r"^profile_at \(--profile-at\) must be a list of steps; got 50\.$"):
        build_config(load_config_file(tmp_path / "c.toml"))
    (tmp_path / "c.toml").write_text("profile_at = [50, 200]\n")
    assert build_config(load_config_file(tmp_path / "c.toml")).profile_at == (50, 200)


def test_workload_specs_are_checked_without_importing(tmp_path):
    assert check_spec("tiny_gpt").module == "torchlab.sample_models.tiny_gpt"
    assert check_spec("pkg.models:build").module == "pkg.models"
    model_file = tmp_path / "my_model.py"
    model_file.write_text("")
    assert check_spec(f"{model_file}:workload").file == model_file
    assert workload_label(f"{model_file}:workload") == "my_model"
    assert workload_label("pkg.models:build") == "models-build"
    for text in ["", "tiny", "a b:c", "x.py:", ":factory", "file.py:not-an-identifier"]:
        with pytest.raises(WorkloadError):
            check_spec(text)


def test_a_message_names_a_huge_value_without_repeating_it():
    """Found by fuzzing: a megabyte string in a TOML file came back whole in the error paragraph."""
    with pytest.raises(ConfigError) as raised:
        TrainConfig(optimizer="x" * 1_000_000)
    assert len(str(raised.value)) < 200 and str(raised.value).endswith("; got 'xxxxxxxxxxxxxxxxx...xxxxxxxxxxxxxxxxxx'.")


def test_an_integer_too_large_for_a_float_is_a_refused_option_value():
    """A 400-digit lr_scale in a TOML file: float() of it raised OverflowError, a traceback."""
    from torchlab.core.options import OptionChangeError, parse_option_value

    with pytest.raises(OptionChangeError, match=r"lr_scale must be a finite number, got 9{18}\.\.\.9{19}$"):
        parse_option_value("lr_scale", 10**400 - 1)


def test_more_data_loader_workers_than_the_machine_can_run_is_refused():
    """``--workers 1000`` (found by fuzzing the CLI) forked a thousand workers: a load of 200 on 2 cores."""
    from torchlab.core.options import max_workers

    with pytest.raises(ConfigError, match=rf"workers \(--workers\): workers must be a whole number from 0 .* to {max_workers()} on this machine"):
        build_config({"options": {"workers": 1000}})
    with pytest.raises(ConfigError, match=r"workers \(--workers\): workers must be a whole number"):
        build_config({"options": {"workers": 1.5}})
    assert build_config({"options": {"workers": max_workers()}}).options.workers == max_workers()


def test_workers_at_the_top_level_of_a_config_file_still_sets_the_live_option(tmp_path):
    """It was a setting before it became a live option: files written then, and the config.toml of older runs
    (kept in their checkpoints too), say ``workers = 2`` at the top level."""
    old = tmp_path / "old.toml"
    old.write_text("steps = 5\nworkers = 2\n")
    assert build_config(load_config_file(old)).options.workers == 2
    both = tmp_path / "both.toml"
    both.write_text("workers = 2\n[options]\nworkers = 1\n")
    with pytest.raises(ConfigError, match="workers is set twice, at the top level and in \\[options\\]"):
        load_config_file(both)
    written = build_config(load_config_file(old)).to_toml()
    assert "[options]" in written and "\nworkers = 2\n" in written.split("[options]")[1]




# ---------------------------------------------------------------------------------------------------------------------
# Every setting's bounds come from one definition (core/options.py's Bounds): the flag, config.toml, --at and a
# live change or a prompt (the option's parse) all take and refuse the same values. The cases are generated from the
# registries, so a new setting or option cannot skip its bounds.

#: TrainConfig's fields that are no setting with a flag of its own: the positional workload, the live options, the
#: scripted changes and trials (--at, --trial), and what a resume records.
NOT_SETTINGS = {"workload", "options", "at", "trials", "schedule_extensions"}
#: The settings that are numbers, each with its Bounds.
NUMBER_SETTINGS = {setting.name: setting for setting in SETTINGS if isinstance(setting, NumberSetting)}
LIVE_NUMBERS = [option for option in LIVE_OPTIONS if isinstance(option, Number)]


def _text(bounds: Bounds, number: float) -> str:
    return str(int(number)) if bounds.whole else repr(float(number))


def inside(bounds: Bounds) -> list[str]:
    """The edges a setting takes, as typed."""
    values = [_text(bounds, bounds.minimum + (1 if bounds.whole else 0.5) if bounds.above else bounds.minimum)]
    if math.isfinite(bounds.maximum):
        values.append(_text(bounds, bounds.maximum))
    return values


def outside(bounds: Bounds) -> list[str]:
    """Numbers just past each edge, as typed (zero is no number past an edge where it means off)."""
    below = bounds.minimum - 1 if bounds.whole else bounds.minimum / 2
    values = ["-1"]
    if below < bounds.minimum and not (bounds.can_be_off and below == 0):
        values.append(_text(bounds, below))
    if bounds.above and not (bounds.can_be_off and bounds.minimum == 0):
        values.append(_text(bounds, bounds.minimum))
    if math.isfinite(bounds.maximum):
        values.append(_text(bounds, bounds.maximum + 1 if bounds.whole else bounds.maximum * 2))
    return values


def test_every_field_is_a_declared_setting_with_the_declared_default():
    declared = {setting.name: setting for setting in SETTINGS}
    assert len(declared) == len(SETTINGS) and set(declared) | NOT_SETTINGS == {f.name for f in fields(TrainConfig)}
    assert not set(declared) & NOT_SETTINGS
    for f in fields(TrainConfig):
        if f.name in declared:
            assert f.default == declared[f.name].default, f.name
    # steps: the setting and the live option are one definition
    assert STEPS_SETTING.bounds is STEPS.bounds and STEPS_SETTING.default == STEPS.default


def test_every_setting_has_a_flag_whose_help_states_the_declared_default():
    helps = {action.dest: action.help for action in build_parser()._actions}
    assert set(helps) >= {setting.name for setting in SETTINGS}
    for setting, stated in [("lr", "peak learning rate (default 0.001)"), ("batch_size", "(default: the workload's, else 32)"),
                            ("warmup_steps", "(default: 5%% of steps)"), ("checkpoint_every", "(default auto)"),
                            ("telemetry_interval", "(default 1)"), ("steps", "optimizer steps to train to (default 200)")]:
        assert helps[setting].endswith(stated), setting


@pytest.mark.parametrize("name", sorted(NUMBER_SETTINGS))
def test_a_settings_flag_and_its_config_file_take_and_refuse_the_same_values(name, tmp_path):
    bounds, flag = NUMBER_SETTINGS[name].bounds, "--" + name.replace("_", "-")
    refusal = rf"^{name} \({flag}\) must be {re.escape(bounds.must_be)}; got "
    for text in inside(bounds):
        config, _ = resolve_config(build_parser().parse_args(["mlp", flag, text]))
        assert getattr(config, name) == bounds.parse(name, text)
        (tmp_path / "c.toml").write_text(f"{name} = {text}\n")
        assert getattr(build_config(load_config_file(tmp_path / "c.toml")), name) == bounds.parse(name, text)
    for text in [*outside(bounds), "x", "1e400"]:
        with pytest.raises(ConfigError, match=refusal):
            resolve_config(build_parser().parse_args(["mlp", flag, text]))
        (tmp_path / "c.toml").write_text(f"{name} = {text if text != 'x' else repr(text)}\n")
        with pytest.raises(ConfigError, match=refusal):
            build_config(load_config_file(tmp_path / "c.toml"))


@pytest.mark.parametrize("option", LIVE_NUMBERS, ids=lambda o: o.name)
def test_a_live_number_takes_and_refuses_the_same_values_by_flag_file_at_and_live(option, tmp_path):
    bounds, name = option.bounds, option.name
    for text in inside(bounds):
        value = option.parse(text)
        assert getattr(resolve_config(build_parser().parse_args(["mlp", option.flag, text]))[0].options, name) == value
        assert ScheduledChange.parse(f"5:{name}={text}").value == text
    for text in outside(bounds):
        with pytest.raises(OptionChangeError, match=rf"^{name} must be {re.escape(bounds.must_be)}, got "):
            option.parse(text)  # a live change, a prompt in the app, a value in a protocol message
        with pytest.raises(OptionChangeError, match=rf"^{name} must be {re.escape(bounds.must_be)}, got "):
            option.parse(float(text) if not bounds.whole else int(text))  # as JSON carries it
        with pytest.raises(ConfigError, match=re.escape(f"--at '5:{name}={text}': {name} must be {bounds.must_be}")):
            ScheduledChange.parse(f"5:{name}={text}")
        with pytest.raises(ConfigError, match=re.escape(bounds.must_be)):
            resolve_config(build_parser().parse_args(["mlp", option.flag, text]))
        if not option.setting:
            (tmp_path / "c.toml").write_text(f"[options]\n{name} = {text}\n")
            with pytest.raises(ConfigError, match=re.escape(bounds.must_be)):
                build_config(load_config_file(tmp_path / "c.toml"))


@pytest.mark.parametrize("given", ["0", "0.0", 0, 0.0, "off", None])
def test_a_clip_of_zero_is_off_on_the_command_line_in_a_file_in_at_and_live(given, tmp_path):
    """``--clip 0`` was off, while a live ``clip`` of 0 (a JSON number) was refused: 0 is off everywhere."""
    assert parse_option_value("clip", given) is None  # live, and the app's prompt
    if isinstance(given, str):
        config, _ = resolve_config(build_parser().parse_args(["mlp", "--clip", given, "--at", f"3:clip={given}"]))
        assert config.options.clip is None and config.at[0].value == given
    (tmp_path / "c.toml").write_text(f"[options]\nclip = {given if not isinstance(given, str) else repr(given)}\n"
                                     if given is not None else "")
    assert build_config(load_config_file(tmp_path / "c.toml")).options.clip is None


def test_a_workloads_own_starting_values_take_the_defaults_place_and_never_the_users():
    from torchlab.core.errors import WorkloadError
    from torchlab.core.records.starting_values import with_workload_settings

    config = build_config({"workload": "mlp", "steps": 40, "options": {"clip": 0.5}})
    taken, values = with_workload_settings(config, {"steps": 500, "batch_size": 8, "clip": 1.0, "amp": "bf16",
                                                    "accum": 1}, {"steps", "clip"}, "workload w.py")
    assert (taken.steps, taken.batch_size, taken.options.clip, taken.options.amp, taken.options.steps) == (40, 8, 0.5, "bf16", 40)
    assert values == {"batch_size": 8, "amp": "bf16"}  # accum 1 is what the run had: nothing taken
    for settings, said in (({"seed": 3}, "cannot set seed: it seeds the workload's own code"),
                           ({"acum": 2}, "names 'acum', which is no setting or live option of torchlab (did you mean 'accum'?)"),
                           ({"accum": 0}, "Workload.settings accum = 0: "),
                           ({"steps": -1}, "Workload.settings: steps (--steps) must be")):
        with pytest.raises(WorkloadError) as raised:
            with_workload_settings(config, settings, set(), "workload w.py")
        assert str(raised.value).startswith("workload w.py: Workload.settings") and said in str(raised.value)
