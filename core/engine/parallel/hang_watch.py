"""A hang, explained: a step that has not reached its boundary after ``--hang-after`` times the run's usual step (and
at least HANG_MIN_S) has each rank write where it is into the run directory, and rank 0 say which rank is where.

A hang in a collective is invisible from any one rank: each waits for the others, and NCCL has no feature to name the
one that is late (NCCL#1324). Each rank runs this watch on a thread of its own: when its step overruns, it writes
``hangs/step-N/rank-R.txt``: a first line of JSON (its step, how long it has waited, the engine's own collectives it
entered and completed, numbered as every rank numbers them, and the innermost line of its training thread outside
torch) and then every thread's Python stack (``faulthandler``). Rank 0 waits a few seconds for the others' files
(the run directory is shared by the ranks: on one machine always, across nodes where ``--run-dir`` is on shared
storage, as a resume needs) and says, in one sentence, which ranks are at a place the others are not, with the run's
last checkpoint. The run waits on (a slow node may catch up) until the user chooses: a stop asked while the step is
hung (the app's, ``torchlab-tui stop``, a signal the process can take) cannot wait for a boundary that never comes,
so rank 0 ends the run at once (``end``: the run's end said to its observers, then the process leaves; the launcher,
ours or torchrun's, ends the other ranks), with no final checkpoint, naming the last; ``--on-hang end`` asks that
stop itself as soon as the hang is said.

Every collective a rank issued on the run's process group, DDP's gradient all_reduce and FSDP2's gathers included, is
counted by torch itself (c10d's sequence number for the group, which NCCL's Flight Recorder names collectives by), at
no cost to a step: each rank's file says how many it issued, and rank 0 names the ranks that issued fewer than the
others, which the others wait for. (A comm hook that counted DDP's buckets in Python cost 120 us a bucket on gloo,
6 % of a 4-bucket step: benchmarks/gradient_sync_cost.py.) On NCCL, the Flight Recorder's own dump
(``TORCH_NCCL_TRACE_BUFFER_SIZE``), which would name the kind of each, is not read yet.
"""

from __future__ import annotations

import faulthandler
import json
import os
import statistics
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from pathlib import Path

from torchlab.core.records.storage import create_file, make_folder
from torchlab.core.safe_open import UnsafeFileError, open_regular

#: No hang is called before a step has run this long, whatever its usual time (a GC pause, a loader's workers
#: starting again at an epoch's end take seconds).
HANG_MIN_S = 10.0
#: Steps of this process measured before a usual time is known (the first steps compile, warm up, allocate).
KNOWN_AFTER = 5
#: How long rank 0 waits for the other ranks' files before it says what it has.
GATHER_S = 5.0
POLL_S = 0.25


class HangWatch:
    """One rank's watch (see the module docstring). The training thread calls ``step_started`` and ``step_ended``
    (attribute stores), the engine's collectives ``entered`` and ``completed``; ``said`` gets rank 0's sentence;
    ``stop_asked`` says why a stop was asked (None: none) and ``end`` ends the run (rank 0) or leaves (another rank,
    which a signal reached: torchrun's agent ends the ranks with SIGTERM, which a rank stuck in Python would take as a
    stop and wait out) at a hung step for it; ``ends_at_once``: rank 0 ends it without waiting for one
    (``--on-hang end``)."""

    def __init__(self, rank: int, world_size: int, folder: Path, factor: float,
                 said: Callable[[int, float, str, Path], None], *, stop_asked: Callable[[], str | None],
                 end: Callable[[int, str], None], ends_at_once: bool) -> None:
        self.rank, self.world_size, self.folder, self.factor, self.said = rank, world_size, folder, factor, said
        self.stop_asked, self.end, self.ends_at_once = stop_asked, end, ends_at_once
        self.entered, self.completed, self.last_op = 0, 0, ""
        self._step, self._started_at, self._reported_step = 0, None, 0
        self._times: deque[float] = deque(maxlen=50)
        self._training_thread: int | None = None
        threading.Thread(target=self._watch, name="torchlab-hang-watch", daemon=True).start()

    def step_started(self, step: int) -> None:
        self._step, self._started_at, self._training_thread = step, time.monotonic(), threading.get_ident()

    def step_ended(self, seconds: float) -> None:
        self._started_at = None
        self._times.append(seconds)

    def enter(self, op: str) -> None:
        self.entered, self.last_op = self.entered + 1, op

    def complete(self) -> None:
        self.completed = self.entered

    def limit_s(self) -> float | None:
        """How long a step may run before it is a hang; None while the usual time is not known."""
        if len(self._times) < KNOWN_AFTER:
            return None
        return max(HANG_MIN_S, self.factor * statistics.median(self._times))

    def _watch(self) -> None:
        while True:
            time.sleep(POLL_S)
            started, step, limit = self._started_at, self._step, self.limit_s()
            if started is not None and step == self._reported_step:  # said, and still hung
                reason = self.stop_asked()  # on a rank but 0: a signal's (torchrun's agent ending the ranks, say)
                if reason is None and self.ends_at_once and self.rank == 0:
                    reason = "--on-hang end"
                if reason is not None:
                    self.end(step, reason)
                    return
            if started is None or limit is None or step == self._reported_step:
                continue
            waited = time.monotonic() - started
            if waited > limit:
                self._reported_step = step
                try:
                    self._write(step, waited)
                    if self.rank == 0:
                        self.said(step, waited, self._explain(step, waited), self.folder / "hangs" / f"step-{step:07d}")
                except (OSError, UnsafeFileError):
                    pass  # a full disk, a link where a file goes: the hang stays unexplained, the watch fails nothing

    def _write(self, step: int, waited: float) -> None:
        folder = make_folder(self.folder / "hangs" / f"step-{step:07d}")  # no link followed, as private as the run
        header = {"rank": self.rank, "step": step, "waited_s": round(waited, 1), "entered": self.entered,
                  "completed": self.completed, "op": self.last_op, "issued": issued_collectives(),
                  "where": self._where(), "pid": os.getpid()}
        with open(folder / f"rank-{self.rank}.txt", "w", opener=lambda path, flags: create_file(Path(path), flags)) as file:
            file.write(json.dumps(header) + "\n")
            file.flush()
            faulthandler.dump_traceback(file=file, all_threads=True)

    def _where(self) -> str:
        """The innermost line of the training thread outside torch: the user's code, or the engine's call into torch."""
        frame = sys._current_frames().get(self._training_thread)
        if frame is None:
            return "unknown"
        stack = [entry for entry in traceback.extract_stack(frame) if f"{os.sep}torch{os.sep}" not in entry.filename]
        if not stack:
            return "unknown"
        entry = stack[-1]
        short = "/".join(entry.filename.split(os.sep)[-2:])
        return f"{short}:{entry.lineno} in {entry.name}" + (f" (`{entry.line}`)" if entry.line else "")

    def _explain(self, step: int, waited: float) -> str:
        """Rank 0's sentence: each place the ranks are at, the ranks at it, the collectives they issued (torch's count)
        and the engine's collective one waits in; then the ranks behind, which issued fewer than the others."""
        folder = self.folder / "hangs" / f"step-{step:07d}"
        deadline = time.monotonic() + GATHER_S
        while len(list(folder.glob("rank-*.txt"))) < self.world_size and time.monotonic() < deadline:
            time.sleep(POLL_S)
        headers = []
        for path in sorted(folder.glob("rank-*.txt")):
            try:
                with open(path, opener=open_regular) as file:  # a rank's file, never a link or a FIFO in its place
                    headers.append(json.loads(file.readline()))
            except (OSError, ValueError, UnsafeFileError):
                continue
        places: dict[tuple, list[int]] = {}
        for header in headers:
            inside = header.get("entered") != header.get("completed")
            key = (header.get("where"), header.get("issued"), header.get("completed"), header.get("op") if inside else None)
            places.setdefault(key, []).append(header.get("rank"))
        parts = []
        for (where, issued, completed, op), ranks in sorted(places.items(), key=lambda item: len(item[1])):
            position = f"{issued:,} collectives issued" if isinstance(issued, int) else f"past collective #{completed}"
            parts.append(f"{_ranks(ranks)} at {where}, {position}" + (f", in {op}" if op is not None else ""))
        issued_by = {header.get("rank"): header.get("issued") for header in headers if isinstance(header.get("issued"), int)}
        behind = ""
        if len(set(issued_by.values())) > 1:  # the ranks that issued fewer are those the others wait for
            fewest = min(issued_by.values())
            late = sorted(rank for rank, issued in issued_by.items() if issued == fewest)
            behind = (f"; {_ranks(late)} {'is' if len(late) == 1 else 'are'} behind: the others wait in a collective "
                      f"{'it has' if len(late) == 1 else 'they have'} not issued")
        missing = sorted(set(range(self.world_size)) - {header.get("rank") for header in headers})
        absent = f"; no word from rank(s) {', '.join(map(str, missing))} in {GATHER_S:g} s" if missing else ""
        usual = statistics.median(self._times)
        return f"step {step} has run {waited:.0f} s, its steps {usual * 1000:.3g} ms: " + "; ".join(parts) + behind + absent


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(str(rank) for rank in sorted(ranks))


def issued_collectives() -> int | None:
    """The collectives this rank has issued on the run's process group, as torch counts them (c10d's sequence number
    for the group: every collective, DDP's and FSDP2's too); None where this torch or backend does not say."""
    try:
        import torch.distributed as dist

        return int(dist.distributed_c10d._get_default_group()._get_sequence_number_for_group())
    except (AttributeError, RuntimeError, ValueError, TypeError):
        return None
