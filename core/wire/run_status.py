"""Where a run is and how it ended, in one vocabulary: ``RunStatus``. Standard library only.

Every process says it with these words: the trainer's ``State`` and ``Welcome`` (core/wire/protocol.py), the
entry ``attach`` lists (core/wire/runtime.py), the app's header, a trainer's outcome for its launcher
(core/engine/outcome.py) and rank 0's for its supervisor (core/engine/ranks/channel_messages.py). A ``StrEnum``: each
member is the string it always was, so the wire, the runtime entries and the journals read as before, and a
member compares equal to the text a peer sent (``state == RunStatus.FAILED`` for a decoded ``State``).
"""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    """A run's state, or how its trainer's loop ended (``OUTCOMES``)."""

    #: the app's own: before the trainer's Welcome, and after it detached from the run
    CONNECTING = "connecting"
    DETACHED = "detached"
    #: what the trainer reports (State, Welcome, its entry in the runtime directory)
    STARTING = "starting"
    RUNNING = "running"
    PAUSED = "paused"
    RELAUNCHING = "relaunching"  # new ranks start for another world size
    FINISHED = "finished"
    STOPPED = "stopped"
    FAILED = "failed"
    #: an entry of the runtime directory whose trainer died without a last word (kill -9)
    GONE = "gone"
    #: how a loop can end besides finished, stopped and failed: no state says these, its launcher acts on them
    NONFINITE = "nonfinite"  # a NaN or Inf stopped it (the state says failed; the process exits 3)
    RELAUNCH = "relaunch"  # it checkpointed for a new world size: its supervisor starts the new ranks
    USAGE = "usage"  # rank 0 refused its setup (a setting, a workload): its supervisor raises that error again


#: A trainer's last words (in a State, a Welcome, its runtime entry): after one nothing trains or answers. Text a
#: peer or a file said is looked up here as it is (``state in FINAL_STATES``), a known state or not.
FINAL_STATES = (RunStatus.FINISHED, RunStatus.STOPPED, RunStatus.FAILED)

#: How a trainer's loop can end (``RunOutcome.status``; on the rank channel, ``Outcome.status``).
OUTCOMES = (RunStatus.FINISHED, RunStatus.STOPPED, RunStatus.NONFINITE, RunStatus.FAILED, RunStatus.RELAUNCH, RunStatus.USAGE)
