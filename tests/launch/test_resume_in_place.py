"""A ``--resume`` of a run goes on in the run's own directory or is refused, saying why (issue 46 item 4): a run
whose ``config.toml`` was a FIFO trained in a new folder under ``./runs``, exit 0, without a word, and so did one
whose config.toml was a link, a folder or missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torchlab.core.errors import EXIT_OK, EXIT_USAGE, ConfigError
from torchlab.core.launch.cli import main
from torchlab.core.launch.resume_in_place import require_resume_in_place

REFUSED = "the run in {run} cannot be continued in its own directory: "


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A run of two steps, its checkpoints/last.pt at step 2: each test changes a copy of it."""
    run = tmp_path_factory.mktemp("trained") / "run"
    assert main(["mlp", "--headless", "--steps", "2", "--run-dir", str(run)]) == EXIT_OK
    return run


@pytest.fixture
def run(trained, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(trained, copy, symlinks=True)
    return copy


def test_a_run_whose_config_is_a_fifo_is_refused_by_the_installed_command_not_trained_in_a_new_folder(run, tmp_path):
    (run / "config.toml").unlink()
    os.mkfifo(run / "config.toml")
    rows = (run / "metrics.jsonl").read_text()
    done = subprocess.run([str(Path(sys.executable).parent / "torchlab-tui"), "--resume", "run", "--headless", "--steps", "3"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert done.stderr == (
        f"torchlab-tui: error: --resume run: {REFUSED.format(run='run')}its config.toml is a FIFO (named pipe), not a "
        "regular file: torchlab reads only regular files in a run (a FIFO or a device would block or never end). A "
        "resume goes on where its run is, and does not move it elsewhere unasked. To continue from its checkpoint in a "
        "new run directory, name one: torchlab-tui --resume run --run-dir NEW_DIR\n")
    assert not (tmp_path / "runs").exists()
    assert (run / "metrics.jsonl").read_text() == rows


def _link(run: Path) -> None:
    (run / "config.toml").rename(run / "kept.toml")
    (run / "config.toml").symlink_to("kept.toml")


def _folder(run: Path) -> None:
    (run / "config.toml").unlink()
    (run / "config.toml").mkdir()


def _checkpoints_a_link(run: Path) -> None:
    (run / "checkpoints").rename(run / "kept")
    (run / "checkpoints").symlink_to("kept")


SPOILED = {
    "config.toml a link": (_link, "its config.toml is a symbolic link, not a regular file: torchlab opens no file of a "
                                  "run through a link"),
    "config.toml a folder": (_folder, "its config.toml is a folder, not a regular file"),
    "config.toml missing": (lambda run: (run / "config.toml").unlink(), "it has no config.toml"),
    "config.toml not TOML": (lambda run: (run / "config.toml").write_text("steps = = 3\n"),
                             "its config.toml: not valid TOML: "),
    "checkpoints a link": (_checkpoints_a_link, "its checkpoints is a symbolic link, not a folder"),
}


@pytest.mark.parametrize("named_as", ["run", "run/checkpoints", "run/checkpoints/last.pt"])
@pytest.mark.parametrize("spoiled", SPOILED)
def test_a_run_that_cannot_be_continued_in_place_is_refused_saying_why(run, spoiled, named_as, monkeypatch):
    spoil, why = SPOILED[spoiled]
    monkeypatch.chdir(run.parent)
    spoil(run)
    with pytest.raises(ConfigError) as refused:
        require_resume_in_place(Path(named_as), None)
    assert str(refused.value).startswith(f"--resume {named_as}: {REFUSED.format(run='run')}{why}")
    assert str(refused.value).endswith(f"name one: torchlab-tui --resume {named_as} --run-dir NEW_DIR")


def test_a_resume_goes_on_where_it_is_told_or_in_its_run_and_a_checkpoint_from_elsewhere_in_a_new_folder(run, tmp_path):
    require_resume_in_place(run, None)  # an intact run
    (run / "config.toml").unlink()
    require_resume_in_place(run, tmp_path / "elsewhere")  # --run-dir: where the user said
    copied = tmp_path / "downloads" / "checkpoints"
    copied.mkdir(parents=True)
    shutil.copy(run / "checkpoints" / "last.pt", copied / "model.pt")
    require_resume_in_place(copied / "model.pt", None)  # in no run: a new folder, as docs/run-files.md says


def _refusal(resume: Path) -> int:
    try:
        require_resume_in_place(resume, None)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def test_a_config_its_owner_cannot_read_is_refused_with_two_real_users(trained):
    """Root reads any file, so the run is another user's own, its config.toml 0000 (by its owner's mistake)."""
    from second_user import run_as, throwaway_user

    with throwaway_user() as other:
        run = other.runtime_dir / "run"
        shutil.copytree(trained, run)
        for path in [run, *run.rglob("*")]:
            os.chown(path, other.uid, other.gid)
        (run / "config.toml").chmod(0)
        ran = run_as(other, _refusal, run)
    assert ran.code == EXIT_USAGE, ran.stderr
    assert f"{REFUSED.format(run=run)}its config.toml cannot be read: permission denied (not readable by you)." in ran.stderr


def test_the_app_refuses_such_a_resume_before_it_makes_a_run_directory(run, tmp_path, monkeypatch):
    """The app's process asks ``resumed_workload`` before it makes ``runs/<new>`` for the trainer: a run that
    cannot go on in place is refused there, so no empty folder is left beside the refusal."""
    from torchlab.core.launch.arguments import build_parser
    from torchlab.core.launch.cli import resumed_workload

    (run / "config.toml").unlink()
    os.mkfifo(run / "config.toml")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="cannot be continued in its own directory"):
        resumed_workload(build_parser().parse_args(["--resume", str(run)]))
    assert not (tmp_path / "runs").exists()
