"""``torchlab-tui export RUN --tensorboard DIR --csv FILE``: a run's figures for other tools, from its files.

TensorBoard (the ``tensorboard`` extra): every metrics row's scalars, the option changes as text and the
profiler traces (core/engine/tensorboard.py). CSV: one flat file of the metrics (core/wire/csv_export.py).
The run may be training still: what its files hold now is exported.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from torchlab.core.launch.arguments import EXIT_OK, EXIT_USAGE
from torchlab.core.wire.csv_export import write_csv
from torchlab.core.wire.rundir import rows_of
from torchlab.core.wire.storage import unreadable_run
from torchlab.core.wire.errors import ConfigError, StorageError, TorchlabError


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
    try:
        with open(metrics, "rb"):  # another user's private run (0700): said here, before anything is written
            pass
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise ConfigError(f"{args.run}: no metrics.jsonl here; give a run directory (runs/<time>-<workload>)") from None
    except OSError as error:
        raise unreadable_run(args.run, error) from None
    if args.csv is not None:
        rows = write_csv(metrics, args.csv)
        print(f"{args.csv}: {rows} rows", file=sys.stderr)
    if args.tensorboard is not None:
        rows, changes, traces = export_tensorboard(args.run, args.tensorboard)
        print(f"{args.tensorboard}: {rows} rows, {changes} option changes, {traces} profiler traces; "
              f"tensorboard --logdir {args.tensorboard}", file=sys.stderr)
    return EXIT_OK


def export_tensorboard(run: Path, directory: Path) -> tuple[int, int, int]:
    """Every row, option change and profiler trace of ``run`` into event files under ``directory``."""
    from torchlab.core.engine.tensorboard import TensorBoardWriter  # imports torch

    writer = TensorBoardWriter(directory)
    rows = changes = traces = 0
    try:
        for row in rows_of(run / "metrics.jsonl"):
            writer.write_row(row)
            rows += 1
        for record in rows_of(run / "events.jsonl") if (run / "events.jsonl").is_file() else ():
            if record.get("event") == "option_applied":
                writer.write_option_change(record["step"], record.get("option", "?"), record.get("value"),
                                           record.get("previous"), record.get("source", ""))
                changes += 1
        for step, trace in completed_traces(run / "profiles"):
            writer.add_trace(step, trace)
            traces += 1
    except OSError as error:
        raise StorageError(f"--tensorboard {directory}: cannot be written: {error.strerror or error}.") from None
    finally:
        writer.close()
    return rows, changes, traces


def completed_traces(profiles: Path) -> list[tuple[int, Path]]:
    """(first profiled step, trace) of each complete profile: ``profiles/<the step before>/trace.json``. A hidden
    ``.<step>.tmp-<pid>`` folder is one a trainer was killed while writing (the profiler renames it when whole)."""
    if not profiles.is_dir():
        return []
    return [(int(folder.name) + 1, folder / "trace.json") for folder in sorted(profiles.iterdir())
            if folder.name.isdigit() and (folder / "trace.json").is_file()]
