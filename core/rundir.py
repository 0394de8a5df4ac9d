"""The run directory: what a run leaves behind, the same whether it ran headless or in the app.

    <run>/config.toml      resolved configuration at start
    <run>/metrics.jsonl    one JSON object per report
    <run>/events.jsonl     option changes, checkpoints, errors; each has event, step, time
    <run>/system.jsonl     telemetry samples: time, step, host, gpus, torch
    <run>/checkpoints/     step-NNNNNNN.pt and last.pt
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from torchlab.core import strict_json
from torchlab.core.errors import StorageError
from torchlab.core.observer import TrainerObserver


class RunDirectory(TrainerObserver):
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        self._metrics = open(self.path / "metrics.jsonl", "a", encoding="utf-8")
        self._events = open(self.path / "events.jsonl", "a", encoding="utf-8")
        self._system = open(self.path / "system.jsonl", "a", encoding="utf-8")
        self._system_lock = threading.Lock()  # samples arrive on the sampler's thread
        self._events_lock = threading.Lock()
        self.profiles = self.path / "profiles"

    def write_config(self, toml_text: str) -> None:
        (self.path / "config.toml").write_text(toml_text, encoding="utf-8")

    def on_metrics(self, record: dict[str, Any]) -> None:
        self._write(self._metrics, record)

    def on_event(self, record: dict[str, Any]) -> None:
        with self._events_lock:  # profile reports arrive from the profiler's background thread
            self._write(self._events, record)

    def record_error(self, message: str, *, step: int = 0, traceback: str = "") -> None:
        """An error from before the trainer could report it itself (a workload that cannot be built)."""
        self.on_event({"event": "error", "step": step, "time": time.time(), "message": message, "traceback": traceback})

    def on_telemetry(self, sample: dict[str, Any]) -> None:
        with self._system_lock:
            if not self._system.closed:
                try:
                    self._write(self._system, sample)
                except StorageError:  # the sampler's thread: the next metrics or event write reports it
                    self._system.close()

    def _write(self, handle: TextIO, record: dict[str, Any]) -> None:
        """One JSON line, flushed; a failure (disk full) becomes a StorageError naming the file."""
        try:
            handle.write(to_json_line(record))
            handle.flush()
        except OSError as error:
            raise StorageError(
                f"could not write {Path(handle.name).name} in {self.path}: {error.strerror or error}. "
                "The lines before it and the checkpoints are intact."
            ) from error

    def close(self) -> None:
        with self._events_lock, self._system_lock:
            for handle in (self._metrics, self._events, self._system):
                try:
                    handle.close()
                except OSError:  # what it could not flush was already reported by the write that failed
                    pass


def to_json_line(record: dict[str, Any]) -> str:
    """One line of strict JSON (NaN and Inf become null: other tools choke on the bare tokens)."""
    return strict_json.dumps(record) + "\n"


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
    """The run directory a ``--resume`` path belongs to (a run directory, or a file in its checkpoints/)."""
    if resume is None:
        return None
    resume = Path(resume)
    for candidate in (resume, resume.parent.parent if resume.is_file() else resume.parent):
        if (candidate / "config.toml").exists() and (candidate / "checkpoints").is_dir():
            return candidate
    return None


def choose_run_dir(run_dir: Path | None, resume: Path | None, runs_root: Path, label: str) -> Path:
    """``--run-dir`` if given; else the resumed run's own directory; else a new one under ``runs_root``."""
    return run_dir or run_dir_of_checkpoint(resume) or new_run_path(runs_root, label)
