"""One walker of a state dict's nest (core/engine/nested_state.py) for a trial's snapshot, the spike guard's host copy
and FSDP2's whole tensors: what it makes anew, what it keeps, what it hands to ``rest``."""

from __future__ import annotations

from collections import OrderedDict, defaultdict, namedtuple

import torch

from torchlab.core.engine.nested_state import map_state


def test_containers_are_new_leaves_replaced_and_a_modules_metadata_carried_as_a_copy():
    weights = OrderedDict(w=torch.ones(2), b=torch.zeros(1))
    weights._metadata = OrderedDict({"": {"version": 1}})
    state = {"model": weights, "groups": [{"lr": 0.1, "params": [0, 1]}], "pair": (torch.ones(1), "x")}
    mapped = map_state(state, lambda value: isinstance(value, torch.Tensor), lambda tensor: tensor * 2)
    assert type(mapped["model"]) is OrderedDict and mapped["model"] is not weights
    assert torch.equal(mapped["model"]["w"], torch.full((2,), 2.0)) and torch.equal(weights["w"], torch.ones(2))
    assert mapped["model"]._metadata == weights._metadata and mapped["model"]._metadata is not weights._metadata
    assert mapped["groups"] == [{"lr": 0.1, "params": [0, 1]}] and mapped["groups"][0] is not state["groups"][0]
    assert type(mapped["pair"]) is tuple and mapped["pair"][1] == "x"


def test_what_is_not_a_plain_container_nor_a_leaf_goes_to_rest_whole():
    Point = namedtuple("Point", "x y")
    counts = defaultdict(int, a=1)
    seen = []
    mapped = map_state({"point": Point(1, 2), "counts": counts}, lambda value: False, lambda value: value,
                       rest=lambda value: seen.append(value) or value)
    assert seen == [Point(1, 2), counts] and mapped["counts"] is counts
    copied = map_state({"counts": counts}, lambda value: False, lambda value: value)  # rest: a deep copy
    assert copied["counts"] == counts and copied["counts"] is not counts
