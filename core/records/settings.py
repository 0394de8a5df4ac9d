"""How a run's settings that are not live are declared: each is one ``Setting`` (core/records/config.py declares them
all, in ``SETTINGS``), as each live option is one ``LiveOption`` (core/wire/options.py).

A setting owns its name, its default, what it accepts (a number's ``Bounds``, a few choices, on or off, a text
that passes its check, a list of steps), its flag and the flag's help. From it come TrainConfig's field default,
the check where a TrainConfig is built (``check``: the value as the setting holds it, or a ConfigError naming the
setting and its flag), the flag in ``torchlab-tui --help`` under its heading (``group``), with the default stated
from the declared one, and the list of settings a command line sets (core/launch/arguments.py). A flag's text, a
TOML value and a value built in code are all checked by the same ``check``, so that none takes what another refuses.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from torchlab.core.errors import ConfigError, shown
from torchlab.core.wire.options import Bounds, OptionRefused

#: The heading of ``torchlab-tui --help`` a setting's flag is listed under: "run" beside ``--run-dir`` at the top,
#: "live" after the live options (a trial's length), else its own group.
Group = Literal["run", "training", "live", "probes"]


@dataclass(frozen=True, kw_only=True)
class Setting:
    """One setting. Subclasses say what its values are (``NumberSetting``, ``ChoiceSetting``, ``SwitchSetting``,
    ``TextSetting``, ``StepsSetting``)."""

    name: str  #: TrainConfig's field, config.toml's key; the flag is the name with dashes
    default: Any
    help: str  #: the flag's help, without the default: ``flag_help`` adds it from ``default``
    group: Group
    metavar: str | None = "N"
    #: what a default of None (the run's choice) means, for the help: "the workload's, else 32"
    default_means: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def check(self, value: Any) -> Any:
        """``value`` (a flag's text, a TOML value or one given in code) as the setting holds it, or the
        ConfigError that names the setting and its flag."""
        raise NotImplementedError

    def refusal(self, requirement: str, value: Any) -> ConfigError:
        return ConfigError(f"{self.name} ({self.flag}) {requirement}; got {shown(value)}.")

    def stated_default(self) -> str | None:
        """The default as ``--help`` states it ("default 0.01"); None where the help says it in words, or there is none."""
        if self.default is None:
            return f"default: {self.default_means}" if self.default_means else None
        return f"default {self.default:g}" if isinstance(self.default, float) else f"default {self.default}"

    def flag_help(self) -> str:
        default = self.stated_default()
        text = self.help if default is None else f"{self.help} ({default})"
        return text.replace("%", "%%")  # argparse formats the help with % (%(default)s)

    def add_flag(self, group: argparse._ActionsContainer) -> None:
        """The command-line flag: its raw text is checked where the TrainConfig is built, with the TOML values."""
        group.add_argument(self.flag, dest=self.name, metavar=self.metavar, help=self.flag_help())


@dataclass(frozen=True, kw_only=True)
class NumberSetting(Setting):
    """A number within its ``bounds``; a default of None (the run's choice) is kept as it is."""

    bounds: Bounds

    def check(self, value: Any) -> Any:
        if value is None and self.default is None:
            return None
        try:
            return self.bounds.parse(self.name, value)
        except OptionRefused:
            raise self.refusal(f"must be {self.bounds.must_be}", value) from None


@dataclass(frozen=True, kw_only=True)
class ChoiceSetting(Setting):
    """One of a few names."""

    choices: tuple[str, ...]
    metavar: str | None = None  # argparse lists the choices

    def check(self, value: Any) -> str:
        if value not in self.choices:
            raise self.refusal(f"must be one of {', '.join(self.choices)}", value)
        return value

    def add_flag(self, group: argparse._ActionsContainer) -> None:
        group.add_argument(self.flag, dest=self.name, choices=self.choices, help=self.flag_help())


@dataclass(frozen=True, kw_only=True)
class SwitchSetting(Setting):
    """On or off (``--name`` / ``--no-name``; true or false in TOML). Its help says what each means."""

    def check(self, value: Any) -> bool:
        if not isinstance(value, bool):
            raise self.refusal("must be true or false", value)
        return value

    def stated_default(self) -> str | None:
        return None

    def add_flag(self, group: argparse._ActionsContainer) -> None:
        group.add_argument(self.flag, dest=self.name, action=argparse.BooleanOptionalAction, default=None, help=self.flag_help())


@dataclass(frozen=True, kw_only=True)
class TextSetting(Setting):
    """A text that ``accepts`` takes (``requirement`` says which, for the refusal); None where that is the default."""

    accepts: Callable[[str], bool]
    requirement: str  #: "must be auto, cpu, cuda or cuda:N..."
    #: what the flag's text becomes before it is checked (a path made absolute), as argparse's ``type``
    from_flag: Callable[[str], str] | None = None

    def check(self, value: Any) -> str | None:
        if value is None and self.default is None:
            return None
        if not (isinstance(value, str) and self.accepts(value)):
            raise self.refusal(self.requirement, value)
        return value

    def add_flag(self, group: argparse._ActionsContainer) -> None:
        group.add_argument(self.flag, dest=self.name, type=self.from_flag, metavar=self.metavar, help=self.flag_help())


@dataclass(frozen=True, kw_only=True)
class StepsSetting(Setting):
    """Optimizer steps, each within ``bounds``: a repeatable flag (``--profile-at 50 --profile-at 200``), a TOML
    list; held as a tuple."""

    bounds: Bounds
    must_be: str  #: what the steps must be, for the refusal
    metavar: str | None = "STEP"

    def check(self, value: Any) -> tuple[int, ...]:
        if not isinstance(value, (list, tuple)):
            raise self.refusal("must be a list of steps", value)
        return tuple(self._step(step) for step in value)

    def _step(self, step: Any) -> int:
        try:
            return self.bounds.parse(self.name, step)
        except OptionRefused:
            raise self.refusal(f"must be {self.must_be}", step) from None

    def stated_default(self) -> str | None:
        return None

    def add_flag(self, group: argparse._ActionsContainer) -> None:
        group.add_argument(self.flag, dest=self.name, action="append", metavar=self.metavar, help=self.flag_help())
