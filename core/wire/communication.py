"""The share of a profile's steps collectives ran with ranks, as the protocol says it (``ProfileReady.communication``:
core/engine/measure/profile_tables.py measures it), and its sentence, which a headless run prints and the app's
profile table shows alike."""

from __future__ import annotations

from dataclasses import dataclass

from torchlab.core.wire.typed_json import JsonObject


@dataclass(frozen=True)
class CollectiveTime(JsonObject):
    """How long one kind of collective (``all_gather``; NCCL's ``AllGather``) ran within a profile's steps, in µs."""

    kind: str
    us: float


@dataclass(frozen=True)
class CommunicationShare(JsonObject):
    """With ranks, how long collectives ran within a profile's steps (core/engine/measure/profile_tables.py
    ``communication_time``): ``us`` of the steps' ``steps_us``, ``share`` the one over the other, ``by_kind``
    largest first, ``source`` what timed them ("nccl kernels" on a GPU, "gloo" on the CPU). Each a union of
    intervals: two collectives at once count once in ``us``."""

    steps_us: float
    us: float
    share: float
    by_kind: list[CollectiveTime]
    source: str


def communication_sentence(communication: CommunicationShare | None) -> str | None:
    """A profile's communication share (``ProfileReady.communication``) in words, or None without ranks: one
    sentence that a headless run prints and the app's profile table shows, with the kinds of collective that
    read as 1 % of the steps or more (three at most) and what timed them in brackets. The kinds' shares need not
    add up to the whole: two kinds running at once count once in it."""
    if communication is None or communication.steps_us <= 0:  # no steps to take a share of (an edited line)
        return None
    steps_us = communication.steps_us
    kinds = ", ".join([f"{entry.kind} {_percent(entry.us / steps_us)}" for entry in communication.by_kind
                       if entry.us / steps_us >= 0.005][:3])
    detail = f"{kinds}; {communication.source}" if kinds else communication.source
    return f"communication {_percent(communication.share)} of the profiled steps' time ({detail})"


def _percent(fraction: float) -> str:
    return "<1 %" if 0 < fraction < 0.005 else f"{fraction * 100:.0f} %"
