"""Private by default: a run directory torchlab makes is 0700 and every file in it 0600, whatever the umask;
``--shared-run-dir`` makes them follow the umask; a resume keeps the run's choice; and a file is private
from its creation, never ``chmod``-ed after it (no moment when another user could open it)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch

from trainers import WORKLOADS
from torchlab.core.engine.state.checkpoint import save_checkpoint
from torchlab.core.engine.parallel.distributed import usable_cpus
from torchlab.core.errors import EXIT_OK
from torchlab.core.launch.cli import main
from torchlab.core.records import storage
from torchlab.core.records.storage import write_atomically

TINY = WORKLOADS / "tiny.py"
#: A run that writes every kind of file: journals, config.toml, impact.json, checkpoints, a profile.
EVERYTHING = (f"{TINY}:workload", "--steps", "6", "--checkpoint-every", "2", "--at", "3:clip=0.5",
              "--profile-at", "2", "--profile-steps", "1", "--telemetry-interval", "0.1")


@pytest.fixture
def umask():
    """The process umask is 022 for the test, which may set another (``umask(0o077)``); the previous one is
    put back after it."""
    previous = os.umask(0o022)
    yield os.umask
    os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def modes_under(run_dir: Path) -> tuple[set[int], set[int]]:
    """The modes of every folder (the run directory's own included) and of every file under ``run_dir``."""
    folders, files = {mode(run_dir)}, set()
    for root, dirnames, filenames in os.walk(run_dir):
        folders |= {mode(Path(root, name)) for name in dirnames}
        files |= {mode(Path(root, name)) for name in filenames}
    return folders, files


def headless(tmp_path: Path, *args: str) -> Path:
    assert main([*args, "--headless", "--runs-root", str(tmp_path / "runs")]) == EXIT_OK
    [run_dir] = (tmp_path / "runs").iterdir()
    return run_dir


@pytest.mark.parametrize("mask", [0o022, 0o000], ids=["umask-022", "umask-000"])
def test_a_run_directory_and_every_file_in_it_are_private_whatever_the_umask(tmp_path, umask, mask):
    umask(mask)
    run_dir = headless(tmp_path, *EVERYTHING)
    assert (run_dir / "profiles" / "0000002" / "trace.json").exists()  # torch's own file is covered too
    assert (run_dir / "impact.json").exists() and (run_dir / "checkpoints" / "last.pt").exists()
    assert mode(tmp_path / "runs") == 0o755 & ~mask  # the runs root: the umask's, never writable by anyone else
    assert modes_under(run_dir) == ({0o700}, {0o600})


@pytest.mark.skipif(usable_cpus() < 2, reason="two ranks need two CPU cores")
def test_the_ranks_logs_and_a_tensorboard_folder_in_a_private_run_are_private_too(tmp_path, umask):
    """What torch makes in the run directory: the launcher's rank logs (ranks/<id>/attempt_0/<rank>/stdout.log)
    and, with --tensorboard inside the run, TensorBoard's folder; its event files are TensorBoard's to make,
    inside that folder, which no one else may enter."""
    run_dir = tmp_path / "run"
    assert main([f"{TINY}:workload", "--headless", "--steps", "2", "--world-size", "2", "--run-dir", str(run_dir),
                 "--tensorboard", str(run_dir / "tb"), "--telemetry-interval", "0", "--eval-every", "0"]) == EXIT_OK
    [stdout_log] = run_dir.glob("ranks/*/attempt_0/0/stdout.log")
    assert (run_dir / "tb").is_dir()
    assert modes_under(run_dir / "ranks") == ({0o700}, {0o600})
    assert mode(run_dir / "tb") == 0o700


@pytest.mark.parametrize("mask, folders, files", [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600), (0o002, 0o755, 0o664)],
                         ids=["umask-022", "umask-077", "umask-002"])
def test_a_shared_run_directory_follows_the_umask_which_can_only_make_it_stricter(tmp_path, umask, mask, folders, files):
    """Others may read a shared run, never add to its folders: under umask 002 a group-writable run directory
    would be refused by the next resume (anyone who can write into it could swap its files for links)."""
    umask(mask)
    run_dir = headless(tmp_path, *EVERYTHING, "--shared-run-dir")
    assert (run_dir / "profiles" / "0000002" / "trace.json").exists()
    assert modes_under(run_dir) == ({folders}, {files})
    assert main([*EVERYTHING[:1], "--steps", "8", "--resume", str(run_dir), "--headless"]) == EXIT_OK


def test_a_resume_keeps_the_run_directorys_choice_and_changes_no_mode(tmp_path, umask):
    """What a resume adds follows the run directory, flag or not: a shared run stays shared, a private
    one private (``--shared-run-dir`` makes new directories only; a ``chmod`` of an existing one is the way)."""
    for shared, flags, expected in [(True, (), ({0o755}, {0o644})), (False, ("--shared-run-dir",), ({0o700}, {0o600}))]:
        root = tmp_path / ("shared" if shared else "private")
        first = (f"{TINY}:workload", "--steps", "3", "--schedule", "constant")
        run_dir = headless(root, *first, *(("--shared-run-dir",) if shared else ()))
        assert headless(root, *first, "--steps", "6", "--checkpoint-every", "2", "--resume", str(run_dir), *flags) == run_dir
        assert (run_dir / "checkpoints" / "step-0000006.pt").exists()  # written by the resume
        assert modes_under(run_dir) == expected


@pytest.fixture
def renamed_modes(monkeypatch) -> list[tuple[str, int]]:
    """``(name, mode)`` of each file ``os.replace`` renames, as it was just before the rename; any ``chmod``
    fails the test, so a mode seen here is the one the file was created with."""
    seen: list[tuple[str, int]] = []
    real_replace = os.replace

    def replace(source, destination) -> None:
        seen.append((Path(source).name, mode(source)))
        real_replace(source, destination)

    def no_chmod(*args, **kwargs):
        raise AssertionError("a file made private after its creation was readable by others before")

    monkeypatch.setattr(os, "replace", replace)
    for name in ("chmod", "fchmod"):
        monkeypatch.setattr(os, name, no_chmod)
    return seen


@pytest.mark.parametrize("folder_mode, file_mode", [(0o700, 0o600), (0o755, 0o644)], ids=["private", "shared"])
def test_write_atomically_creates_its_temporary_file_with_the_final_mode(tmp_path, umask, renamed_modes, folder_mode, file_mode):
    folder = tmp_path / "run"
    folder.mkdir(mode=folder_mode)
    write_atomically(folder / "config.toml", "steps = 3\n")
    assert renamed_modes == [(f".config.toml.tmp-{os.getpid()}", file_mode)]
    assert mode(folder / "config.toml") == file_mode


def test_a_checkpoint_is_private_from_its_first_byte(tmp_path, umask, renamed_modes):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir(mode=0o700)
    save_checkpoint(checkpoints, 4, {"weights": torch.ones(8)}, keep=3)
    pid = os.getpid()
    assert renamed_modes == [(f".step-0000004.pt.tmp-{pid}", 0o600), (f".last.pt.tmp-{pid}", 0o600)]
    assert {path.name: mode(path) for path in checkpoints.iterdir()} == {"step-0000004.pt": 0o600, "last.pt": 0o600}


def test_a_folder_is_made_as_private_as_the_one_it_is_in_and_an_existing_one_keeps_its_mode(tmp_path, umask):
    private, shared = tmp_path / "private", tmp_path / "shared"
    private.mkdir(mode=0o700)
    shared.mkdir(mode=0o755)
    assert mode(storage.make_folder(private / "a" / "b")) == 0o700 and mode(private / "a") == 0o700
    assert mode(storage.make_folder(shared / "a")) == 0o755
    (shared / "kept").mkdir(mode=0o750)
    assert mode(storage.make_folder(shared / "kept")) == 0o750
