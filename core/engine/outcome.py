"""How a trainer's run ended, for its launcher or supervisor; torch-free, so the rank channel carries it."""

from __future__ import annotations

from dataclasses import dataclass

from torchlab.core.wire.run_status import RunStatus


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
    ``relaunch`` (checkpointed for a change of world size, which ``relaunch`` describes); one of ``OUTCOMES``."""

    status: RunStatus
    step: int
    message: str = ""
    relaunch: WorldSizeChange | None = None
    #: for ``failed`` (and rank 0's ``usage``): the class of the error that ended it, where it is known (StorageError:
    #: a file of the run could not be written)
    error: type[BaseException] | None = None

    def failed_with(self, kind: type[BaseException]) -> bool:
        """Whether an error of ``kind`` (or of a subclass of it) ended the run."""
        return self.error is not None and issubclass(self.error, kind)
