"""A rank that holds the others back, as the protocol says it (core/analysis/stragglers.py judges it): the ``straggler``
event, and its sentence, which the app's log and a headless run say alike (``events.describe`` calls it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torchlab.core.units import format_seconds
from torchlab.core.wire.codec import Message


@dataclass(frozen=True)
class Straggler(Message):
    """Rank ``rank`` (on ``host``) has done more of its own work a step than the other ranks since ``since_step``:
    ``excess_s`` seconds a step more (the median over the verdict's window), ``step_share`` of a step, which every rank
    waits for at the gradients' sync; ``part``: the part of its work that makes most of it ("data wait", "batch copy",
    "forward", "optimizer"). ``cleared``: it no longer does."""

    type: ClassVar[str] = "straggler"
    step: int
    rank: int
    host: str
    excess_s: float
    step_share: float
    since_step: int
    part: str
    cleared: bool = False


def straggler_sentence(event: Straggler) -> str:
    """"straggler: rank 1 (node-b) 15.2 ms a step behind the others (31 % of each step) for 200 steps: its data wait"."""
    where = f" ({event.host})" if event.host else ""
    if event.cleared:
        return f"rank {event.rank}{where} no longer holds the others back"
    return (f"straggler: rank {event.rank}{where} {format_seconds(event.excess_s)} a step behind the others "
            f"({event.step_share * 100:.0f} % of each step) for {event.step - event.since_step:,} steps: its {event.part}; "
            "every rank waits for it at each gradient sync")
