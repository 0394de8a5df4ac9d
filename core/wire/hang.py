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
    (``folder``, in the run directory); ``checkpoint``: the run's last checkpoint (its step, ``checkpoint_step``), what
    a resume starts from, "" where there is none. The run goes on waiting; a stop asked now ends it at once, with no
    final checkpoint (the ranks are stuck); ``ends``: ``--on-hang end`` asks that stop now."""

    type: ClassVar[str] = "hang"
    step: int
    waited_s: float
    explanation: str
    folder: str
    checkpoint: str = ""
    checkpoint_step: int | None = None
    ends: bool = False


def hang_sentence(event: Hang) -> str:
    """What the app's log and a headless run say: where each rank is, where their stacks are, what the user can do."""
    last = (f"its last checkpoint is step {event.checkpoint_step}'s, {event.checkpoint}" if event.checkpoint
            else "it has no checkpoint yet to resume from")
    choice = ("The run ends now (--on-hang end)" if event.ends else
              "The run waits: a slow node may catch up; a stop (q in the app, `torchlab-tui stop`, Ctrl-C headless) "
              "ends it now")
    return (f"hang: {event.explanation}; each rank's Python stack in {event.folder}. {choice}, with no final "
            f"checkpoint (its ranks are stuck): {last}")
