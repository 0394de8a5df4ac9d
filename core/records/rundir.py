"""The run directory: what a run leaves behind, the same whether it ran headless or in the app.

    <run>/config.toml              resolved configuration at start (a changed one on resume: the earlier
                                   one is kept as config.before-step-NNNNNNN.toml)
    <run>/metrics.jsonl            one JSON object per report, each step once
    <run>/metrics.replaced.jsonl   rows a resume replayed, moved aside from metrics.jsonl
    <run>/events.jsonl             option changes, checkpoints, errors; each has event, step, time
    <run>/system.jsonl             telemetry samples: time, step, host, gpus, torch
    <run>/checkpoints/             step-NNNNNNN.pt and last.pt

A run directory torchlab makes is private: 0700, and everything created in it 0600 (folders 0700),
whatever the umask, as ssh-keygen writes a private key. ``shared_run_dir`` (``--shared-run-dir``) makes
it follow the umask instead (0755 and 0644 under the usual 022), less others' write permission on its
folders (under umask 002 the folders are 0755, the files 0664). What is made in a folder follows that
folder (core/records/storage.py), so a resume keeps the run's choice, and a ``chmod`` of the directory since:
torchlab never changes the mode of a directory or file that exists. What torch makes in it follows too: the
ranks' logs (``ranks/``, core/engine/ranks/supervisor.py), a profile's ``trace.json``, a ``--tensorboard`` folder
inside the run (the event files in it are TensorBoard's, as a failing rank's ``error.json`` is torch's:
made with the umask's mode, inside folders no one else may enter).

A directory torchlab did not make may have been prepared by someone else (``/tmp/run1``, world-writable,
``trials.jsonl`` linked to a file of yours). A run writes only into a folder it made with ``mkdir``, or
into one that belongs to you, that no one else may write into, and whose folders above (and links on the
way) are yours or root's and open to no one else, unless sticky (``/tmp``): the folder rule every command
follows (core/safe_open.py ``who_else_may_change``), here ``refuse_an_unfit_run_dir``, checked before
a workload is loaded or the directory opened, and again where it is opened (``create_run_dir``). A new
run's ``--run-dir`` must also hold nothing but an untrained run of yours (or nothing), and be private unless
``--shared-run-dir``: ``/``, a home folder, ``/tmp`` are refused. A ``--run-dir``
that is a link (yours: it is your argument) is followed once, and the folder it leads to is checked and
used. Every file of a run is opened without following a link, and only if regular (core/safe_open.py).

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

import errno
import math
import os
import re
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from torchlab.core.errors import ConfigError, StorageError, shown
from torchlab.core.records.storage import (
    JsonLines, fsync_directory, make_folder, make_folders_above, parse_line, reason, remedy, storage_error, temporary_name,
    unreadable_run, write_atomically, write_new_file,
)
from torchlab.core.safe_open import (
    UnsafeFileError, kind_of, open_regular, refuse_a_path_too_long, who_else_may_change,
)
from torchlab.core.wire import strict_json
from torchlab.core.wire.events import JournalRepaired, MetricsMovedAside, ResumedFromCheckpoint
from torchlab.core.wire.metrics_row import MetricsRow
from torchlab.core.wire.observer import TrainerObserver
from torchlab.core.wire.payloads import TelemetrySample
from torchlab.core.wire.protocol import Error, Message, TrialResult

#: Where ``metrics.jsonl``'s rows that a resume replays go, so that the file holds each step once.
REPLACED_METRICS = "metrics.replaced.jsonl"
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


def new_run_path(root: Path, label: str) -> Path:
    """``root/<YYYYmmdd-HHMMSS>-<label>``, with a suffix if two runs start in the same second."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    safe_label = re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("._") or "run"
    path = Path(root) / f"{stamp}-{safe_label}"
    suffix = 1
    while path.exists():
        suffix += 1
        path = Path(root) / f"{stamp}-{safe_label}-{suffix}"
    return path


def run_dir_of_checkpoint(resume: Path | None) -> Path | None:
    """The run directory a ``--resume`` path belongs to (a run directory, or a file in its checkpoints/), None
    for a checkpoint elsewhere; the OSError of a run that cannot be looked into (another user's private one)."""
    if resume is None:
        return None
    resume = Path(resume)
    for candidate in (resume, resume.parent.parent if _is(resume, stat.S_ISREG, follow=True) else resume.parent):
        if _is(candidate / "config.toml", stat.S_ISREG) and _is(candidate / "checkpoints", stat.S_ISDIR):
            return candidate
    return None


def create_run_dir(path: Path, *, shared: bool = False) -> Path:
    """Make the run directory and its ``checkpoints/``, or say in one sentence why it cannot be one: a path
    that is a file (``--run-dir /etc/passwd``), under something that is not a folder, not writable, or a
    folder someone else could have prepared (``require_folder_only_you_change``). The directory's path: ``path``, or
    where it leads if a link is on the way (the run goes on there, whatever the link is changed to).

    A new run directory is made with ``mkdir``, 0700 (``shared``: 0755 less the umask); the folders above
    it that are missing (the runs root) follow the umask, as ``mkdir -p`` makes them, less others' write
    permission. One that was there already (``--run-dir``, a resume, or one someone made between choosing
    the name and making it) must be yours and no one else's to write into; it keeps its mode.
    """
    path = Path(path)
    real = _without_links(path)
    label = f"run directory {_named(path, real)}"
    try:
        if os.path.exists(real) and not os.path.isdir(real):  # mkdir says "File exists": true, but not the fault
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))
        require_folder_only_you_change(path, label, _MAKE_ONE)  # nothing made in a folder someone else may change
        make_folders_above(real)
        try:
            os.mkdir(real, 0o755 if shared else 0o700)
        except FileExistsError:  # there already, or made by someone else since the name was chosen
            pass
        require_folder_only_you_change(path, label, _MAKE_ONE)  # after mkdir: whoever made it, it is judged
        make_folder(real / "checkpoints")
    except OSError as error:
        where = error.filename if error.filename and str(error.filename) != str(real / "checkpoints") else path
        message = f"run directory {path}: cannot be made ({where}: {error.strerror or error})"
        if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO):
            raise StorageError(f"{message}: {remedy(error)}, then try again.") from None
        raise ConfigError(f"{message}; give --run-dir (or --runs-root) a folder you can write to.") from None
    return real


def choose_run_dir(run_dir: Path | None, resume: Path | None, runs_root: Path, label: str) -> Path:
    """``--run-dir`` if given; else the resumed run's own directory; else a new one under ``runs_root`` (a
    ConfigError if its name is too long: said here, where it is first used)."""
    chosen = run_dir or run_dir_of_checkpoint(resume)
    if chosen is not None:
        return chosen
    refuse_a_path_too_long("--runs-root", runs_root)
    return new_run_path(runs_root, label)


# ----------------------------------------------------------------------------- folders someone else may have made
#: The entries a run makes in its directory: a folder holding nothing else (or nothing) holds nothing but a run.
RUN_FILES = frozenset({"config.toml", "metrics.jsonl", REPLACED_METRICS, "events.jsonl", "system.jsonl",
                       "trials.jsonl", "impact.json", "trainer.log"})
RUN_FOLDERS = frozenset({"checkpoints", "profiles", "ranks"})
#: ``config.before-step-NNNNNNN.toml`` (a resume's), ``.NAME.tmp-PID`` (a write a kill cut short)
_MORE_RUN_FILES = re.compile(r"config\.before-step-\d+(-\d+)?\.toml|\..+\.tmp-\d+")

_MAKE_ONE = "Give another --run-dir, or make one with mkdir -m 700."


def refuse_an_unfit_run_dir(run_dir: Path | None, resume: Path | None, *, shared: bool = False) -> None:
    """Before the run directory is opened (and before a workload is loaded): the one this run would write into
    is yours and no one else's to write into; a new run's ``--run-dir`` holds nothing but an untrained run
    of yours, and is private unless ``shared``. One paragraph (ConfigError) saying how to go on, otherwise."""
    if run_dir is not None:
        refuse_a_path_too_long("--run-dir", run_dir)
    _refuse_a_run_dir_not_yours(run_dir, resume)
    _refuse_a_used_run_dir(run_dir, resume, shared=shared)


def _refuse_a_run_dir_not_yours(run_dir: Path | None, resume: Path | None) -> None:
    """The directory this run would write into, where it is there already (``--run-dir``, else the run
    directory of ``--resume``), is a folder of yours that no one else may write into, in folders no one else
    may swap it in (``require_folder_only_you_change``). A new directory under the runs
    root is checked where it is made (``create_run_dir``)."""
    if run_dir is not None:
        given, remedy = Path(run_dir), _MAKE_ONE
        real = _without_links(given)
        label = f"--run-dir {_named(given, real)}"
    else:
        try:
            given, remedy = run_dir_of_checkpoint(resume), "Give --run-dir DIR to continue it in a folder of yours."
        except OSError as error:  # another user's private run
            raise ConfigError(f"--resume {unreadable_run(resume, error)}") from None
        if given is None:
            return
        real, label = given, f"the run directory of --resume {resume}"
    try:
        if _is(real, stat.S_ISDIR, follow=True) or not os.path.lexists(real):  # anything else is refused where made
            require_folder_only_you_change(given, label, remedy)
    except OSError as error:
        raise _unusable(label, given, error) from None


def _refuse_a_used_run_dir(run_dir: Path | None, resume: Path | None, *, shared: bool) -> None:
    """A new run (no ``--resume``) goes into a ``--run-dir`` that holds nothing but an untrained run of yours
    (a directory made, never trained in) or nothing, and is private unless ``shared``.

    An earlier run's directory would get this run's rows appended to its journals (step 1 twice in
    ``metrics.jsonl``) and its checkpoints pruned; a home folder or ``/`` would get a run among its files; a
    folder others may enter would let them read the run without ``--shared-run-dir``. Each is refused,
    saying how to go on. Who owns it is ``_refuse_a_run_dir_not_yours``'s to check."""
    if run_dir is None or resume is not None:
        return
    run_dir = Path(run_dir)
    real = _without_links(run_dir)
    label = f"--run-dir {_named(run_dir, real)}"
    try:
        if not _is(real, stat.S_ISDIR, follow=True):
            return  # nothing there yet; or not a folder, which making it says
        _require_nothing_but_a_run(real, label)
        metrics = real / "metrics.jsonl"
        trained = (_is(metrics, stat.S_ISREG) and metrics.stat().st_size > 0) or _is(real / "checkpoints" / "last.pt", stat.S_ISREG)
        mode = stat.S_IMODE(os.stat(real).st_mode)
    except OSError as error:
        raise _unusable(label, run_dir, error) from None
    if trained:
        raise ConfigError(
            f"--run-dir {run_dir} already holds a run (its metrics and checkpoints): a new run there would mix "
            f"its rows with that run's and prune its checkpoints. Continue it with --resume {run_dir}, or give "
            f"another --run-dir."
        )
    if mode & 0o077 and not shared:
        raise ConfigError(
            f"{label} is open to other users (mode {mode:04o}), and a run is private unless --shared-run-dir: "
            f"chmod 700 {run_dir} first, or give --shared-run-dir to let them read it."
        )


def require_folder_only_you_change(folder: Path, label: str, remedy: str) -> None:
    """The folder rule (``who_else_may_change``, core/safe_open.py) for a run directory, said as a run's
    refusal: ConfigError. ``folder`` (as given: a link on the way is judged, then followed), where it is there,
    is a folder that belongs to you and that no one else may write into: only then is what is in it yours. In
    another user's folder, or one others may write into (``/tmp/run1`` made ``mkdir -m 777``), ``trials.jsonl``
    can be a link to a file of yours, or be swapped for one between two writes. Other users may read it where
    you chose so (``--shared-run-dir``). The folders above it are yours or root's, and only sticky ones
    (``/tmp``) open to others: whoever may rename entries in a folder above could move the run directory away
    mid-run and put a folder of theirs in its place."""
    real = _without_links(folder)
    if os.path.lexists(real):
        mode = os.lstat(real).st_mode
        if not stat.S_ISDIR(mode):
            raise UnsafeFileError(real, kind_of(mode), expected="a folder")
    fault = who_else_may_change(folder)
    if fault is None:
        return
    if fault.where != "itself":
        raise ConfigError(f"{label} {fault}: they could put a folder of theirs in its place. "
                          "Give a --run-dir (or --runs-root) in a folder of yours.")
    if fault.theirs:
        raise ConfigError(f"{label} {fault}, not to you: torchlab writes a run only into a folder of yours, which "
                          f"no one else can have prepared. {remedy}")
    raise ConfigError(f"{label} {fault}: they could swap its files for links to yours. {remedy}")


def _require_nothing_but_a_run(folder: Path, label: str) -> None:
    """Every entry of ``folder`` is one a run makes (a link or FIFO among them is refused where it is opened)."""
    foreign = sorted(name for name in os.listdir(folder)
                     if name not in RUN_FILES and name not in RUN_FOLDERS and not _MORE_RUN_FILES.fullmatch(name))
    if foreign:
        listed = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise ConfigError(f"{label} holds files that are not a run's ({listed}): a new run goes into an empty folder "
                          "or one that holds an unfinished run of yours. Give another --run-dir, or leave it out for a "
                          "new one under the runs root.")


def _is(path: Path, kind, *, follow: bool = False) -> bool:
    """Whether something of ``kind`` (``stat.S_ISDIR``...) is at ``path``, itself (``follow``: where a link
    leads); False where nothing is. Any other OSError (no permission, a name too long) propagates."""
    try:
        return kind((os.stat if follow else os.lstat)(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def _without_links(path: Path) -> Path:
    """``path``, or where it leads if a link is on its way: the folder checked is the folder used."""
    real = Path(os.path.realpath(path))
    return path if real == Path(os.path.abspath(path)) else real


def _named(given: Path, real: Path) -> str:
    return str(given) if given == real else f"{given} (a link to {real})"


def _unusable(label: str, run_dir: Path, error: OSError) -> ConfigError:
    """A run directory that cannot even be looked at, in one sentence: a name too long (only a ``--run-dir``
    can be: the others were found), no permission..."""
    if error.errno == errno.ENAMETOOLONG:
        return ConfigError(f"--run-dir {shown(str(run_dir))}: a name in it is longer than the 255 bytes a file name "
                           "may have: give a shorter --run-dir.")
    return ConfigError(f"{label}: cannot be used ({reason(error)}); give another --run-dir.")
