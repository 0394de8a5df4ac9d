"""A state dict's nest walked one way for every part that copies, moves or gathers one (a trial's snapshot, the
spike guard's host copy, FSDP2's whole tensors for a checkpoint).

A state dict is dicts, lists and tuples around tensors and plain values. Its containers (of exactly those types:
an ``OrderedDict`` too, a namedtuple or a ``defaultdict`` not) are made anew, a module's ``_metadata`` carried over
as a copy (``load_state_dict`` reads its versions), each leaf replaced, and anything else given to ``rest``.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

_MAPPINGS = (dict, OrderedDict)
_SEQUENCES = (list, tuple)


def map_state(value: Any, is_leaf: Callable[[Any], bool], leaf: Callable[[Any], Any],
              rest: Callable[[Any], Any] = copy.deepcopy) -> Any:
    """``value`` with each leaf (where ``is_leaf``) replaced by ``leaf`` of it, its containers new, and each other
    value ``rest`` of it (a deep copy, unless given otherwise)."""
    if is_leaf(value):
        return leaf(value)
    kind = type(value)
    if kind in _MAPPINGS:
        mapped = kind((key, map_state(item, is_leaf, leaf, rest)) for key, item in value.items())
        if hasattr(value, "_metadata"):
            mapped._metadata = copy.deepcopy(value._metadata)
        return mapped
    if kind in _SEQUENCES:
        return kind(map_state(item, is_leaf, leaf, rest) for item in value)
    return rest(value)
