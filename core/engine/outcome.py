"""How a trainer's run ended, for its launcher or supervisor; torch-free, so the rank channel carries it."""

from __future__ import annotations

from dataclasses import dataclass

from torchlab.core.wire.run_status import RunStatus


@dataclass(frozen=True)
class Relaunch:
    """A change that takes new rank processes (``RELAUNCHED_BY``: a world size, or how the ranks hold the model),
    ``option`` from ``previous`` to ``value``, in force from ``step``, asked for by ``source``; ``world_size`` new
    ranks start from the checkpoint of the step before."""

    option: str
    value: int | str
    previous: int | str
    step: int
    source: str
    world_size: int


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended: ``finished`` (all steps), ``stopped`` (on request), ``nonfinite``, ``failed``, or
    ``relaunch`` (checkpointed for a change that takes new ranks, which ``relaunch`` describes); one of ``OUTCOMES``."""

    status: RunStatus
    step: int
    message: str = ""
    relaunch: Relaunch | None = None
    #: for ``failed`` (and rank 0's ``usage``): the class of the error that ended it, where it is known (StorageError:
    #: a file of the run could not be written)
    error: type[BaseException] | None = None
    #: for ``stopped``: the signal that asked for the stop and the rank it reached ("SIGTERM to rank 1": a scheduler's
    #: warning, core/engine/parallel/preemption.py); empty where none did
    stopped_by: str = ""

    def failed_with(self, kind: type[BaseException]) -> bool:
        """Whether an error of ``kind`` (or of a subclass of it) ended the run."""
        return self.error is not None and issubclass(self.error, kind)
