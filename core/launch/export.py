"""``torchlab-tui export RUN --tensorboard DIR --csv FILE [--force]``: a run's figures for other tools, from its files.

TensorBoard (the ``tensorboard`` extra): every metrics row's scalars, the option changes as text and the
profiler traces (core/engine/measure/tensorboard.py). CSV: one flat file of the metrics (core/records/csv_export.py).
The run may be training still: what its files hold now is exported.

The run may be someone else's, and so may the paths written to (issue 26). Its ``metrics.jsonl`` and the
paths written to are checked before anything is written:

- What is read of the run is opened without following a link, and only if it is a regular file
  (core/safe_open.py). A ``metrics.jsonl`` that is a link, a FIFO or a device stops the export in one
  paragraph (exit 2): there is nothing to export without it. An ``events.jsonl``, a profile folder or a
  ``trace.json`` that is one is skipped with a line on stderr naming it, and the rest is exported (exit 0):
  one planted link does not cost the user the run's figures.
- An export writes only to a new path, or to one that exists with ``--force``; never into a run directory
  (the exported run, or any folder holding a torchlab run: its ``metrics.jsonl``, or ``config.toml`` and
  ``checkpoints/``), not even with ``--force``: ``--csv RUN/metrics.jsonl`` once cut a 78 KB journal to a
  header line. Never through a link: a new ``--csv`` file is created ``O_EXCL | O_NOFOLLOW``, and
  ``--force`` renames a new file over the old name, a link included (core/records/export_files.py).
- ``--force`` replaces a regular file only (or a link's name, never what it points at): a FIFO or a device
  at the ``--csv`` path (``/dev/null`` as root) is refused, not replaced for everyone who uses it.
- Every folder written into meets the folder rule (core/safe_open.py ``who_else_may_change``): the folders on
  the way to ``--csv`` and ``--tensorboard`` are yours or root's and open to no one else unless sticky
  (``/tmp``), and a link on the way is yours or root's.
- ``--tensorboard DIR`` is a new folder, made 0700, or an existing one of the user's that no one else may
  write into (core/engine/measure/tensorboard.py ``make_tensorboard_folder``): TensorBoard names its event file by time,
  host and process and opens it itself, so a link put there first would be written through. A folder that
  holds files takes ``--force``, and TensorBoard then shows this export in place of what the folder held (the
  export's event file purges earlier steps). An export that fails there (a full disk) removes what it wrote,
  and the folders it made: a failed export leaves nothing behind.
- A path too long to be used (a name over 255 bytes) is one paragraph, as everywhere (``refuse_a_path_too_long``).
"""

from __future__ import annotations

import argparse
import errno
import os
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from torchlab.core.errors import EXIT_OK, ConfigError, StorageError, TorchlabError, exit_status, printable
from torchlab.core.launch.arguments import command_parser
from torchlab.core.records.csv_export import write_csv
from torchlab.core.records.option_history import option_history
from torchlab.core.records.rank_history import RANK_EVENTS
from torchlab.core.records.rundir import SkippedLine, metrics_rows, rows_of
from torchlab.core.records.storage import reason, unreadable_run
from torchlab.core.safe_open import (
    UnsafeFileError, kind_of, open_regular, refuse_a_path_too_long, require_real_folder, who_else_may_change,
)

#: Says on stderr what was left out of an export, and goes on.
Warn = Callable[[UnsafeFileError], None]


def main(argv: list[str]) -> int:
    parser = command_parser("export")
    parser.add_argument("run", type=Path, help="the run directory (runs/<time>-<workload>)")
    parser.add_argument("--tensorboard", type=Path, metavar="DIR", help="write TensorBoard event files to DIR")
    parser.add_argument("--csv", type=Path, metavar="FILE", help="write the metrics as one flat CSV file")
    parser.add_argument("--force", action="store_true", help="replace an existing FILE, write into a DIR holding files")
    args = parser.parse_args(argv)
    try:
        return _export(args)
    except TorchlabError as error:
        print(f"torchlab-tui export: {printable(error, keep_lines=True)}", file=sys.stderr)
        return exit_status(error)  # 2 for a refusal, 1 for a write that failed (a full disk)


def _export(args: argparse.Namespace) -> int:
    if args.tensorboard is None and args.csv is None:
        raise ConfigError("say what to write: --tensorboard DIR, --csv FILE, or both")
    refuse_a_path_too_long("run directory", args.run)
    metrics = args.run / "metrics.jsonl"
    require_metrics(args.run, metrics)
    if args.csv is not None:
        refuse_csv_target(args.csv, args.run, force=args.force)
    if args.tensorboard is not None:
        refuse_tensorboard_target(args.tensorboard, args.run, force=args.force)
    if args.csv is not None:
        skipped: list[SkippedLine] = []
        rows = write_csv(metrics, args.csv, replace=args.force, skipped=skipped)
        print(f"{printable(args.csv)}: {rows} rows{_left_out(skipped)}", file=sys.stderr)
    if args.tensorboard is not None:
        skipped = []
        rows, changes, traces = export_tensorboard(args.run, args.tensorboard, warn=_say_skipped, skipped=skipped)
        print(f"{printable(args.tensorboard)}: {rows} rows{_left_out(skipped)}, {changes} option changes, {traces} profiler "
              f"traces; tensorboard --logdir {printable(args.tensorboard)}", file=sys.stderr)
    return EXIT_OK


def _left_out(skipped: list[SkippedLine]) -> str:
    """`` (3 unreadable lines of metrics.jsonl skipped; line 7: ...)``: torn, or holding what torchlab never writes;
    the first one's reason is said."""
    if not skipped:
        return ""
    first = skipped[0]
    reason = repr(first.reason)[1:-1]  # a line someone else wrote may hold a terminal's escapes
    return f" ({len(skipped)} unreadable lines of metrics.jsonl skipped; line {first.number}: {reason})"


def require_metrics(run: Path, metrics: Path) -> None:
    """``metrics.jsonl`` is there, readable, and a regular file of its own: said before anything is written.
    A FIFO's open returns at once and is refused (a plain ``open`` waited for a writer for ever)."""
    try:
        os.close(open_regular(metrics))
    except (FileNotFoundError, NotADirectoryError):
        raise ConfigError(f"{run}: no metrics.jsonl here; give a run directory (runs/<time>-<workload>)") from None
    except OSError as error:  # another user's private run (0700)
        raise unreadable_run(run, error) from None


def refuse_csv_target(target: Path, run: Path, *, force: bool) -> None:
    """A ConfigError unless ``--csv target`` may be written: not in a run, new (or, with ``force``, a regular file
    or a link, whose name is replaced), not a folder, in folders no one else may change (the folder rule)."""
    refuse_a_path_too_long("--csv", target)
    refuse_a_run("--csv", target, target.parent, run, instead=f"--csv {beside_the_run(run, '.csv')}")
    status = _status("--csv", target)
    if status is not None:
        mode, link = status.st_mode, stat.S_ISLNK(status.st_mode)
        if stat.S_ISDIR(mode):
            raise ConfigError(f"--csv {target} is a folder: give the name of a new file in it, or elsewhere.")
        if not force:
            raise ConfigError(f"--csv {target} exists{' (a symbolic link)' if link else ''}: an export writes only to "
                              f"a new file. Give another name, or add --force to replace it"
                              f"{' (the link, not the file it points at)' if link else ''}.")
        if not (link or stat.S_ISREG(mode)):
            raise ConfigError(f"--csv {target} is {kind_of(mode)}: --force replaces a regular file only, never a FIFO "
                              "or a device, which others may be using (as root, --csv /dev/null --force would "
                              "replace /dev/null for everyone). Give the name of a new file.")
    try:
        fault = who_else_may_change(target.parent, sticky_is_enough=True)
    except OSError as error:
        raise ConfigError(f"--csv {target}: cannot be written: {reason(error)}.") from None
    if fault is not None:
        raise ConfigError(f"--csv {target} {fault}: they could take the file's name first, or swap the file once "
                          "written. Give a --csv path in a folder of yours (or in /tmp).")


def refuse_tensorboard_target(directory: Path, run: Path, *, force: bool) -> None:
    """A ConfigError unless ``--tensorboard directory`` may be written: not in a run; new, or a folder (not a
    link) of the user's that no one else may write into, in folders no one else may change (the folder rule,
    core/engine/measure/tensorboard.py), and empty unless ``force``."""
    from torchlab.core.engine.measure.tensorboard import refuse_an_unfit_tensorboard_folder  # no torch: that is imported later

    refuse_a_run("--tensorboard", directory, directory, run, instead=f"--tensorboard {beside_the_run(run, '-tensorboard')}")
    refuse_an_unfit_tensorboard_folder(directory, writer="an export")
    if not force and os.path.isdir(directory) and _holds_files("--tensorboard", directory):
        raise ConfigError(f"--tensorboard {directory} already holds files: an export writes into a new or empty "
                          "folder. Give another, or add --force to write into it (TensorBoard then shows this "
                          "export in place of what the folder held).")


def refuse_a_run(flag: str, target: Path, folder: Path, run: Path, *, instead: str) -> None:
    """A ConfigError if ``folder`` (where ``flag target`` writes) is the run ``run`` or in it, or is or is in
    any other folder holding a torchlab run. Paths are resolved: a link to a run is the run."""
    exported, real = _real(run), _real(folder)
    for above in (real, *real.parents):
        if above == exported:
            where = f"the run directory {run}" if above == _real(target) else f"in the run directory {run}"
        elif holds := run_evidence(above):
            where = f"in {above}, which holds a torchlab run (its {holds})"
        else:
            continue
        raise ConfigError(f"{flag} {target} is {where}: an export writes nothing into a run, whose own files it would "
                          f"replace. Give a path outside it, such as {instead}.")


def beside_the_run(run: Path, suffix: str) -> Path:
    """``/…/runs/<run><suffix>``, beside the run directory: where a refused export could go instead. Absolute, so
    that the suggestion reads the same from any working folder (relative where shorter, it differed between a
    checkout and its clone, and said ``../x.csv`` from inside the run)."""
    real = _real(run)
    return real.with_name(real.name + suffix)


def run_evidence(folder: Path) -> str | None:
    """What in ``folder`` shows that it holds a torchlab run, or None: its ``metrics.jsonl``, or a
    ``config.toml`` beside ``checkpoints/`` (a run that has not reported yet)."""
    if os.path.lexists(folder / "metrics.jsonl"):
        return "metrics.jsonl"
    if os.path.lexists(folder / "config.toml") and os.path.isdir(folder / "checkpoints"):
        return "config.toml and checkpoints/"
    return None


def _real(path: Path) -> Path:
    """``path`` with its links followed, as far as they go (a loop of links is left as it is, not an error)."""
    return Path(os.path.realpath(path))


def _holds_files(flag: str, directory: Path) -> bool:
    try:
        with os.scandir(directory) as entries:
            return any(entries)
    except OSError as error:
        raise ConfigError(f"{flag} {directory}: cannot be read: {reason(error)}.") from None


def _status(flag: str, path: Path) -> os.stat_result | None:
    """``os.lstat(path)``, None if nothing is there; a ConfigError naming ``flag`` if it cannot be seen."""
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as error:
        raise ConfigError(f"{flag} {path}: cannot be written: {reason(error)}.") from None


def export_tensorboard(run: Path, directory: Path, *, warn: Warn, skipped: list[SkippedLine] | None = None) -> tuple[int, int, int]:
    """Every row, option change and profiler trace of ``run`` into event files under ``directory`` (checked
    by ``refuse_tensorboard_target``; made 0700 if new, and judged again once made). An ``events.jsonl``, profile
    folder or trace that is a link or not a regular file is left out and passed to ``warn``; the lines of
    metrics.jsonl left out (``metrics_rows``) are added to ``skipped``. An export that fails (a full disk)
    removes what it wrote and the folders it made, and says so: a StorageError."""
    from torchlab.core.engine.measure.tensorboard import TensorBoardWriter, make_tensorboard_folder, remove_folders  # torch

    try:
        made = make_tensorboard_folder(directory, writer="an export")
    except OSError as error:
        raise StorageError(f"--tensorboard {directory}: cannot be made: {reason(error)}.") from None
    there_before = _entries_under(directory)
    rows = changes = traces = 0
    try:
        writer = TensorBoardWriter(directory, purge_step=0)  # hides what an earlier export (--force) wrote there
        try:
            for row in metrics_rows(run / "metrics.jsonl", skipped):
                writer.write_row(row)
                rows += 1
            for change in option_history(journal_rows(run / "events.jsonl", warn)):
                writer.write_option_change(change)
                changes += 1
            for record in journal_rows(run / "events.jsonl", lambda refusal: None):  # refused above, said once
                if record.get("event") == "compile_report":
                    writer.write_compile_report(record)
                elif record.get("event") in RANK_EVENTS:
                    writer.write_rank_event(record)
            for step, trace in completed_traces(run / "profiles", warn):
                try:
                    writer.add_trace(step, trace)
                except UnsafeFileError as refusal:
                    warn(refusal)
                    continue
                traces += 1
        finally:
            writer.close()  # raises a write that failed on TensorBoard's thread (a full disk) here, at the latest
    except BaseException as failure:
        _remove_entries_added(directory, there_before)
        remove_folders(made)
        if not isinstance(failure, OSError):
            raise
        full = failure.errno in (errno.ENOSPC, errno.EDQUOT)
        raise StorageError(f"--tensorboard {directory}: cannot be written: {reason(failure)}; what this export wrote "
                           f"there is removed{', and so are the folders it made' if made else ''}. "
                           f"{'Free some space, then export again' if full else 'Give another --tensorboard'}.") from None
    return rows, changes, traces


def _entries_under(directory: Path) -> set[str]:
    """Every path under ``directory``, relative to it (links not followed): what an export found there."""
    found = set()
    for folder, folders, files in os.walk(directory):
        for name in folders + files:
            found.add(os.path.relpath(os.path.join(folder, name), directory))
    return found


def _remove_entries_added(directory: Path, there_before: set[str]) -> None:
    """Remove what is under ``directory`` that was not there before the export (``_entries_under``), deepest
    first, never through a link. ``directory`` is the user's and no one else may write into it (the folder rule):
    what is new in it is the export's."""
    for name in sorted(_entries_under(directory) - there_before, key=lambda name: name.count(os.sep), reverse=True):
        path = directory / name
        try:
            if stat.S_ISDIR(os.lstat(path).st_mode):
                os.rmdir(path)
            else:
                os.unlink(path)
        except OSError:  # gone, or a folder not empty (what was there before): left as it is
            continue


def journal_rows(path: Path, warn: Warn) -> Iterator[dict]:
    """``rows_of(path)`` if it is a regular file; nothing if it is missing; nothing, and ``warn``, if it is a
    link, a FIFO or a device."""
    if not os.path.lexists(path):
        return
    try:
        os.close(open_regular(path))
    except UnsafeFileError as refusal:
        warn(refusal)
        return
    yield from rows_of(path)


def completed_traces(profiles: Path, warn: Warn) -> Iterator[tuple[int, Path]]:
    """(first profiled step, trace) of each complete profile: ``profiles/<the step before>/trace.json``. A hidden
    ``.<step>.tmp-<pid>`` folder is one a trainer was killed while writing (the profiler renames it when whole).
    A ``profiles`` or step folder that is a link is left out and passed to ``warn``; the trace is checked
    when it is copied."""
    try:
        if not require_real_folder(profiles):
            return
    except UnsafeFileError as refusal:
        warn(refusal)
        return
    for folder in sorted(profiles.iterdir()):
        if not folder.name.isdigit():
            continue
        try:
            require_real_folder(folder)
        except UnsafeFileError as refusal:
            warn(refusal)
            continue
        if os.path.lexists(folder / "trace.json"):
            yield int(folder.name) + 1, folder / "trace.json"


def _say_skipped(refusal: UnsafeFileError) -> None:
    why = ("which export never follows (it could point at any file of yours)" if refusal.kind == "a symbolic link"
           else "not a regular file")
    print(f"torchlab-tui export: skipped {printable(refusal.path)}: {refusal.kind}, {printable(why)}; the rest is exported", file=sys.stderr)
