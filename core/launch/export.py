"""``torchlab-tui export RUN --tensorboard DIR --csv FILE``: a run's figures for other tools, from its files.

TensorBoard (the ``tensorboard`` extra): every metrics row's scalars, the option changes as text and the
profiler traces (core/engine/tensorboard.py). CSV: one flat file of the metrics (core/wire/csv_export.py).
The run may be training still: what its files hold now is exported.

A run may be someone else's (a run directory in ``/tmp``), and what is read of it is opened without
following a link, and only if it is a regular file (core/wire/safe_open.py). A ``metrics.jsonl`` that is a
link, a FIFO or a device stops the export in one paragraph (exit 2): there is nothing to export without it.
An ``events.jsonl``, a profile folder or a ``trace.json`` that is one is skipped with a line on stderr
naming it, and the rest is exported (exit 0): one planted link does not cost the user the run's figures.
A new ``--tensorboard`` folder is made 0700, and what is copied into it 0600.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from torchlab.core.launch.arguments import EXIT_OK, EXIT_USAGE
from torchlab.core.wire.csv_export import write_csv
from torchlab.core.wire.errors import ConfigError, StorageError, TorchlabError
from torchlab.core.wire.rundir import rows_of
from torchlab.core.wire.safe_open import UnsafeFileError, open_regular, require_real_folder
from torchlab.core.wire.storage import reason, unreadable_run

#: Says on stderr what was left out of an export, and goes on.
Warn = Callable[[UnsafeFileError], None]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="torchlab-tui export", description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="the run directory (runs/<time>-<workload>)")
    parser.add_argument("--tensorboard", type=Path, metavar="DIR", help="write TensorBoard event files to DIR")
    parser.add_argument("--csv", type=Path, metavar="FILE", help="write the metrics as one flat CSV file")
    args = parser.parse_args(argv)
    try:
        return _export(args)
    except TorchlabError as error:
        print(f"torchlab-tui export: {error}", file=sys.stderr)
        return EXIT_USAGE


def _export(args: argparse.Namespace) -> int:
    if args.tensorboard is None and args.csv is None:
        raise ConfigError("say what to write: --tensorboard DIR, --csv FILE, or both")
    metrics = args.run / "metrics.jsonl"
    require_metrics(args.run, metrics)
    if args.csv is not None:
        rows = write_csv(metrics, args.csv)
        print(f"{args.csv}: {rows} rows", file=sys.stderr)
    if args.tensorboard is not None:
        rows, changes, traces = export_tensorboard(args.run, args.tensorboard, warn=_say_skipped)
        print(f"{args.tensorboard}: {rows} rows, {changes} option changes, {traces} profiler traces; "
              f"tensorboard --logdir {args.tensorboard}", file=sys.stderr)
    return EXIT_OK


def require_metrics(run: Path, metrics: Path) -> None:
    """``metrics.jsonl`` is there, readable, and a regular file of its own: said before anything is written.
    A FIFO's open returns at once and is refused (a plain ``open`` waited for a writer for ever)."""
    try:
        os.close(open_regular(metrics))
    except (FileNotFoundError, NotADirectoryError):
        raise ConfigError(f"{run}: no metrics.jsonl here; give a run directory (runs/<time>-<workload>)") from None
    except OSError as error:  # another user's private run (0700)
        raise unreadable_run(run, error) from None


def export_tensorboard(run: Path, directory: Path, *, warn: Warn) -> tuple[int, int, int]:
    """Every row, option change and profiler trace of ``run`` into event files under ``directory`` (made 0700
    if new). An ``events.jsonl``, profile folder or trace that is a link or not a regular file is left out
    and passed to ``warn``."""
    from torchlab.core.engine.tensorboard import TensorBoardWriter  # imports torch

    try:
        make_private_folder(directory)
    except OSError as error:
        raise StorageError(f"--tensorboard {directory}: cannot be made: {reason(error)}.") from None
    writer = TensorBoardWriter(directory)
    rows = changes = traces = 0
    try:
        for row in rows_of(run / "metrics.jsonl"):
            writer.write_row(row)
            rows += 1
        for record in journal_rows(run / "events.jsonl", warn):
            if record.get("event") == "option_applied":
                writer.write_option_change(record["step"], record.get("option", "?"), record.get("value"),
                                           record.get("previous"), record.get("source", ""))
                changes += 1
        for step, trace in completed_traces(run / "profiles", warn):
            try:
                writer.add_trace(step, trace)
            except UnsafeFileError as refusal:
                warn(refusal)
                continue
            traces += 1
    except OSError as error:
        raise StorageError(f"--tensorboard {directory}: cannot be written: {reason(error)}.") from None
    finally:
        writer.close()
    return rows, changes, traces


def make_private_folder(directory: Path) -> None:
    """``directory`` made 0700 whatever the umask, unless it is there (then it keeps its mode); the folders
    above it that are missing follow the umask, as ``mkdir -p`` makes them."""
    if require_real_folder(directory):
        return
    directory.parent.mkdir(parents=True, exist_ok=True)
    os.mkdir(directory, 0o700)


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
    print(f"torchlab-tui export: skipped {refusal.path}: {refusal.kind}, {why}; the rest is exported", file=sys.stderr)
