"""What a number accepts (``Bounds``): the one definition of its type, range and off-word that a live option
(core/options.py, ``Number``) and a run's setting (core/records/settings.py) are both parsed with, so that a flag, a
TOML file, ``--at``, a prompt and a protocol message never take a value another refuses; and the refusal they raise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torchlab.core.errors import shown

OFF_WORDS = {"off", "none", "no", "false", "0", ""}
ON_WORDS = {"on", "yes", "true", "1"}
AUTO_WORD = "auto"


class OptionChangeError(ValueError):
    """A requested option change cannot be applied; the message is the reason shown to the user."""


class _NotOff:
    """``Bounds.off`` of a number that cannot be off."""

    def __repr__(self) -> str:
        return "NOT_OFF"


NOT_OFF: Any = _NotOff()

def written_limit(number: float) -> str:
    """A limit as a refusal writes it: ``4096``, ``0.1``, and a large power of ten as ``10^9``."""
    if math.isinf(number):
        return "∞"
    if number >= 10**6 and number == int(number) and str(int(number)).rstrip("0") == "1":
        return f"10^{len(str(int(number))) - 1}"
    return f"{number:g}" if isinstance(number, float) and not number.is_integer() else str(int(number))


@dataclass(frozen=True, kw_only=True)
class Bounds:
    """What a number accepts: the one definition a flag, a TOML file, ``--at``, a prompt and a protocol message
    are all parsed with (``parse``), for a live option (``Number.bounds``) and a setting (core/records/settings.py)
    alike, so that none of them takes a value another refuses.

    ``off``: the value that "off" (and 0, and nothing) stands for, where the number can be off: clip's None (no
    clipping), eval_every's 0. 0 means off wherever a number can be off, so it never means off in one place and
    "too small" in another. ``auto``: the word "auto" is a value too, kept as it is (a cadence the run picks)."""

    #: what a value must be, for refusals: the range (``{minimum}`` and ``{maximum}``, filled in from the numbers, so
    #: that a limit is written once), and what 0 or auto mean
    wording: str
    whole: bool = False
    minimum: float = 0  #: the smallest value (``above``: values must exceed it)
    above: bool = False
    maximum: float = math.inf
    off: Any = NOT_OFF
    auto: bool = False

    @property
    def must_be(self) -> str:
        """What a value must be, in words: "a whole number from 1 to 4096"."""
        return self.wording.format(minimum=written_limit(self.minimum), maximum=written_limit(self.maximum))

    @property
    def can_be_off(self) -> bool:
        return self.off is not NOT_OFF

    def parse(self, name: str, value: Any) -> Any:
        """``value`` (text, or a number from JSON or TOML) as the number it stands for, or OptionChangeError naming
        ``name`` and what it must be."""
        if self.auto and isinstance(value, str) and value.strip().lower() == AUTO_WORD:
            return AUTO_WORD
        if self.can_be_off and (value is None or (isinstance(value, str) and value.strip().lower() in OFF_WORDS)):
            return self.off
        number = self._number(name, value)
        if self.can_be_off and number == 0:
            return self.off
        low_ok = number > self.minimum if self.above else number >= self.minimum
        if not (low_ok and number <= self.maximum):
            raise self.refusal(name, value)
        return number

    def _number(self, name: str, value: Any) -> int | float:
        if isinstance(value, bool):
            raise self.refusal(name, value) if self.whole else OptionChangeError(f"{name} must be a number, got {shown(value)}")
        if self.whole:
            try:
                return value if isinstance(value, int) else int(str(value).strip())
            except ValueError:  # not a whole number, or one of over 4,300 digits
                raise self.refusal(name, value) from None
        try:
            number = float(value) if isinstance(value, (int, float)) else float(str(value).strip())
        except ValueError:
            raise OptionChangeError(f"{name} must be a number, got {shown(value)}") from None
        except OverflowError:  # an integer too large for a float (a 400-digit one from a socket)
            raise OptionChangeError(f"{name} must be a finite number, got {shown(value)}") from None
        if not math.isfinite(number):
            raise OptionChangeError(f"{name} must be a finite number, got {shown(value)}")
        return number

    def refusal(self, name: str, value: Any) -> OptionChangeError:
        return OptionChangeError(f"{name} must be {self.must_be}, got {shown(value)}")
