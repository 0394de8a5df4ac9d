"""Helpers for tests that watch real processes."""

from __future__ import annotations

import os
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs; a zombie (exited, not yet reaped) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "State:\tZ" not in status.read_text()


def forecasters_of(run_dir: Path) -> list[int]:
    """The pids of the forecaster processes of the run in ``run_dir`` that still run (their command line names it)."""
    from torchlab.core.engine.forecast.forecaster import FORECASTER_MODULE

    found = []
    for entry in Path("/proc").iterdir():
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if FORECASTER_MODULE.encode() in words and str(run_dir).encode() in words and alive(int(entry.name)):
            found.append(int(entry.name))
    return found
