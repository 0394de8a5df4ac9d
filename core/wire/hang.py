"""A hang, as the protocol says it (core/engine/parallel/hang_watch.py finds it): the ``hang`` event, which rank 0 sends
once a step has overrun the run's usual time by ``--hang-after``; its text says which rank is where."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torchlab.core.wire.codec import Message


@dataclass(frozen=True)
class Hang(Message):
    """Step ``step`` has not reached its boundary after ``waited_s`` seconds: ``explanation`` says where each rank is
    (the places the ranks are at, the engine's collectives each completed) and where their stacks were written
    (``folder``, in the run directory). The run goes on waiting."""

    type: ClassVar[str] = "hang"
    step: int
    waited_s: float
    explanation: str
    folder: str


def hang_sentence(event: Hang) -> str:
    """What the app's log and a headless run say: where each rank is, where their stacks are, what the user can do."""
    return (f"hang: {event.explanation}; each rank's Python stack in {event.folder}. The run waits: a slow node may "
            "catch up; if it never does, stop it (kill) and --resume from its last checkpoint")
