"""Bad input, fuzzed: config files, option values and ``--at`` give a clean error or a valid value, never a crash.

"Clean" means ``ConfigError`` / ``OptionChangeError`` (messages written for the user, naming the setting)
or a value that passes validation; anything else (TypeError, KeyError, OverflowError...) is a bug.
"""

from __future__ import annotations

import json
import math
import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchlab.core.errors import ConfigError
from torchlab.core.launch.arguments import build_parser, resolve_config
from torchlab.core.records.config import ScheduledChange, TrainConfig, build_config, load_config_file
from torchlab.core.options import OPTION_NAMES, OptionChangeError, format_option_value, parse_option_value

SETTING_NAMES = sorted(f.name for f in TrainConfig.__dataclass_fields__.values()) + ["stesp", "lr_rate", "options", "at"]

toml_scalars = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=20),
)
toml_values = st.recursive(
    toml_scalars,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(st.sampled_from(OPTION_NAMES + ("x",)), children, max_size=4)),
    max_leaves=8,
)
any_values = st.one_of(toml_values, st.none(), st.text(alphabet=string.printable, max_size=30))


def _toml_literal(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string (a lone surrogate is not: a clean error)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_literal(item) for item in value) + "]"
    return "{" + ", ".join(f"{key} = {_toml_literal(item)}" for key, item in value.items()) + "}"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(SETTING_NAMES), toml_values, max_size=5))
def test_a_config_file_is_valid_or_a_clean_error(tmp_path, settings_map):
    path = tmp_path / "config.toml"
    path.write_text("\n".join(f"{key} = {_toml_literal(value)}" for key, value in settings_map.items()), encoding="utf-8")
    try:
        config = build_config(load_config_file(path), {"workload": "mlp"})
    except ConfigError as error:
        assert str(error)
    else:
        assert config.steps >= 1 and config.to_toml()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=200))
def test_a_config_file_of_any_bytes_is_a_clean_error(tmp_path, content):
    path = tmp_path / "config.toml"
    path.write_bytes(content)
    try:
        build_config(load_config_file(path), {"workload": "mlp"})
    except ConfigError as error:
        assert str(error)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(OPTION_NAMES + ("amp ", "AMP", "world", "")), any_values)
def test_an_option_value_parses_or_is_refused_with_a_reason(option, value):
    try:
        parsed = parse_option_value(option, value)
    except OptionChangeError as refusal:
        assert str(refusal)
    else:
        assert parse_option_value(option, format_option_value(option, parsed)) == parsed  # what the app shows reads back


@settings(max_examples=500, deadline=None)
@given(st.one_of(
    st.text(max_size=40),
    st.builds(lambda step, option, value: f"{step}:{option}={value}",
              st.integers(min_value=-5, max_value=10**30), st.sampled_from(OPTION_NAMES + ("amp2", "")), st.text(max_size=12)),
))
def test_an_at_value_parses_or_is_a_clean_error(text):
    try:
        change = ScheduledChange.parse(text)
    except ConfigError as error:
        assert "--at" in str(error)
    else:
        assert change.step >= 1 and change.option in OPTION_NAMES and ScheduledChange.parse(str(change)) == change


VALUE_FLAGS = [
    "--steps", "--batch-size", "--seed", "--device", "--optimizer", "--lr", "--weight-decay", "--schedule",
    "--warmup-steps", "--workers", "--eval-every", "--eval-batches", "--checkpoint-every", "--keep-checkpoints",
    "--amp", "--clip", "--accum", "--lr-scale", "--world-size", "--at", "--log-every", "--probe-every",
    "--act-stats-every", "--profile-at", "--profile-steps", "--telemetry-interval",
]
flag_values = st.one_of(
    st.text(alphabet=string.printable, max_size=12),
    st.integers(min_value=-(10**20), max_value=10**20).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["0", "-1", "1e309", "nan", "inf", "off", "auto", "bf16", "fp16", "3:amp=bf16", "0:clip=1", "cuda:9"]),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(VALUE_FLAGS), flag_values), max_size=4))
def test_command_line_values_are_valid_or_a_clean_error(pairs):
    """Through the real parser: argparse's own refusals exit 2 with usage; ours raise ConfigError."""
    argv = ["mlp"] + [f"{flag}={value}" for flag, value in pairs]
    parser = build_parser()
    parser.exit = _refuse  # argparse would print usage and exit 2: record that it refused instead
    parser.error = _refuse
    try:
        resolve_config(parser.parse_args(argv))
    except (ConfigError, _ArgparseRefused) as error:
        assert str(error)


class _ArgparseRefused(Exception):
    pass


def _refuse(status: int = 2, message: str | None = None) -> None:
    raise _ArgparseRefused(message or f"exit {status}")
