"""Preemption: a scheduler's warning (SIGTERM, or SIGUSR1 where a scheduler is told to send it ahead, as Slurm's
``--signal``) to any rank stops every rank at the same step boundary, with one checkpoint.

A signal reaches one process: under ``torchrun`` each rank is a process of its own, on its own node, and a scheduler
may signal one of them or all. The rank it reached asks its step boundary to stop (``stop_on_signals``: a handler that
stores, safe in a signal handler); at the next boundary every rank says, in the packet they already exchange there
(core/engine/parallel/distributed.py ``share``), whether a signal asked it to stop, so all of them stop after the same
step, write the one final checkpoint together and exit; the run's outcome names the signal and the rank
(``stopped_by``), and the launchers say how to resume.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

#: The signals that stop a rank at its next boundary with a checkpoint (SIGINT is the terminal's: each launcher's own).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


def stopped_by(signal_number: int, rank: int | None) -> str:
    """The signal that asked for a stop, and the rank it reached where there are ranks: "SIGTERM to rank 1"."""
    try:
        name = signal.Signals(signal_number).name
    except ValueError:
        name = f"signal {signal_number}"
    return name if rank is None else f"{name} to rank {rank}"


def stop_reason(signal_number: int, rank: int | None) -> str:
    """The stop's reason, as the journal and the outcome say it (``stop_requested`` adds where and how: "at the end of
    this step, with a final checkpoint")."""
    return f"{stopped_by(signal_number, rank)}: {'every rank stops' if rank is not None else 'the run stops'}"


def stop_on_signals(request_stop: Callable[[str, int], None], rank: int | None) -> None:
    """Install the handlers: each of ``STOP_SIGNALS`` asks ``request_stop`` (an attribute store: safe in a handler) to
    stop at the next boundary, with the reason and the signal's number."""

    def handle(signal_number: int, _frame: object) -> None:
        request_stop(stop_reason(signal_number, rank), signal_number)

    for signal_number in STOP_SIGNALS:
        signal.signal(signal_number, handle)
