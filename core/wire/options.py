"""Live options: the settings that may change while a run trains, and how their values are parsed.

Values arrive as strings (command line, `--at`, a UI prompt) or as JSON values (the protocol); both go
through ``parse_option_value``, the one place that turns them into typed values or refuses them with a
reason the user can act on. Whether a value is possible on *this* run (fp16 needs CUDA, checkpointing
needs blocks) is decided by the trainer, which knows the device and the model.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from torchlab.core.wire.errors import shown

AMP_MODES = ("off", "bf16", "fp16")
_OFF_WORDS = {"off", "none", "no", "false", "0", ""}
_ON_WORDS = {"on", "yes", "true", "1"}


class OptionRefused(ValueError):
    """A requested option change cannot be applied; the message is the reason shown to the user."""


@dataclass(frozen=True, kw_only=True)
class LiveOptions:
    """The options in force for an optimizer step. ``clip`` is a max global grad norm, or None for off."""

    amp: str = "off"
    checkpointing: bool = False
    clip: float | None = None
    accum: int = 1
    lr_scale: float = 1.0
    world_size: int = 1

    def with_value(self, option: str, value: Any) -> LiveOptions:
        return replace(self, **{option: value})

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


OPTION_NAMES = tuple(LiveOptions.__dataclass_fields__)


def parse_option_value(option: str, value: Any) -> Any:
    """Return ``value`` as the typed value of ``option``, or raise OptionRefused saying why not."""
    if option not in OPTION_NAMES:
        raise OptionRefused(f"unknown option {shown(option)}; the live options are: {', '.join(OPTION_NAMES)}")
    parser = _PARSERS[option]
    return parser(value)


def _parse_amp(value: Any) -> str:
    text = str(value).strip().lower() if value is not None else "off"
    if text in _OFF_WORDS:
        return "off"
    if text not in AMP_MODES:
        raise OptionRefused(f"amp must be one of {', '.join(AMP_MODES)}, got {shown(value)}")
    return text


def _parse_bool(name: str):
    def parse(value: Any) -> bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _ON_WORDS:
            return True
        if text in _OFF_WORDS:
            return False
        raise OptionRefused(f"{name} must be on or off, got {shown(value)}")

    return parse


def _parse_clip(value: Any) -> float | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in _OFF_WORDS):
        return None
    number = _to_float("clip", value)
    if not number > 0:
        raise OptionRefused(f"clip must be a positive max grad norm, or off; got {shown(value)}")
    return number


def _parse_positive_int(name: str, maximum: int):
    def parse(value: Any) -> int:
        if isinstance(value, bool):
            raise OptionRefused(f"{name} must be a whole number from 1 to {maximum}, got {shown(value)}")
        try:
            number = int(str(value).strip()) if not isinstance(value, int) else value
        except ValueError:
            raise OptionRefused(f"{name} must be a whole number from 1 to {maximum}, got {shown(value)}") from None
        if not 1 <= number <= maximum:
            raise OptionRefused(f"{name} must be a whole number from 1 to {maximum}, got {shown(value)}")
        return number

    return parse


def _parse_lr_scale(value: Any) -> float:
    number = _to_float("lr_scale", value)
    if not 0 < number <= 1000:
        raise OptionRefused(f"lr_scale must be a factor above 0 and at most 1000, got {shown(value)}")
    return number


def _to_float(name: str, value: Any) -> float:
    if isinstance(value, bool):
        raise OptionRefused(f"{name} must be a number, got {shown(value)}")
    try:
        number = float(str(value).strip()) if not isinstance(value, (int, float)) else float(value)
    except ValueError:
        raise OptionRefused(f"{name} must be a number, got {shown(value)}") from None
    except OverflowError:  # an integer too large for a float (a 400-digit one from a socket)
        raise OptionRefused(f"{name} must be a finite number, got {shown(value)}") from None
    if not math.isfinite(number):
        raise OptionRefused(f"{name} must be a finite number, got {shown(value)}")
    return number


_PARSERS = {
    "amp": _parse_amp,
    "checkpointing": _parse_bool("checkpointing"),
    "clip": _parse_clip,
    "accum": _parse_positive_int("accum", 4096),
    "lr_scale": _parse_lr_scale,
    "world_size": _parse_positive_int("world_size", 1024),
}


def format_option_value(option: str, value: Any) -> str:
    """The value as a user would type it back (``clip=off``, ``checkpointing=on``)."""
    if option == "clip" and value is None:
        return "off"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)
