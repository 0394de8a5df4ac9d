"""Profiler snapshots: profile the next K steps, then build the tables without making training wait.

The training thread only starts the profiler, marks step boundaries and stops it (cheap). A
background thread exports the Chrome trace (``profiles/<step>/trace.json``, C++, a fraction of a
second) and then waits on a child process, ``python -m torchlab.core.engine.measure.profile_tables``, that reads
the trace and writes ``table.txt``, ``table_by_shape.txt``, ``table.csv`` and ``table_by_shape.csv``.
All of it is written into a hidden staging folder renamed to ``profiles/<step>`` once complete: a full
disk mid-profile leaves nothing behind, and the ``profile`` event carries the error instead of tables.
In a private run directory the folders are 0700 and the files 0600, as everywhere in it (core/records/storage.py).
``key_averages()`` in the trainer's own process took 3.2 s for five steps of tiny_gpt and, holding
the GIL, slowed the training steps beside it 6x; a process of its own does not compete for the GIL.

``Profiling`` is the trainer's side: a ``profile`` command starts a snapshot (one at a time, rank 0's),
each step boundary marks it, and the run waits for the tables being built before it ends.
"""

from __future__ import annotations

import errno
import json
import gc
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from torchlab.core.engine.measure.profile_tables import EXIT_STORAGE
from torchlab.core.errors import StorageError, shown
from torchlab.core.records.settings import MAX_PROFILE_STEPS
from torchlab.core.records.storage import fsync_directory, make_folder, match_folder_privacy, remedy, storage_error
from torchlab.core.wire import protocol as p
from torchlab.core.wire.events import ProfileStarted
from torchlab.core.wire.communication import CommunicationShare
from torchlab.core.wire.runtime import process_running
from torchlab.core.wire.typed_json import read_object

#: A trace of many steps of a large model can take a while to read; past this the snapshot reports an error.
TABLES_TIMEOUT_S = 600
#: A file system with less free space than this, just after the trace failed to export, was full.
_FULL_BELOW_BYTES = 1 << 20
_STAGING = re.compile(r"^\.\d{7,}\.tmp-(\d+)(?:-replaced)?$")


class Profiling:
    """The run's profiler snapshots: at most one recording (``recording``), and the tables of the finished ones
    being built on their threads. Events go to ``emit``."""

    def __init__(self, device: torch.device, directory: Path | None, emit: Callable[[p.Message], None]) -> None:
        self.device, self.directory, self.emit = device, directory, emit
        self.recording: ProfilerSnapshot | None = None
        self._builds: list[threading.Thread] = []

    def start(self, command: p.ProfileCommand, step: int) -> None:
        """Profile ``command.steps`` steps from ``step``, or refuse with the reason."""
        reason = None
        if self.recording is not None:
            reason = f"a profile is already recording (from step {self.recording.first_step})"
        elif self.directory is None:
            reason = "this run has no directory to write profiles to"
        elif not 1 <= command.steps <= MAX_PROFILE_STEPS:
            reason = f"profile steps must be from 1 to {MAX_PROFILE_STEPS}, got {shown(command.steps)}"
        if reason is not None:
            self.emit(p.OptionRefused(step=step, option="profile", value=command.steps, reason=reason, source=command.source))
            return
        self.recording = ProfilerSnapshot(self.device, self.directory / f"{step:07d}", step, command.steps, on_ready=self._ready)
        self.emit(ProfileStarted(step=step, steps=command.steps, warmup=1, source=command.source))

    def after_step(self, step: int) -> None:
        """Mark the boundary after ``step``; a complete recording goes on to build its tables in the background."""
        if self.recording is not None and self.recording.after_step(step):
            self._builds.append(self.recording.builder)
            self.recording = None

    def abandon(self) -> None:
        """The run ended mid-recording: nothing complete to report."""
        if self.recording is not None:
            self.recording.abandon()
            self.recording = None

    def wait_for_builds(self) -> None:
        """A snapshot the user asked for is worth the wait (and holds its files until it is built)."""
        for builder in self._builds:
            builder.join()
        self._builds.clear()

    def _ready(self, report: dict[str, Any]) -> None:
        """Called on the profiler's background thread once the tables are written."""
        if report.get("communication") is not None:  # the child's JSON, as the payload it is
            report = {**report, "communication": read_object(CommunicationShare, report["communication"], "communication",
                                                             nested=True)}
        self.emit(p.ProfileReady(**report))


class ProfilerSnapshot:
    """One snapshot: ``warmup`` steps discarded, then ``steps`` steps recorded, from ``first_step`` on."""

    def __init__(
        self,
        device: torch.device,
        directory: Path,
        first_step: int,
        steps: int,
        on_ready: Callable[[dict[str, Any]], None],
        warmup: int = 1,
    ) -> None:
        self.device = device
        self.directory = Path(directory)
        self.first_step = first_step
        self.steps = steps
        self.warmup = warmup
        self.on_ready = on_ready
        activities = [ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self._profile = profile(
            activities=activities,
            schedule=schedule(wait=0, warmup=warmup, active=steps, repeat=1),
            record_shapes=True,
            profile_memory=True,
        )
        self._steps_seen = 0
        self.builder: threading.Thread | None = None
        self._profile.start()

    def after_step(self, step: int) -> bool:
        """Mark a step boundary; True once the recording is complete (the tables then build in the background)."""
        self._profile.step()
        self._steps_seen += 1
        if self._steps_seen < self.warmup + self.steps:
            return False
        self._profile.stop()
        self.builder = threading.Thread(target=self._build, args=(step,), name="torchlab-profile-tables", daemon=True)
        self.builder.start()
        return True

    def abandon(self) -> None:
        """Stop recording without building tables (the run ended before the snapshot was complete)."""
        self._profile.stop()

    def _build(self, last_step: int) -> None:
        started = time.perf_counter()
        first_step = self.first_step + self.warmup
        report: dict[str, Any] = {"first_step": first_step, "last_step": last_step, "dir": str(self.directory)}
        staging = self.directory.with_name(f".{self.directory.name}.tmp-{os.getpid()}")
        try:
            report.update(self._write(staging))
        except OSError as error:  # a full disk: nothing of this profile is kept, the run goes on
            report["error"] = str(storage_error(
                error, f"the profile of steps {first_step}–{last_step} in {self.directory}",
                f"none of it was kept, and training goes on: {remedy(error)}, then profile again.",
            ))
        except Exception as error:  # a profiler failure must not end the run: it is reported instead
            report["error"] = f"{type(error).__name__}: {error}"
        finally:
            if staging.exists():  # what a failed write left: nothing of a failed profile stays
                try:
                    shutil.rmtree(staging)
                except OSError as error:
                    report["error"] = f"{report.get('error', 'the profile')}; {staging} could not be removed: {error}"
        report["build_s"] = round(time.perf_counter() - started, 3)
        try:
            self.on_ready(report)
        except StorageError:  # the report could not be journaled: not this thread's to stop the run; the
            pass  # run directory kept the failure and raises it on the training thread at its next journal line

    def _write(self, staging: Path) -> dict[str, Any]:
        """The trace and the tables, written into ``staging`` and then renamed to the snapshot's folder, so
        that the folder appears whole or not at all; the tables' top rows."""
        make_folder(self.directory.parent)
        _remove_abandoned_folders(self.directory.parent)
        make_folder(staging)
        trace = staging / "trace.json"
        self._profile.export_chrome_trace(str(trace))
        # Let the recording go: after a failed export its results hold the half-written trace open (a
        # full disk stays full until they are freed), and, either way, much memory. They sit in reference
        # cycles, so they are freed at the collector's next pass, whenever that comes: collect them now.
        self._profile = None
        gc.collect()
        if not trace.exists():  # the exporter logs its failure on stderr and returns as if it had written it
            raise _export_failure(staging)
        match_folder_privacy(trace)  # torch created it with the umask's mode
        built = subprocess.run(
            [sys.executable, "-m", "torchlab.core.engine.measure.profile_tables", str(staging)],
            capture_output=True, text=True, timeout=TABLES_TIMEOUT_S,
        )
        if built.returncode == EXIT_STORAGE:
            failure = json.loads(built.stdout)
            raise OSError(failure["errno"], failure["strerror"], failure["file"])
        if built.returncode != 0:
            last_line = (built.stderr.strip().splitlines() or [f"exit status {built.returncode}"])[-1]
            raise RuntimeError(f"building the tables from trace.json failed: {last_line}")
        tables = json.loads(built.stdout)
        _publish(staging, self.directory)
        return tables


def _export_failure(staging: Path) -> OSError:
    """Why the trace is not there. torch does not say; a full file system is the cause we can see."""
    space = os.statvfs(staging)
    if space.f_bavail * space.f_frsize < _FULL_BELOW_BYTES:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(staging / "trace.json"))
    return OSError(errno.EIO, "torch.profiler could not write trace.json (it says why only on the terminal)",
                   str(staging / "trace.json"))


def _publish(staging: Path, final: Path) -> None:
    """Rename ``staging`` to ``final``, replacing a folder of the same step (an earlier process of this run
    profiled that step too, before a resume)."""
    if final.exists():
        replaced = final.with_name(f".{final.name}.tmp-{os.getpid()}-replaced")
        os.rename(final, replaced)
        try:
            os.rename(staging, final)
        except OSError:
            os.rename(replaced, final)
            raise
        shutil.rmtree(replaced)
    else:
        os.rename(staging, final)
    fsync_directory(final.parent)


def _remove_abandoned_folders(profiles: Path) -> None:
    """The staging folders of trainers killed while writing a profile (their pid no longer runs)."""
    for candidate in profiles.iterdir():
        match = _STAGING.match(candidate.name)
        if match and candidate.is_dir() and not process_running(int(match.group(1))):
            shutil.rmtree(candidate, ignore_errors=True)
