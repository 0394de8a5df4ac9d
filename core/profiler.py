"""Profiler snapshots: profile the next K steps, then build the tables without making training wait.

The training thread only starts the profiler, marks step boundaries and stops it (cheap). Exporting
the trace and ``key_averages()`` — which took 10+ s on a model with many small ops (perf-notes.md) —
run in a background thread that writes ``profiles/<step>/table.txt``, ``table.csv`` and
``trace.json`` (Chrome / Perfetto) and then reports the top rows.
"""

from __future__ import annotations

import csv
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from torchlab.core.profile_compare import compare_profiles  # noqa: F401  (re-exported: it was defined here)

TOP_ROWS = 50
_COLUMNS = (
    "name", "input_shapes", "calls", "self_cpu_us", "cpu_total_us", "self_device_us", "device_total_us",
    "self_cpu_memory_bytes", "self_device_memory_bytes",
)


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
            by_name = self._profile.key_averages()
            by_shape = self._profile.key_averages(group_by_input_shape=True)
            sort_key = "self_device_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
            (self.directory / "table.txt").write_text(by_name.table(sort_by=sort_key, row_limit=100))
            (self.directory / "table_by_shape.txt").write_text(by_shape.table(sort_by=sort_key, row_limit=100))
            rows = sorted((_row(event) for event in by_name), key=lambda r: -r[_SORT_COLUMN[sort_key]])
            shape_rows = sorted((_row(event, shapes=True) for event in by_shape), key=lambda r: -r[_SORT_COLUMN[sort_key]])
            _write_csv(self.directory / "table.csv", rows)
            report.update(rows=rows[:TOP_ROWS], rows_by_shape=shape_rows[:TOP_ROWS], sort=_SORT_COLUMN[sort_key])
        except Exception as error:  # a profiler failure must not end the run: it is reported instead
            report["error"] = f"{type(error).__name__}: {error}"
        report["build_s"] = round(time.perf_counter() - started, 3)
        self.on_ready(report)


_SORT_COLUMN = {"self_device_time_total": "self_device_us", "self_cpu_time_total": "self_cpu_us"}


def _row(event: Any, shapes: bool = False) -> dict[str, Any]:
    return {
        "name": event.key,
        "input_shapes": str(event.input_shapes) if shapes else "",
        "calls": event.count,
        "self_cpu_us": round(event.self_cpu_time_total, 3),
        "cpu_total_us": round(event.cpu_time_total, 3),
        "self_device_us": round(event.self_device_time_total, 3),
        "device_total_us": round(event.device_time_total, 3),
        "self_cpu_memory_bytes": event.self_cpu_memory_usage,
        "self_device_memory_bytes": event.self_device_memory_usage,
    }


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
