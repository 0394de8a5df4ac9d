"""Checkpoints written atomically, ending in a digest of their contents, loaded without unpickling code,
checked against what the trainer saves; and the RNG state they carry.

A checkpoint is written to a temporary file in the same directory, fsynced, and renamed over its
final name, so a crash mid-write (``kill -9``, a full disk) leaves the previous checkpoint intact; a
failed write removes its temporary file, and one left by a killed process is removed by the next save, or, where
the kill came during the run's first checkpoint, by the resume that finds it has none (``checkpoint_file``). ``last.pt`` is a hard link to
the newest one, replaced atomically the same way. Two phases: ``write_checkpoint`` writes every byte
(where a full disk shows); ``WrittenCheckpoint.publish`` makes it durable and gives it its name, which is
waiting on the disk (~10 ms here, three fsyncs' worth), so the trainer may let it run on a thread while
the next step trains. In a private run directory the temporary file is
created 0600 (core/records/storage.py), so the weights are never readable by others, not even mid-write.

The digest: ``torch.save`` writes a zip archive, and torchlab gives that archive a comment (the last bytes of
the file, which zip readers and ``torch.load`` skip): ``torchlab-sha256:`` and the sha256 of the archive as
torch wrote it. It is inside the file, so a copy or a rename keeps it, and it costs one pass over the bytes
being written, and one read of the file at load (about a second a GB). A file whose contents do not match it is
"damaged" (a flipped bit on a disk or in a copy); a file without one was cut short, or written by an older
torchlab or by something else, and is refused too: torchlab loads only checkpoints of this format. The digest
is a check against damage, not a signature: whoever can write a file can write its digest.

Loading uses ``weights_only=True``: a checkpoint holds tensors and plain values, never objects that run code
when read. What the trainer resumes from is also checked against what its save writes, and read as a typed
record (``load_training_state``, with core/engine/state/checkpoint_contents.py): a ``step`` that is text, a list where a dict belongs, an RNG state that
would not load, a value nested deeper than torchlab nests, each is one ConfigError naming the entry, before any
of it is used. A checkpoint never names code to import: core/launch/training_plan.py says when its stored workload is used.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch

from torchlab.core.engine.state.checkpoint_contents import TrainingState, as_tuples
from torchlab.core.errors import ConfigError, StorageError
from torchlab.core.records.rundir import rows_of
from torchlab.core.records.storage import create_file, fsync_directory, remedy, storage_error, unreadable_run
from torchlab.core.safe_open import open_regular, who_else_may_write
from torchlab.core.wire.runtime import process_running, remove_abandoned_temporaries

FORMAT_VERSION = 1
_STEP_FILE = re.compile(r"^step-(\d{7,})\.pt$")
_TEMPORARY = re.compile(r"^\.(?:step-\d{7,}|last)\.pt\.tmp-(\d+)$")

#: The zip comment that ends every checkpoint: this prefix, then the sha256 (in hex) of the archive as torch
#: wrote it, whose comment was empty.
_DIGEST_PREFIX = b"torchlab-sha256:"
_DIGEST_COMMENT_BYTES = len(_DIGEST_PREFIX) + 64
#: A zip archive ends in its end-of-central-directory record: this signature, 22 bytes in all, the last two of
#: them the length of the comment that follows.
_END_SIGNATURE = b"PK\x05\x06"
_END_RECORD_BYTES = 22
_NO_COMMENT = b"\x00\x00"
_TRAILER_BYTES = _END_RECORD_BYTES + _DIGEST_COMMENT_BYTES
_READ_CHUNK = 1 << 20


#: ``--checkpoint-every auto`` (the default): a periodic checkpoint on a multiple of this step...
AUTO_CHECKPOINT_STEPS = 100
#: ...once this much time has passed since the last checkpoint...
AUTO_CHECKPOINT_MIN_INTERVAL_S = 60.0
#: ...and long enough after it that writing checkpoints takes at most this share of the run's time.
AUTO_CHECKPOINT_BUDGET = 0.01


class CheckpointCadence:
    """Decides after which steps a periodic checkpoint is written.

    ``every`` fixed (every N-th step; 0 = none but the final one) or ``"auto"``: every 100th step once a
    minute has passed since the last checkpoint (of any kind) or the start, and once 100 times what the last
    one cost the training thread has passed (a checkpoint that took 2 s waits 200 s: at most 1 % of the
    time). Every 100 steps whatever their length was one checkpoint a second at 10 ms a step: 0.7 % of
    the training for the writes (``benchmarks/loop_cost.py``) and a line a second in the app's log, to
    lose at most a second of training to a crash rather than a minute.
    """

    def __init__(self, every: int | str, clock: Callable[[], float] = time.monotonic) -> None:
        self.fixed = None if every == "auto" else int(every)
        self._clock = clock
        self._last_at = clock()
        self._last_cost_s = 0.0

    def due(self, step: int) -> bool:
        """Whether a periodic checkpoint follows ``step``."""
        if self.fixed is not None:
            return self.fixed > 0 and step % self.fixed == 0
        if step % AUTO_CHECKPOINT_STEPS:
            return False
        wait = max(AUTO_CHECKPOINT_MIN_INTERVAL_S, self._last_cost_s / AUTO_CHECKPOINT_BUDGET)
        return self._clock() - self._last_at >= wait

    def record(self, cost_s: float) -> None:
        """A checkpoint was written now, at a cost of ``cost_s`` seconds of the training thread."""
        self._last_at, self._last_cost_s = self._clock(), cost_s


def step_file_name(step: int) -> str:
    return f"step-{step:07d}.pt"


def save_checkpoint(directory: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    """Write ``step-NNNNNNN.pt`` and point ``last.pt`` at it; keep the newest ``keep`` step files.

    A failed write (a full disk) raises a StorageError that says what is intact, and leaves no
    temporary file: the directory is as it was.
    """
    return write_checkpoint(directory, step, state, keep).publish()


def write_checkpoint(directory: Path, step: int, state: dict[str, Any], keep: int) -> WrittenCheckpoint:
    """``save_checkpoint``'s first phase: every byte written to the temporary file, which is closed (a
    full disk fails here, as in ``save_checkpoint``). Then ``publish`` it, at once or on a thread."""
    directory = Path(directory)
    path = directory / step_file_name(step)
    temporary = directory / f".{path.name}.tmp-{os.getpid()}"
    remove_abandoned_temporaries(directory, _TEMPORARY)  # of writers killed mid-write
    try:
        descriptor = _write_checkpoint(temporary, {"format": FORMAT_VERSION, **state})
    except BaseException as error:
        temporary.unlink(missing_ok=True)
        if not isinstance(error, OSError):
            raise
        raise _write_failure(error, directory, step) from error
    return WrittenCheckpoint(directory, step, path, temporary, descriptor, keep)


def _write_failure(error: OSError, directory: Path, step: int) -> StorageError:
    """The StorageError for a failed write (or fsync, or rename) of the checkpoint of ``step``: what
    failed, and what is intact to resume from."""
    return storage_error(error, f"the checkpoint of step {step} in {directory}", _what_is_intact(directory, error))


class WrittenCheckpoint:
    """A checkpoint whose bytes are all in its temporary file, not yet durable nor under its name.

    ``publish`` fsyncs it, renames it to ``step-NNNNNNN.pt``, points ``last.pt`` at it, fsyncs the
    directory and prunes the oldest: waiting on the disk, not work. ``publish_in_background`` does the
    same on a thread; ``wait`` then joins it and returns the path, or raises what ``publish`` would have.
    Until it is published the previous checkpoint is what ``last.pt`` points at, whole.
    """

    def __init__(self, directory: Path, step: int, path: Path, temporary: Path, descriptor: int, keep: int) -> None:
        self.directory, self.step, self.path, self.keep = directory, step, path, keep
        self._temporary = temporary
        self._descriptor = descriptor  # a duplicate of the writer's: its write errors are still ours to see
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def publish(self) -> Path:
        try:
            try:
                os.fsync(self._descriptor)
            finally:
                os.close(self._descriptor)
            os.replace(self._temporary, self.path)
        except BaseException as error:
            self._temporary.unlink(missing_ok=True)
            if not isinstance(error, OSError):
                raise
            raise _write_failure(error, self.directory, self.step) from error
        link = self.directory / f".last.pt.tmp-{os.getpid()}"
        try:
            link.unlink(missing_ok=True)
            os.link(self.path, link)
            os.replace(link, self.directory / "last.pt")
            fsync_directory(self.directory)
        except OSError as error:
            link.unlink(missing_ok=True)
            raise storage_error(
                error, f"last.pt in {self.directory}",
                f"{self.path.name} is written whole, but last.pt still points at the checkpoint before it: "
                f"{remedy(error)}, then resume from {self.path}.",
            ) from error
        _prune(self.directory, self.keep)
        return self.path

    def publish_in_background(self) -> None:
        self._thread = threading.Thread(target=self._publish_keeping_error, name="torchlab-checkpoint", daemon=True)
        self._thread.start()

    def wait(self) -> Path:
        """Join the background publish; its path, or the error it raised (a StorageError for a failed write)."""
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error
        return self.path

    def _publish_keeping_error(self) -> None:
        try:
            self.publish()
        except BaseException as error:  # raised on the trainer's thread by wait()
            self._error = error


class _RecordingWriter:
    """The file ``torch.save`` writes to, remembering the OSError a write raised, and hashing what it writes.

    torch's zip writer turns a failed write into ``RuntimeError: [enforce fail at inline_container.cc]
    . unexpected pos 7616 vs 7510``: the reason (a full disk) is lost unless the file kept it. Writing
    through the file (not to a BytesIO first) keeps a large checkpoint out of host memory twice; hashing the
    bytes on their way keeps the digest from costing a second read.
    """

    def __init__(self, handle: BinaryIO) -> None:
        self._handle = handle
        self.error: OSError | None = None
        self.digest = hashlib.sha256()
        self.tail = b""  # the last bytes written: the archive's end record, once torch is done

    def write(self, data: bytes) -> int:
        try:
            written = self._handle.write(data)
        except OSError as error:
            self.error = self.error or error
            raise
        self.digest.update(data)
        self.tail = (self.tail + bytes(data[-_END_RECORD_BYTES:]))[-_END_RECORD_BYTES:]
        return written

    def flush(self) -> None:
        self._handle.flush()

    def end_with_digest(self) -> None:
        """Give the archive torch wrote its digest: the comment it ended without."""
        if not (self.tail.startswith(_END_SIGNATURE) and self.tail.endswith(_NO_COMMENT)):
            raise RuntimeError("torch.save wrote no zip archive that ends without a comment: there is no place for the digest")
        self._handle.seek(-len(_NO_COMMENT), os.SEEK_END)
        comment = _DIGEST_PREFIX + self.digest.hexdigest().encode("ascii")
        self._handle.write(struct.pack("<H", len(comment)) + comment)


def _write_checkpoint(path: Path, contents: dict[str, Any]) -> int:
    """``torch.save`` into ``path`` and its digest after it, every byte written and the file closed; a failed write
    raises an OSError (or carries one as its cause). Returns a duplicate of its descriptor, for
    ``WrittenCheckpoint`` to fsync: one open file, so a write error the disk reports only at the fsync is still
    seen there."""
    handle = open(path, "wb", opener=create_file)  # the mode is set at creation: private from the first byte
    writer = _RecordingWriter(handle)
    descriptor = -1
    try:
        try:
            torch.save(contents, writer)
            writer.end_with_digest()
            handle.flush()
            descriptor = os.dup(handle.fileno())
        finally:
            handle.close()  # flushes what torch wrote last: on a full disk, this is the write that fails
    except BaseException as error:
        if descriptor >= 0:
            os.close(descriptor)
        if not isinstance(error, RuntimeError) or writer.error is None:  # a RuntimeError without one: a bug,
            raise                                                        # or a value torch cannot save
        raise writer.error from None  # the RuntimeError says only "unexpected pos"
    return descriptor


def checkpoint_file(path: Path) -> Path:
    """What ``--resume PATH`` names: a checkpoint file, or the newest one of a run directory or its
    checkpoints folder."""
    path = Path(path)
    try:
        if path.is_dir():
            for candidate in (path / "checkpoints" / "last.pt", path / "last.pt"):
                if candidate.exists():
                    return candidate
            raise _no_last_checkpoint(path)
        if not path.exists():
            raise ConfigError(f"--resume {path}: no such checkpoint file.")
    except OSError as error:  # another user's private run (0700)
        raise ConfigError(f"--resume {unreadable_run(path, error)}") from None
    return path


def _no_last_checkpoint(path: Path) -> ConfigError:
    """Why ``--resume path``, a folder without ``last.pt``, has nothing to load, and how to go on. A run's folder:
    a step file that last.pt was not yet pointed at (a kill between the two renames) is named; otherwise the run
    ended before its first checkpoint, so it is said, with what the run has (its metrics rows), and what a write
    a kill cut short left (``.step-NNNNNNN.pt.tmp-PID``, its writer gone) is removed where the run is the user's
    alone: no resume could ever use it, and the next save of this run, which would remove it, never comes."""
    if (path / "checkpoints").is_dir():
        run, folder = path, path / "checkpoints"
    elif path.name == "checkpoints":
        run, folder = path.parent, path
    else:
        return ConfigError(f"--resume {path}: no checkpoints/last.pt in that directory.")
    if not any((run / name).exists() for name in ("config.toml", "metrics.jsonl")):  # a folder of checkpoints, no run
        return ConfigError(f"--resume {path}: no checkpoints/last.pt in that directory.")
    step_files = sorted(p for p in folder.iterdir() if _STEP_FILE.match(p.name))
    if step_files:
        return ConfigError(
            f"--resume {path}: no checkpoints/last.pt, which names the run's newest checkpoint (a kill between writing "
            f"one and naming it leaves none), but {step_files[-1].name} is there: resume from it, torchlab-tui --resume "
            f"{step_files[-1]}")
    unfinished = {p: int(match.group(1)) for p in folder.iterdir() if (match := _TEMPORARY.match(p.name))}
    writers = sorted({pid for pid in unfinished.values() if process_running(pid)})
    if writers:
        return ConfigError(
            f"--resume {path}: the run has no checkpoint yet: its first is being written now, by process "
            f"{writers[0]}. Resume once that run has ended.")
    removed = ""
    if unfinished and all(who_else_may_write(os.lstat(place)) is None for place in (run, folder)):
        for leftover in unfinished:
            leftover.unlink(missing_ok=True)
        removed = f" (what that write left, {', '.join(sorted(p.name for p in unfinished))}, is removed now)"
    return ConfigError(
        f"--resume {path}: the run ended before its first checkpoint: it was stopped or killed before writing one, or "
        f"while writing it{removed}, so there is nothing to continue from. It has {_rows_kept(run)}. Start it again "
        f"as a new run with the same settings: torchlab-tui --config {run / 'config.toml'}")


def _rows_kept(run: Path) -> str:
    """What a run without a checkpoint has to show for its steps: its metrics rows, said for a message."""
    metrics = run / "metrics.jsonl"
    try:
        steps = [row["step"] for row in rows_of(metrics)]
    except (OSError, ConfigError):  # none, or not a regular file: nothing to show
        steps = []
    if not steps:
        return "no metrics rows"
    if len(steps) == 1:
        return f"the metrics row of step {steps[0]} in {metrics}"
    return f"{len(steps)} metrics rows (steps {min(steps)}–{max(steps)}) in {metrics}"


def load_checkpoint(path: Path, map_location: torch.device | str = "cpu", mmap: bool = False) -> dict[str, Any]:
    """The checkpoint ``path`` names (see ``checkpoint_file``), its digest checked, or a ConfigError that says what
    is wrong with it and, where one is beside it, which intact checkpoint to resume from instead.

    ``mmap=True`` maps the file instead of reading it: the small entries (``step``, ``config``, ``options``)
    are there at once, a tensor's bytes only when the tensor is used (the digest has read them once).
    """
    path = checkpoint_file(path)
    try:
        verdict = _digest_verdict(path)
    except OSError as error:
        raise ConfigError(f"--resume {unreadable_run(path, error)}") from None
    if verdict == _NO_DIGEST:
        raise ConfigError(
            f"--resume {path}: truncated or not a checkpoint torchlab wrote: torchlab's checkpoints end in a sha256 "
            f"digest of their contents, and this file does not (it was cut short, or written by an older torchlab or "
            f"by something else).{_instead(path)}"
        )
    if verdict == _DAMAGED:
        raise ConfigError(
            f"--resume {path}: damaged: its contents do not match the sha256 digest torchlab wrote at its end (a byte "
            f"changed on the disk or in a copy), so it is not loaded.{_instead(path)}"
        )
    state = _read(path, map_location, mmap)
    if state is None:
        raise ConfigError(
            f"--resume {path}: truncated or not a checkpoint (torchlab reads the checkpoints it writes: tensors "
            f"and plain values only).{_instead(path)}"
        )
    if state.get("format") != FORMAT_VERSION:
        raise ConfigError(f"--resume {path}: not a torchlab checkpoint of format {FORMAT_VERSION}.{_instead(path)}")
    return state


def load_training_state(path: Path, map_location: torch.device | str = "cpu", mmap: bool = False) -> TrainingState:
    """``load_checkpoint``, checked against what the trainer's save writes and read as its record
    (core/engine/state/checkpoint_contents.py): what a resume trains from."""
    path = checkpoint_file(path)
    return TrainingState.read(load_checkpoint(path, map_location, mmap), path)


def peek_checkpoint(path: Path) -> Any:
    """What the checkpoint ``path`` names holds, memory-mapped, without checking its digest or its entries (the
    small entries are read at once, no tensor's bytes): for a glance before the trainer loads it; raises
    whatever reading it raises."""
    return torch.load(checkpoint_file(path), map_location="cpu", weights_only=True, mmap=True)


_INTACT, _DAMAGED, _NO_DIGEST = "intact", "damaged", "no digest"


def _digest_verdict(path: Path) -> str:
    """Whether ``path`` ends in a digest (``_NO_DIGEST`` if not) that its contents match (``_INTACT``, else
    ``_DAMAGED``). Opened as any run file is (core/safe_open.py): a link or a FIFO is an UnsafeFileError."""
    with open(path, "rb", opener=open_regular) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size < _TRAILER_BYTES:
            return _NO_DIGEST
        handle.seek(size - _TRAILER_BYTES)
        trailer = handle.read(_TRAILER_BYTES)
        comment = trailer[_END_RECORD_BYTES:]
        if (not trailer.startswith(_END_SIGNATURE) or not comment.startswith(_DIGEST_PREFIX)
                or trailer[_END_RECORD_BYTES - 2:_END_RECORD_BYTES] != struct.pack("<H", _DIGEST_COMMENT_BYTES)):
            return _NO_DIGEST
        digest = _sha256_of_start(handle, size - _DIGEST_COMMENT_BYTES - len(_NO_COMMENT))
    digest.update(_NO_COMMENT)  # the archive as torch wrote it
    return _INTACT if digest.hexdigest().encode("ascii") == comment[len(_DIGEST_PREFIX):] else _DAMAGED


def _sha256_of_start(handle: BinaryIO, length: int) -> hashlib._Hash:
    """The sha256 of the first ``length`` bytes of ``handle``'s file (fewer if it shrank meanwhile)."""
    digest = hashlib.sha256()
    buffer = memoryview(bytearray(_READ_CHUNK))
    handle.seek(0)
    while length > 0:
        read = handle.readinto(buffer[:min(_READ_CHUNK, length)])
        if not read:
            break
        digest.update(buffer[:read])
        length -= read
    return digest


def _read(path: Path, map_location: torch.device | str, mmap: bool) -> dict[str, Any] | None:
    """The file's contents, or None when torch cannot read it as a checkpoint of tensors and plain values.

    torch says why in words meant for another situation (``OSError: [Errno 22] Invalid argument`` for a
    truncated file mapped into memory; for a file holding objects, advice to load with
    ``weights_only=False``, which would run whatever code it holds): none of that reaches the user.
    """
    try:
        state = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception:  # truncated, foreign, or holding objects: all "not a checkpoint" to us
        return None
    return state if isinstance(state, dict) else None


def _instead(failed: Path) -> str:
    """`` The newest intact checkpoint beside it is step-0000015.pt: resume from it with --resume ….``: the newest
    step file beside ``failed`` whose digest matches and that loads, if any."""
    for candidate in sorted(failed.parent.glob("step-*.pt"), key=lambda p: p.name, reverse=True):
        if not _STEP_FILE.match(candidate.name) or os.path.samefile(candidate, failed):
            continue
        if _intact(candidate):
            return f" The newest intact checkpoint beside it is {candidate.name}: resume from it with --resume {candidate}."
    if failed.name == "last.pt":
        return " No intact step-*.pt checkpoint is beside it."
    return ""


def _intact(candidate: Path) -> bool:
    try:
        if _digest_verdict(candidate) != _INTACT:
            return False
    except (OSError, ConfigError):  # unreadable, or a link or a FIFO in its place
        return False
    state = _read(candidate, "cpu", mmap=True)  # mapped: the tensors are not read again
    return state is not None and state.get("format") == FORMAT_VERSION


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
    """The generators as ``capture_rng_state`` saw them. Their states are host bytes wherever the checkpoint was
    mapped: a resume on CUDA loads every tensor onto the GPU, and torch's setters take CPU tensors only."""
    random.setstate(as_tuples(state["python"]))
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([generator.cpu() for generator in state["cuda"]])
    if "numpy" in state:
        import numpy

        kind, keys, position, has_gauss, cached = state["numpy"]
        numpy.random.set_state((kind, keys.cpu().numpy().astype("uint32"), position, has_gauss, cached))


def _what_is_intact(directory: Path, error: OSError) -> str:
    """The end of a failed save's message: which checkpoint the user still has, and what to do."""
    last = directory / "last.pt"
    if not last.exists():
        return f"no earlier checkpoint of this run exists: {remedy(error)}, then start it again."
    newest = max((p for p in directory.iterdir() if _STEP_FILE.match(p.name)), key=lambda p: p.name, default=None)
    name = newest.name if newest is not None and os.path.samefile(newest, last) else "last.pt"
    return (f"the previous checkpoint ({name}, which last.pt points at) is intact: {remedy(error)}, "
            f"then resume from it.")


def _prune(directory: Path, keep: int) -> None:
    step_files = sorted(p for p in directory.iterdir() if _STEP_FILE.match(p.name))
    for old in step_files[:-keep]:
        old.unlink()
