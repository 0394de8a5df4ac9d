"""Checkpoints written atomically, loaded without unpickling code, and the RNG state they carry.

A checkpoint is written to a temporary file in the same directory, fsynced, and renamed over its
final name, so a crash mid-write (``kill -9``, a full disk) leaves the previous checkpoint intact; a
failed write removes its temporary file, and one left by a killed process is removed by the next save. ``last.pt`` is a hard link to
the newest one, replaced atomically the same way. Loading uses ``weights_only=True``: a checkpoint
holds tensors and plain values, never objects that run code when read.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any

import torch

from torchlab.core.errors import ConfigError, StorageError
from torchlab.core.runtime import remove_abandoned_temporaries

FORMAT_VERSION = 1
_STEP_FILE = re.compile(r"^step-(\d{7,})\.pt$")
_TEMPORARY = re.compile(r"^\.(?:step-\d{7,}|last)\.pt\.tmp-(\d+)$")


def step_file_name(step: int) -> str:
    return f"step-{step:07d}.pt"


def save_checkpoint(directory: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    """Write ``step-NNNNNNN.pt`` and point ``last.pt`` at it; keep the newest ``keep`` step files."""
    directory = Path(directory)
    path = directory / step_file_name(step)
    temporary = directory / f".{path.name}.tmp-{os.getpid()}"
    remove_abandoned_temporaries(directory, _TEMPORARY)  # of writers killed mid-write
    try:
        with open(temporary, "wb") as handle:
            torch.save({"format": FORMAT_VERSION, **state}, handle)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise StorageError(
            f"could not write the checkpoint of step {step} in {directory}: {error.strerror or error}. "
            f"{_what_is_intact(directory)}"
        ) from error
    os.replace(temporary, path)
    link = directory / f".last.pt.tmp-{os.getpid()}"
    if link.exists():
        link.unlink()
    os.link(path, link)
    os.replace(link, directory / "last.pt")
    _fsync_directory(directory)
    _prune(directory, keep)
    return path


def checkpoint_file(path: Path) -> Path:
    """What ``--resume PATH`` names: a checkpoint file, or the newest one of a run directory or its
    checkpoints folder."""
    path = Path(path)
    if path.is_dir():
        for candidate in (path / "checkpoints" / "last.pt", path / "last.pt"):
            if candidate.exists():
                return candidate
        raise ConfigError(f"--resume {path}: no checkpoints/last.pt in that directory.")
    if not path.exists():
        raise ConfigError(f"--resume {path}: no such checkpoint file.")
    return path


def load_checkpoint(path: Path, map_location: torch.device | str = "cpu") -> dict[str, Any]:
    path = checkpoint_file(path)
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # a truncated or foreign file: say which and why
        raise ConfigError(f"--resume {path}: not a readable torchlab checkpoint ({type(error).__name__}: {error}).") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT_VERSION:
        raise ConfigError(f"--resume {path}: not a torchlab checkpoint of format {FORMAT_VERSION}.")
    return state


def capture_rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy
    except ImportError:
        return state
    kind, keys, position, has_gauss, cached = numpy.random.get_state()
    state["numpy"] = (kind, torch.from_numpy(keys.astype("int64")), position, has_gauss, cached)
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_as_tuples(state["python"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy

        kind, keys, position, has_gauss, cached = state["numpy"]
        numpy.random.set_state((kind, keys.numpy().astype("uint32"), position, has_gauss, cached))


def _as_tuples(value: Any) -> Any:
    """``random.setstate`` wants tuples; a round trip through a checkpoint may give lists."""
    if isinstance(value, (list, tuple)):
        return tuple(_as_tuples(item) for item in value)
    return value


def _what_is_intact(directory: Path) -> str:
    last = directory / "last.pt"
    if not last.exists():
        return "No earlier checkpoint of this run exists."
    newest = max((p for p in directory.iterdir() if _STEP_FILE.match(p.name)), default=None)
    name = newest.name if newest is not None and os.path.samefile(newest, last) else "last.pt"
    return f"The previous checkpoint ({name}, which last.pt points at) is intact: free space, then resume from it."


def _prune(directory: Path, keep: int) -> None:
    step_files = sorted(p for p in directory.iterdir() if _STEP_FILE.match(p.name))
    for old in step_files[:-keep]:
        old.unlink()


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
