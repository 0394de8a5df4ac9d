"""How a trainer's run ended, for its launcher or supervisor; torch-free, so the rank channel carries it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorldSizeChange:
    """A requested world size that takes a relaunch: in force from ``step``, asked for by ``source``."""

    value: int
    previous: int
    step: int
    source: str


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended: ``finished`` (all steps), ``stopped`` (on request), ``nonfinite``, ``failed``, or
    ``relaunch`` (checkpointed for a change of world size, which ``relaunch`` describes)."""

    status: str
    step: int
    message: str = ""
    relaunch: WorldSizeChange | None = None
    kind: str = ""  # for ``failed``: the class of the error ("StorageError": a file of the run could not be written)
