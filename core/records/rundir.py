"""The run directory's journals and ``config.toml``: written as the trainer reports, and read back. What a run leaves
behind, the same whether it ran headless or in the app.

    <run>/config.toml              resolved configuration at start (a changed one on resume: the earlier
                                   one is kept as config.before-step-NNNNNNN.toml)
    <run>/metrics.jsonl            one JSON object per report, each step once
    <run>/metrics.replaced.jsonl   rows a resume replayed, moved aside from metrics.jsonl
    <run>/events.jsonl             option changes, checkpoints, errors; each has event, step, time
    <run>/system.jsonl             telemetry samples: time, step, host, gpus, torch
    <run>/checkpoints/             step-NNNNNNN.pt and last.pt

The folder itself (which one a run writes into, making it private, refusing one someone else could have prepared) is
core/records/rundir_folder.py's: ``RunDirectory`` opens the folder it makes or checks, and writes what is in it.

``metrics.jsonl`` takes a row as it comes while steps are slower than ``ROWS_WRITTEN_AT_ONCE_BELOW_S`` apart; faster
rows are held and written together (at most ``HELD_ROWS`` of them, none held over ``HELD_FOR_S``), and before any
event line: every event finds the rows reported before it written. Encoding and writing a row costs ~140 µs
between a step's kernels (on a 2-core VM, ~1.2 % of a 12 ms step) and ~30 µs in a batch; a run killed with
``kill -9`` loses at most the last quarter second of rows, and the row of a measured step whose next step had not yet
reached its transfer (it waits there for its update figures: core/engine/measure/update_probe.py), never a row of a step a
checkpoint holds: before one is written, the held rows are (``before_checkpoint``); the steps after the last
checkpoint, trained again on resume, write them anew.

Every line of every ``.jsonl`` file parses, after any fault: a line is written whole or not at all, and
a torn last line (a power cut) is cut off when the file is opened, with a ``journal_repaired`` event.
A failed write is a ``StorageError`` that names the file and says what is intact (core/records/storage.py).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from torchlab.core.errors import StorageError
from torchlab.core.records.rundir_folder import REPLACED_METRICS, create_run_dir
from torchlab.core.records.storage import (
    JsonLines, fsync_directory, parse_line, remedy, storage_error, temporary_name, write_atomically, write_new_file,
)
from torchlab.core.safe_open import open_regular
from torchlab.core.wire import strict_json
from torchlab.core.wire.events import JournalRepaired, MetricsMovedAside, ResumedFromCheckpoint
from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.wire.observer import TrainerObserver
from torchlab.core.wire.payloads import TelemetrySample
from torchlab.core.wire.protocol import Error, Message, TrialResult

#: Rows that come at least this far apart are written as they come (see the module docstring)...
ROWS_WRITTEN_AT_ONCE_BELOW_S = 0.05
#: ...faster ones are held, at most this many, none for longer than this.
HELD_ROWS = 32
HELD_FOR_S = 0.25
_UNTOUCHED = "and the checkpoints are untouched"


class RunDirectory(TrainerObserver):
    """Writes the run directory's journals as the trainer reports, and its ``config.toml``.

    A write that fails on a thread the failure cannot stop (the telemetry sampler's, the profiler's
    table builder's) is kept, and the next metrics row raises it: the run stops at its next journal line.
    """

    def __init__(self, path: Path, *, shared: bool = False) -> None:
        """Open the run directory at ``path``, making it (``shared``: see ``create_run_dir``) if it is new; a
        link on the way is followed once, here (``path`` is where it led)."""
        self.path = create_run_dir(Path(path), shared=shared)
        self.checkpoints = self.path / "checkpoints"
        self.profiles = self.path / "profiles"
        # One lock per journal: events also come from the profiler's builder thread, samples from the
        # sampler's. Only moving metrics aside holds two (metrics, then events); nothing takes them the other way.
        self._events_lock = threading.Lock()
        self._metrics_lock = threading.Lock()
        self._system_lock = threading.Lock()
        self._failure_lock = threading.Lock()
        self._failure: StorageError | None = None  # a failed write that no caller could act on yet
        self._held_rows: list[MetricsRow] = []  # reported, not yet written (under the metrics lock)
        self._held_since = 0.0  # when the first held row came
        self._last_row_at = -math.inf
        journals: list[JsonLines] = []
        try:
            for name in ("events.jsonl", "metrics.jsonl", "system.jsonl", "trials.jsonl"):
                journals.append(JsonLines(self.path / name, intact=_UNTOUCHED))
        except StorageError:
            for journal in journals:
                journal.close()
            raise
        self._events, self._metrics, self._system, self._trials = journals
        for journal in journals:
            self._report_repair(journal)

    # ----------------------------------------------------------------- config.toml
    def write_config(self, toml_text: str) -> None:
        write_atomically(self.path / "config.toml", toml_text)

    def replace_config(self, toml_text: str, step: int) -> Path:
        """Write a changed configuration, keeping the current ``config.toml`` as
        ``config.before-step-NNNNNNN.toml`` (``-2``, ``-3``, ... if that name is taken); the kept file's path.

        The new text is written to a temporary file first, so a full disk leaves ``config.toml`` as it was.
        """
        current = self.path / "config.toml"
        kept = self.path / f"config.before-step-{step:07d}.toml"
        number = 1
        while kept.exists():
            number += 1
            kept = self.path / f"config.before-step-{step:07d}-{number}.toml"
        staged = temporary_name(current)
        try:
            try:
                write_new_file(staged, toml_text.encode("utf-8"))
                os.rename(current, kept)
                try:
                    os.rename(staged, current)
                except OSError:
                    os.rename(kept, current)  # back as it was
                    raise
            except BaseException:
                staged.unlink(missing_ok=True)
                raise
            fsync_directory(self.path)
        except OSError as error:
            raise storage_error(error, f"config.toml in {self.path}",
                                f"config.toml is as it was: {remedy(error)}, then try again.") from error
        return kept

    # ----------------------------------------------------------------- journals
    def on_metrics(self, row: MetricsRow) -> None:
        if self._failure is not None:  # read without the lock (every row): taken only to take the failure
            with self._failure_lock:
                failure, self._failure = self._failure, None
            if failure is not None:
                raise failure
        now = time.monotonic()
        with self._metrics_lock:
            held = self._held_rows
            if not held:
                self._held_since = now
            held.append(row)
            if (now - self._last_row_at >= ROWS_WRITTEN_AT_ONCE_BELOW_S or len(held) >= HELD_ROWS
                    or now - self._held_since >= HELD_FOR_S):
                self._write_held_rows()
            self._last_row_at = now

    def _write_held_rows(self) -> None:
        """The held rows in one write (the metrics lock held). On a failure they are dropped with the rest of
        the write, as a row's own write would drop it: the StorageError says what is intact."""
        rows, self._held_rows = self._held_rows, []
        if rows:
            self._metrics.append_bytes("".join([to_json_line(row.json_object()) for row in rows]).encode("utf-8"))

    def write_held_rows(self) -> None:
        """Write the metrics rows held so far: before an event line, and where the journals close."""
        with self._metrics_lock:
            if not self._metrics.closed:
                self._write_held_rows()

    def before_checkpoint(self, step: int) -> None:
        self.write_held_rows()

    def on_event(self, event: Message) -> None:
        if not event.journalled:
            return
        try:
            self.write_held_rows()  # an event line finds every row reported before it written
            with self._events_lock:
                self._events.append(to_json_line(event.journal_record()))
                if isinstance(event, TrialResult):  # also on its own, for a script: one line per trial
                    self._trials.append(to_json_line(event.journal_record()))
        except StorageError as error:  # raised here too, but the caller may be the profiler's builder thread
            self._keep_failure(error)
            raise
        if isinstance(event, ResumedFromCheckpoint):  # before the first row of the resumed run lands
            self._move_replayed_metrics_aside(event.step)

    def record_error(self, message: str, *, step: int = 0, traceback: str = "") -> StorageError | None:
        """An error from before the trainer could report it itself (a workload that cannot be built).

        The caller shows that error; a journal that cannot take it must not hide it behind its own, so a
        failed write is returned (to mention, if the caller likes), not raised."""
        try:
            self.on_event(Error(step=step, message=message, traceback=traceback))
        except StorageError as error:
            return error
        return None

    def on_telemetry(self, sample: TelemetrySample) -> None:
        try:
            with self._system_lock:
                if self._system.closed:
                    return
                self._system.append(to_json_line(sample))
        except StorageError as error:  # the sampler's thread: the next metrics row raises it
            self._keep_failure(error)

    def leaving(self, status: str, step: int, message: str) -> None:
        """The process leaves without its run returning (a hang ended under torchrun): its journals closed, written."""
        self.close()

    def close(self) -> None:
        try:
            self.write_held_rows()  # none, after the run's last event; else the rows it reported since
        finally:
            self._close_journals()

    def _close_journals(self) -> None:
        for lock, journal in ((self._metrics_lock, self._metrics), (self._events_lock, self._events),
                              (self._events_lock, self._trials), (self._system_lock, self._system)):
            with lock:
                journal.close()

    def _keep_failure(self, error: StorageError) -> None:
        with self._failure_lock:
            self._failure = self._failure or error

    # ----------------------------------------------------------------- repairs
    def _report_repair(self, journal: JsonLines) -> None:
        if not journal.bytes_dropped:
            return
        last = journal.last_record() or {}
        step = last.get("step") if isinstance(last.get("step"), int) else 0
        self.on_event(JournalRepaired(
            step=step, file=journal.path.name, bytes_dropped=journal.bytes_dropped,
            message=f"{journal.path.name} ended in a torn line (a write cut short); its {journal.bytes_dropped} bytes were dropped",
        ))

    def _move_replayed_metrics_aside(self, step: int) -> None:
        """Move the rows after ``step`` (which the resumed run is about to train again) from the end of
        ``metrics.jsonl`` to the end of ``metrics.replaced.jsonl``, and say so in an event.

        Rows are in step order (this is what keeps them so), so the replayed ones are the file's tail:
        copied to the side file first, then cut off. A crash between the two leaves them in both files,
        never in neither; a resume at a step with no rows after it (a relaunch) changes nothing.
        """
        with self._metrics_lock:
            start, replayed = self._metrics.size(), []
            for offset, line in self._metrics.lines_from_end():
                row = parse_line(line)
                if row is None or not isinstance(row.get("step"), int) or row["step"] <= step:
                    break
                start = offset
                replayed.append(row["step"])
            if not replayed:
                return
            first, last = min(replayed), max(replayed)
            side_path = self.path / REPLACED_METRICS
            created = not side_path.exists()
            side = JsonLines(side_path, intact="and metrics.jsonl is as it was")
            try:
                self._report_repair(side)
                side.append_from(self._metrics, start, self._metrics.size())
            except StorageError:
                if created:  # nothing of this run's files changes but the journal's line
                    side_path.unlink(missing_ok=True)
                raise
            finally:
                side.close()
            try:
                self._metrics.truncate(start)
            except OSError as error:  # the copy is whole in the side file; metrics.jsonl still has the rows too
                raise storage_error(
                    error, f"metrics.jsonl in {self.path} (cutting off the rows of steps {first}–{last}, which this "
                    f"resume trains again)", f"they are in {REPLACED_METRICS} already: {remedy(error)}, then resume.",
                ) from error
        with self._events_lock:
            self._events.append(to_json_line(MetricsMovedAside(
                step=step, rows=len(replayed), first_step=first, last_step=last, file=REPLACED_METRICS,
                message=(f"the row of step {first}" if len(replayed) == 1 else
                         f"the {len(replayed)} rows of steps {first}–{last}") + f" in metrics.jsonl, which this resume "
                        f"trains again, {'was' if len(replayed) == 1 else 'were'} moved to {REPLACED_METRICS}",
            ).journal_record()))


def to_json_line(record: dict[str, Any]) -> str:
    """One line of strict JSON (NaN and Inf become null: other tools choke on the bare tokens)."""
    return strict_json.dumps(record) + "\n"


class SkippedLine(NamedTuple):
    """A line of a run's journal that its reader left out: its number, and why."""

    number: int
    reason: str


def rows_of(path: Path, skipped: list[SkippedLine] | None = None) -> Iterator[dict[str, Any]]:
    """Each row of a run's JSON-lines file (metrics.jsonl, events.jsonl) that has a step; a line that is not a
    JSON object (a write torn by a crash, which a resume repairs) is left out, as the app leaves it out, and so
    is one that torchlab never writes (nested too deep, a number out of range: ``strict_json.loads``). The line
    number of each line left out so, and why, is added to ``skipped``, for the reader to say. Read only from a
    regular file, not through a link (UnsafeFileError: core/safe_open.py)."""
    with open(path, encoding="utf-8", errors="replace", opener=open_regular) as handle:
        for number, line in enumerate(handle, start=1):
            try:
                row = strict_json.loads(line)
            except ValueError as error:
                if skipped is not None:
                    skipped.append(SkippedLine(number, str(error)))
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                yield row


def metrics_rows(path: Path, skipped: list[SkippedLine] | None = None) -> Iterator[MetricsRow]:
    """Each row of a run's ``metrics.jsonl`` (or ``metrics.replaced.jsonl``) read back as a ``MetricsRow``
    (``MetricsRow.from_json``: old lines too); a line that is none (torn by a crash, holding what torchlab never
    writes, or of another shape: a figure missing or of another type) is left out, and its number and why are
    added to ``skipped``, for the reader to say. Read only from a regular file, not through a link
    (UnsafeFileError: core/safe_open.py)."""
    with open(path, encoding="utf-8", errors="replace", opener=open_regular) as handle:
        for number, line in enumerate(handle, start=1):
            try:
                row = MetricsRow.from_json(strict_json.loads(line))
            except ValueError as error:  # UnreadableJson, UnreadableValue
                if skipped is not None:
                    skipped.append(SkippedLine(number, str(error)))
                continue
            yield row

