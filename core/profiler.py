"""Profiler snapshots: profile the next K steps, then build the tables without making training wait.

The training thread only starts the profiler, marks step boundaries and stops it (cheap). A
background thread exports the Chrome trace (``profiles/<step>/trace.json``, C++, a fraction of a
second) and then waits on a child process, ``python -m torchlab.core.profile_tables``, that reads
the trace and writes ``table.txt``, ``table_by_shape.txt``, ``table.csv`` and ``table_by_shape.csv``.
``key_averages()`` in the trainer's own process took 3.2 s for five steps of tiny_gpt and, holding
the GIL, slowed the training steps beside it 6x; a process of its own does not compete for the GIL.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

#: A trace of many steps of a large model can take a while to read; past this the snapshot reports an error.
TABLES_TIMEOUT_S = 600


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
        report: dict[str, Any] = {
            "first_step": self.first_step + self.warmup, "last_step": last_step, "dir": str(self.directory),
        }
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._profile.export_chrome_trace(str(self.directory / "trace.json"))
            built = subprocess.run(
                [sys.executable, "-m", "torchlab.core.profile_tables", str(self.directory)],
                capture_output=True, text=True, timeout=TABLES_TIMEOUT_S,
            )
            if built.returncode != 0:
                last_line = (built.stderr.strip().splitlines() or [f"exit status {built.returncode}"])[-1]
                raise RuntimeError(f"building the tables from trace.json failed: {last_line}")
            report.update(json.loads(built.stdout))
        except Exception as error:  # a profiler failure must not end the run: it is reported instead
            report["error"] = f"{type(error).__name__}: {error}"
        report["build_s"] = round(time.perf_counter() - started, 3)
        self.on_ready(report)
