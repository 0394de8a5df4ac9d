"""JSON objects read as the dataclasses they travel as, strictly; each field's accepted types come from its annotation.

Standard library only. A message of the protocol (core/wire/protocol.py) and each payload nested in one
(core/wire/payloads.py) declares its fields once, as annotations, and ``schema_of`` turns them into what
``read_object`` accepts (``JsonObject.schema`` shows it, field name -> accepted types):

    str, int, bool, None   that JSON value; a boolean is never read as an int
    float                  a number: in a payload an int becomes a float (a payload's ints fit in 64 bits); in a
                           message's own field it is kept as it came (its ints are not bounded)
    X | Y                  either; ``JsonScalar`` is any JSON value but an array or an object
    list, dict             any JSON array, any JSON object, as it is
    list[T]                an array whose every item is read as T (``path[index]``)
    dict[str, T]           an object whose every value is read as T (``path.key``); ``dict[str, Any]`` as ``dict``
    a JsonObject subclass  a JSON object read as that dataclass, field by field (``path.field``)

Any other annotation is a TypeError when its class's schema is first made (the protocol's tests make every one),
not a field that accepts anything. In a payload (a dataclass nested in a message) a number is a finite one of at
most 64 bits: NaN and Inf travel as null (core/wire/strict_json.py), so the app draws what it reads without
checking each figure again. A reason names the path of what is wrong:
``telemetry.sample.gpus[0].memory_used_bytes: expected int or null, got str``.
"""

from __future__ import annotations

import functools
import math
import types
import typing
from dataclasses import MISSING, fields, is_dataclass
from typing import Any, TypeVar, get_args, get_origin

from torchlab.core.errors import SHOWN_CHARS, shown
from torchlab.core.wire import strict_json

#: A JSON value that is neither an array nor an object: what a live option's value is on the wire.
JsonScalar = str | int | float | bool | None

T = TypeVar("T")
_NULL = type(None)
_PLAIN = (str, int, float, bool, list, dict)


class UnreadableValue(ValueError):
    """A JSON value that is not of the type its field declares; the text says where and why."""


class _SchemaOfFields:
    """``cls.schema``: made from the class's annotations the first time it is asked for."""

    def __get__(self, instance: Any, owner: type) -> dict[str, tuple]:
        return schema_of(owner)


class JsonObject:
    """Base of a dataclass that travels as the JSON object of its fields (a message, a payload)."""

    #: field name -> the types a JSON value of it may be read as (from the annotations; see the module's docstring)
    schema = _SchemaOfFields()


@functools.cache
def schema_of(kind: type) -> dict[str, tuple]:
    """Each field of the dataclass ``kind`` and the types its value is read as, from its annotation."""
    # Names are looked up in the class's module only (localns={}): the class's own namespace holds a message's
    # ``type`` ClassVar, which would shadow the builtin in an annotation such as ``tuple[type, ...]``.
    hints = typing.get_type_hints(kind, localns={})
    return {spec.name: accepted_types(hints[spec.name]) for spec in fields(kind)}


@functools.cache
def accepted_types(annotation: Any) -> tuple:
    """The types a JSON value annotated ``annotation`` is read as; a TypeError for one that no JSON value is."""
    if annotation is None or annotation is _NULL:
        return (_NULL,)
    origin = get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return tuple(kind for member in get_args(annotation) for kind in accepted_types(member))
    if origin is list:
        accepted_types(get_args(annotation)[0])  # an item type that cannot be read fails now, not on a peer's line
        return (annotation,)
    if origin is dict:
        key, value = get_args(annotation)
        if key is not str:
            raise TypeError(f"{annotation}: a JSON object's keys are text: dict[str, ...]")
        if value is Any:
            return (dict,)
        accepted_types(value)
        return (annotation,)
    if annotation in _PLAIN or (isinstance(annotation, type) and is_dataclass(annotation) and issubclass(annotation, JsonObject)):
        return (annotation,)
    raise TypeError(f"{annotation!r} is not a type a JSON value is read as (see core/wire/typed_json.py)")


def read_object(kind: type[T], payload: dict[str, Any], path: str, *, nested: bool) -> T:
    """A JSON object as the dataclass ``kind``: no unknown field, none missing, each of its declared types.
    ``nested``: ``kind`` is a payload inside a message (whose numbers are bounded), not the message itself."""
    declared = {spec.name: spec for spec in fields(kind)}
    unknown = set(payload) - set(declared)
    if unknown:
        raise UnreadableValue(f"{path}: unknown field(s) {first_few([cut(name) for name in sorted(unknown)])}")
    schema = schema_of(kind)
    values = {}
    for name, spec in declared.items():
        if name in payload:
            values[name] = _read_value(payload[name], schema[name], f"{path}.{name}", nested)
        elif spec.default is MISSING and spec.default_factory is MISSING:
            raise UnreadableValue(f"{path}: missing field {name!r}")
    return kind(**values)


def read_value(kind: Any, data: Any, path: str) -> Any:
    """A JSON value read as annotated ``kind`` (a payload type, ``list[`` one ``]``...) as a payload nested in a
    message is read."""
    return _read_value(data, accepted_types(kind), path, nested=True)


def _read_value(value: Any, accepted: tuple, path: str, nested: bool) -> Any:
    """``value`` if it is of an ``accepted`` type, read as the module's docstring says."""
    if nested and isinstance(value, float) and not math.isfinite(value):
        raise UnreadableValue(f"{path}: {value} is not a finite number (NaN and Infinity travel as null)")
    if nested and _is_int(value) and abs(value) >= strict_json.MAX_INT:
        raise UnreadableValue(f"{path}: {shown(value)} is out of range (at most 64 bits)")
    if isinstance(value, bool) and bool not in accepted:
        raise UnreadableValue(f"{path}: expected {_names(accepted)}, got a boolean")
    if _is_int(value) and int not in accepted and float in accepted:
        return float(value) if nested else value
    if isinstance(value, dict):
        for kind in accepted:
            if is_dataclass(kind):
                return read_object(kind, value, path, nested=True)
            if get_origin(kind) is dict:
                item_types = accepted_types(get_args(kind)[1])
                return {key: _read_value(item, item_types, f"{path}.{cut(key)}", nested) for key, item in value.items()}
    if isinstance(value, list):
        for kind in accepted:
            if get_origin(kind) is list:
                item_types = accepted_types(get_args(kind)[0])
                return [_read_value(item, item_types, f"{path}[{index}]", nested) for index, item in enumerate(value)]
    plain = tuple(kind for kind in accepted if kind in _PLAIN or kind is _NULL)
    if not isinstance(value, plain):
        raise UnreadableValue(f"{path}: expected {_names(accepted)}, got {_name(type(value))}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _names(types_: tuple) -> str:
    """How accepted types read in a reason: a payload reads as the dict it travels as, ``list[T]`` as list."""
    return " or ".join(_name(kind) for kind in types_)


def _name(kind: Any) -> str:
    if kind is _NULL:
        return "null"
    if is_dataclass(kind):
        return "dict"
    return (get_origin(kind) or kind).__name__


def cut(text: str) -> str:
    """A name a peer chose, unquoted, at most ``SHOWN_CHARS`` characters."""
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def first_few(items: list[str], count: int = 3) -> str:
    """The first ``count`` of ``items`` and how many more: a peer decides how many there are."""
    more = f" and {len(items) - count} more" if len(items) > count else ""
    return ", ".join(items[:count]) + more
