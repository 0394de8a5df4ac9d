"""Each field's accepted JSON types come from its annotation (core/wire/typed_json.py): for every kind of annotation a
message or a payload uses, a value of the wrong type is refused with its path, and the right one read as declared."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any

import pytest

import torchlab.core.engine.ranks.channel as rank_channel
from torchlab.core.wire import payloads
from torchlab.core.wire import protocol as p
from torchlab.core.wire.typed_json import JsonObject, JsonScalar, UnreadableValue, read_object, read_value, schema_of


@dataclass(frozen=True)
class Inner(JsonObject):
    count: int


@dataclass(frozen=True)
class EveryKind(JsonObject):
    """One field of each kind of annotation, each with a value of its type in ``GOOD``."""

    text: str
    count: int
    figure: float
    flag: bool
    maybe_count: int | None
    scalar: JsonScalar
    any_list: list
    any_dict: dict
    names: list[str]
    counts_by_name: dict[str, int]
    anything_by_name: dict[str, Any]
    inner: Inner
    inners: list[Inner]
    maybe_inner: Inner | None = None
    figures: list[float] = field(default_factory=list)


GOOD = {
    "text": "a", "count": 1, "figure": 0.5, "flag": True, "maybe_count": None, "scalar": "off", "any_list": [1, "a", None],
    "any_dict": {"a": [1]}, "names": ["a", "b"], "counts_by_name": {"a": 1}, "anything_by_name": {"a": [{"b": None}]},
    "inner": {"count": 1}, "inners": [{"count": 1}, {"count": 2}], "maybe_inner": {"count": 3}, "figures": [1, 2.5],
}


def read(values: dict[str, Any], *, nested: bool = True) -> EveryKind:
    return read_object(EveryKind, values, "every", nested=nested)


def test_values_of_the_declared_types_are_read_as_declared():
    got = read(GOOD)
    assert got.inner == Inner(1) and got.inners == [Inner(1), Inner(2)] and got.maybe_inner == Inner(3)
    assert got.counts_by_name == {"a": 1} and got.anything_by_name == {"a": [{"b": None}]}
    assert got.figures == [1.0, 2.5] and isinstance(got.figures[0], float)  # in a payload an int is read as a float


@pytest.mark.parametrize("name, value, reason", [
    ("text", 1, "every.text: expected str, got int"),
    ("count", "1", "every.count: expected int, got str"),
    ("count", 1.5, "every.count: expected int, got float"),
    ("count", True, "every.count: expected int, got a boolean"),
    ("figure", "0.5", "every.figure: expected float, got str"),
    ("figure", None, "every.figure: expected float, got null"),
    ("flag", 1, "every.flag: expected bool, got int"),
    ("maybe_count", 0.5, "every.maybe_count: expected int or null, got float"),
    ("scalar", [1], "every.scalar: expected str or int or float or bool or null, got list"),
    ("scalar", {}, "every.scalar: expected str or int or float or bool or null, got dict"),
    ("any_list", {}, "every.any_list: expected list, got dict"),
    ("any_dict", [], "every.any_dict: expected dict, got list"),
    ("names", "a", "every.names: expected list, got str"),
    ("names", ["a", 2], "every.names[1]: expected str, got int"),
    ("counts_by_name", ["a"], "every.counts_by_name: expected dict, got list"),
    ("counts_by_name", {"a": "1"}, "every.counts_by_name.a: expected int, got str"),
    ("anything_by_name", "a", "every.anything_by_name: expected dict, got str"),
    ("inner", [1], "every.inner: expected dict, got list"),
    ("inner", {"count": "1"}, "every.inner.count: expected int, got str"),
    ("inner", {"count": 1, "more": 2}, "every.inner: unknown field(s) more"),
    ("inner", {}, "every.inner: missing field 'count'"),
    ("inners", [{"count": 1}, 2], "every.inners[1]: expected dict, got int"),
    ("maybe_inner", 3, "every.maybe_inner: expected dict or null, got int"),
    ("figures", [1, None], "every.figures[1]: expected float, got null"),
], ids=lambda value: value if isinstance(value, str) and value.startswith("every") else "")
def test_a_value_of_another_type_is_refused_with_its_path(name, value, reason):
    with pytest.raises(UnreadableValue) as refused:
        read({**GOOD, name: value})
    assert str(refused.value) == reason


def test_in_a_payload_every_number_is_finite_and_of_64_bits_and_a_messages_own_int_is_kept_as_it_came():
    with pytest.raises(UnreadableValue, match=r"every.figure: inf is not a finite number"):
        read({**GOOD, "figure": float("inf")})
    with pytest.raises(UnreadableValue, match=r"every.counts_by_name.a: .* is out of range \(at most 64 bits\)"):
        read({**GOOD, "counts_by_name": {"a": 2**64}})
    as_message = read({**GOOD, "figure": 10**30}, nested=False)  # a message's ints are not bounded: float() could overflow
    assert as_message.figure == 10**30 and isinstance(as_message.figure, int)


def test_read_value_reads_a_list_of_payloads_as_one_nested_in_a_message():
    assert read_value(list[Inner], [{"count": 2}], "x") == [Inner(2)]
    with pytest.raises(UnreadableValue, match=r"^x\[0\]\.count: expected int, got str$"):
        read_value(list[Inner], [{"count": "2"}], "x")


def test_the_schema_has_each_field_once_as_its_annotation_says():
    schema = EveryKind.schema
    assert list(schema) == [spec.name for spec in dataclasses.fields(EveryKind)]
    assert schema["maybe_count"] == (int, type(None))
    assert schema["scalar"] == (str, int, float, bool, type(None))
    assert schema["anything_by_name"] == (dict,)  # values not read: as a bare dict
    assert schema["maybe_inner"] == (Inner, type(None))


@dataclass(frozen=True)
class Unreadable(JsonObject):
    pair: tuple[int, int]


@dataclass(frozen=True)
class NotAJsonObject:
    count: int


@dataclass(frozen=True)
class NestsAPlainDataclass(JsonObject):
    inner: NotAJsonObject


@dataclass(frozen=True)
class NumberKeys(JsonObject):
    by_number: dict[int, str]


@pytest.mark.parametrize("kind", [Unreadable, NestsAPlainDataclass, NumberKeys])
def test_an_annotation_no_json_value_is_read_as_is_a_type_error_at_once(kind):
    with pytest.raises(TypeError):
        schema_of(kind)


def test_every_message_and_payload_has_a_schema_made_from_its_annotations():
    kinds = [*p.Message.registry.values(), *rank_channel.RankMessage.registry.values()]
    kinds += [kind for _, kind in inspect.getmembers(payloads, inspect.isclass) if dataclasses.is_dataclass(kind)]
    for kind in kinds:
        assert list(kind.schema) == [spec.name for spec in dataclasses.fields(kind)], kind
