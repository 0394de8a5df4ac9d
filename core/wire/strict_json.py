"""JSON that other tools can read: NaN and Infinity become null (the bare tokens are not JSON); and JSON read
back as bounded as it was written.

A dataclass (a payload of ``core/wire/payloads.py``, wherever it is nested) is written as the object of its
fields. Standard library only; the protocol, the run directory's .jsonl files and the app share it.

``loads`` reads what ``dumps`` writes, and nothing wider: a file of a run may have been written by someone
else (issue 26), and Python's own ``json.loads`` takes a value nested 5,000 deep (RecursionError, in it or in
the reader that walks it), a 5,000-digit integer (ValueError: Python's limit on int()), a 400-digit one (which
``float()`` of it overflows), ``1e400`` (Infinity) and the bare ``NaN``. Each is an ``UnreadableJson`` (a
ValueError), which every reader of a run's journals (core/records/rundir.py ``rows_of``, core/records/storage.py
``parse_line``) leaves out as it leaves out a torn line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import Any

#: How deep a value read back may nest: torchlab's go 4 levels deep (a telemetry sample's GPUs, a metrics row's
#: activation statistics by module).
MAX_DEPTH = 32
#: Every integer torchlab writes (a step, a byte count) fits in 64 bits; a float is any finite double.
MAX_INT = 2**63
_MAX_INT_DIGITS = len(str(MAX_INT))


class UnreadableJson(ValueError):
    """Text that is not one JSON value of the kind torchlab writes; the message says why."""


#: Each dataclass's field names, by class: ``dataclasses.fields`` builds its tuple anew on every call, and a memory
#: breakdown or a telemetry sample is written as a dozen nested dataclasses.
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _fields(value: Any) -> dict[str, Any]:
    """A dataclass instance as the object of its fields (json calls this for what it cannot write itself)."""
    names = _FIELD_NAMES.get(type(value))
    if names is None:
        if not is_dataclass(value) or isinstance(value, type):
            raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
        names = _FIELD_NAMES[type(value)] = tuple(spec.name for spec in fields(value))
    return {name: getattr(value, name) for name in names}


#: One encoder for every call: ``json.dumps`` with arguments builds a new one each time (a few
#: microseconds of a metrics row's ~15, on the training thread).
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False, default=_fields)
#: The same encoder's C function, made once: ``JSONEncoder.encode`` makes it again on every call (with a dict
#: that watches for cycles, which no value written here has), ~1.5 us of a metrics row's ~10. None without
#: CPython's C accelerator; then ``_ENCODER`` encodes.
_ENCODE_C = (json.encoder.c_make_encoder(None, _fields, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, False)
             if json.encoder.c_make_encoder is not None else None)


def _encode(value: Any) -> str:
    return "".join(_ENCODE_C(value, 0)) if _ENCODE_C is not None else _ENCODER.encode(value)


def dumps(value: Any) -> str:
    """Compact strict JSON. The common case (no NaN/Inf anywhere) costs one encoding."""
    try:
        return _encode(value)
    except ValueError:  # a NaN or Inf somewhere: rare, so only then walk every value
        return _encode(_finite(value))


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if is_dataclass(value) and not isinstance(value, type):
        value = _fields(value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def loads(text: str | bytes) -> Any:
    """The JSON value of ``text`` (a line of a journal), bounded as ``dumps`` writes: strict JSON (no NaN or
    Infinity, whose place is null), each integer under ``MAX_INT`` in size, each number a finite float, nested at
    most ``MAX_DEPTH`` deep. Anything else is an UnreadableJson saying why."""
    try:
        text = text.decode("utf-8") if isinstance(text, bytes) else text
        value = _DECODER.decode(text)
    except RecursionError:  # json's own limit (about 1,000 levels)
        raise UnreadableJson(f"nested more than {MAX_DEPTH} levels deep") from None
    except UnreadableJson:
        raise
    except ValueError as error:  # not JSON, or not UTF-8
        raise UnreadableJson(f"not JSON: {error}") from None
    # Fewer brackets than levels allowed (a metrics row has a few): no need to walk it.
    if text.count("[") + text.count("{") > MAX_DEPTH and nests_deeper_than(value, MAX_DEPTH):
        raise UnreadableJson(f"nested more than {MAX_DEPTH} levels deep")
    return value


def nests_deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` holds containers (dicts, lists, tuples, sets) more than ``limit`` levels deep; found
    without recursion, so a value nested as deep as memory allows is told apart too."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children = [*item.keys(), *item.values()]
        elif isinstance(item, (list, tuple, set, frozenset)):
            children = list(item)
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _bounded_int(digits: str) -> int:
    """An integer of the text, if it fits in 64 bits: ``int()`` of a long one is slow, or a ValueError."""
    if len(digits.lstrip("-")) > _MAX_INT_DIGITS or abs(number := int(digits)) >= MAX_INT:
        raise UnreadableJson(f"the integer {digits[:20]}... is out of range (at most 64 bits)")
    return number


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise UnreadableJson(f"the number {text[:20]} is out of range (a finite double)")
    return number


def _no_constant(name: str) -> None:
    raise UnreadableJson(f"{name} is not JSON (torchlab writes null in its place)")


_DECODER = json.JSONDecoder(parse_int=_bounded_int, parse_float=_finite_float, parse_constant=_no_constant)
