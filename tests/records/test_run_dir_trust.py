"""Run directories and run files someone else may have prepared (issue 26, cases 1, 7, 8 and 9).

On a shared box another user can make ``/tmp/run1`` before you do, world-writable, with ``trials.jsonl`` linked
to a file of yours and ``checkpoints`` linked to a folder of theirs. A new run writes only into a folder it
made, or into one of yours that no one else may write into and that holds nothing but an untrained run of
yours; a resume only into a run directory of yours. Every run file is read without following links and only
when regular (a FIFO must not hang a reader). Each refusal is one paragraph and exit 2.

"Another user's folder" is a folder of this test's user seen by a process whose ``os.geteuid`` is made to
say another uid (cheap, and as root too); the last test has two real users (it needs root and useradd).
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from metrics_rows import metrics_row
from second_user import attacker  # noqa: F401  (a fixture: a second real user)
from trainers import WORKLOADS
from torchlab.core.errors import EXIT_OK, EXIT_USAGE
from torchlab.core.errors import ConfigError
from torchlab.core.launch import headless as headless_module
from torchlab.core.launch.cli import main
from torchlab.core.records.config import load_config_file
from torchlab.core.records.rundir import RunDirectory, metrics_rows, rows_of, to_json_line
from torchlab.core.records.rundir_folder import create_run_dir
from torchlab.core.safe_open import UnsafeFileError

TINY = f"{WORKLOADS / 'tiny.py'}:workload"


def refused(capsys, *args: str) -> str:
    """The one paragraph a headless run given ``args`` is refused with (exit 2, no traceback)."""
    assert main([*args, "--headless", "--telemetry-interval", "0", "--eval-every", "0"]) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert err.startswith("torchlab-tui: error: ") and "\n" not in err and "Traceback" not in err, err
    return err.removeprefix("torchlab-tui: error: ")


@pytest.fixture
def as_another_user(monkeypatch):
    """From now on this process is another user: every folder the test made belongs to someone else."""
    monkeypatch.setattr(os, "geteuid", lambda: 4242 if os.getuid() != 4242 else 4343)


@pytest.fixture
def nothing_trains(monkeypatch):
    """A refusal must come before any run directory is opened: a run that got that far fails the test
    (instead of writing into ``/`` or ``/tmp``)."""
    def opened(*args, **kwargs):
        raise AssertionError(f"a run directory was opened: {args}")

    monkeypatch.setattr(headless_module, "RunDirectory", opened)


def me() -> str:
    """This test's user as a message names the owner of a folder: ``root (uid 0)``."""
    return f"{pwd.getpwuid(os.getuid()).pw_name} (uid {os.getuid()})"


def private_folder(path: Path) -> Path:
    path.mkdir(mode=0o700)
    return path


# ----------------------------------------------------------------------------- case 1: a new run's --run-dir
def test_a_run_dir_of_another_user_is_refused_and_nothing_is_written_in_it(tmp_path, capsys, as_another_user):
    run = private_folder(tmp_path / "run")
    err = refused(capsys, TINY, "--run-dir", str(run))
    assert err == (f"--run-dir {run} belongs to {me()}, not to you: torchlab writes a run only into a folder "
                   "of yours, which no one else can have prepared. Give another --run-dir, or make one with mkdir -m 700.")
    assert list(run.iterdir()) == []


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777], ids=["world-writable", "group-writable", "sticky"])
def test_a_run_dir_others_may_write_into_is_refused(tmp_path, capsys, mode):
    run = private_folder(tmp_path / "run")
    run.chmod(mode)
    err = refused(capsys, TINY, "--run-dir", str(run))
    assert f"--run-dir {run} can be written by other users (mode {mode:04o})" in err and "mkdir -m 700" in err
    assert list(run.iterdir()) == []


def test_a_run_dir_that_holds_anything_but_a_run_is_refused_naming_what(tmp_path, capsys):
    home = private_folder(tmp_path / "home")
    (home / "notes.txt").write_text("mine\n")
    (home / ".bashrc").write_text("")
    err = refused(capsys, TINY, "--run-dir", str(home))
    assert err == (f"--run-dir {home} holds files that are not a run's (.bashrc, notes.txt): a new run goes into an "
                   "empty folder or one that holds an unfinished run of yours. Give another --run-dir, or leave it out for a new "
                   "one under the runs root.")
    assert sorted(path.name for path in home.iterdir()) == [".bashrc", "notes.txt"]


@pytest.mark.parametrize("folder", ["/", "/tmp"])
def test_a_system_folder_is_refused_as_a_run_dir(capsys, nothing_trains, folder):
    err = refused(capsys, TINY, "--run-dir", folder)
    assert err.startswith(f"--run-dir {folder} ")


def test_a_link_in_a_run_dir_is_refused_before_the_run_starts(tmp_path, capsys):
    run = private_folder(tmp_path / "run")
    notes = tmp_path / "notes.txt"
    notes.write_text("first\nlast line without a newline")
    (run / "trials.jsonl").symlink_to(notes)
    err = refused(capsys, TINY, "--run-dir", str(run))
    assert f"{run / 'trials.jsonl'} is a symbolic link" in err
    assert notes.read_text() == "first\nlast line without a newline"


def test_your_own_folder_that_others_may_read_needs_shared_run_dir(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    run.chmod(0o755)
    err = refused(capsys, TINY, "--steps", "2", "--run-dir", str(run))
    assert err == (f"--run-dir {run} is open to other users (mode 0755), and a run is private unless "
                   f"--shared-run-dir: chmod 700 {run} first, or give --shared-run-dir to let them read it.")
    assert main([TINY, "--headless", "--steps", "2", "--run-dir", str(run), "--shared-run-dir", "--telemetry-interval", "0"]) == EXIT_OK
    assert (run / "checkpoints" / "last.pt").exists()


def test_a_run_dir_that_is_a_link_to_your_own_private_folder_is_used_through_its_target(tmp_path, capsys):
    target = private_folder(tmp_path / "target")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert main([TINY, "--headless", "--steps", "2", "--run-dir", str(link), "--telemetry-interval", "0"]) == EXIT_OK
    assert f"Run directory: {target}\n" in capsys.readouterr().err
    assert (target / "checkpoints" / "last.pt").exists()


def test_a_run_dir_that_is_a_link_to_a_folder_of_another_user_is_refused(tmp_path, capsys, as_another_user):
    target = private_folder(tmp_path / "target")
    link = tmp_path / "link"
    link.symlink_to(target)
    err = refused(capsys, TINY, "--run-dir", str(link))
    assert f"--run-dir {link} (a link to {target}) belongs to " in err and list(target.iterdir()) == []


def test_a_folder_inside_a_folder_another_user_may_write_into_is_refused(tmp_path, capsys):
    """Whoever may write into the folder above can rename the run directory away and put one of theirs in its
    place mid-run: the folders above must be yours or root's, and not world-writable unless sticky (/tmp)."""
    open_folder = tmp_path / "open"
    open_folder.mkdir()
    open_folder.chmod(0o777)
    err = refused(capsys, TINY, "--run-dir", str(open_folder / "run"))
    assert err == (f"--run-dir {open_folder / 'run'} is inside {open_folder}, which other users can write into (mode "
                   f"0777): they could put a folder of theirs in its place. Give a --run-dir (or --runs-root) in a folder of yours.")


def test_a_run_directory_made_by_someone_else_first_is_refused_where_it_would_be_made(tmp_path, as_another_user):
    """The race: the name was free when chosen, and someone made it before ``mkdir``: refused, not written into."""
    premade = private_folder(tmp_path / "20260101-000000-tiny")
    with pytest.raises(ConfigError, match=re.escape(f"belongs to {me()}, not to you")):
        create_run_dir(premade)
    with pytest.raises(ConfigError, match=re.escape(f"belongs to {me()}, not to you")):
        RunDirectory(premade)  # the trainer process the app starts checks the directory it is given, too
    assert list(premade.iterdir()) == []


def test_a_run_dir_name_over_255_bytes_is_one_paragraph(tmp_path, capsys):
    name = tmp_path / ("r" * 300)
    err = refused(capsys, TINY, "--run-dir", str(name))
    assert "a name in it is longer than the 255 bytes a file name may have: give a shorter --run-dir" in err
    assert len(err) < 600


# ----------------------------------------------------------------------------- resuming
@pytest.fixture
def trained_run(tmp_path) -> Path:
    run = tmp_path / "run"
    assert main([TINY, "--headless", "--steps", "2", "--run-dir", str(run), "--telemetry-interval", "0"]) == EXIT_OK
    return run


def test_a_resume_into_another_users_run_is_refused_before_anything_is_written(trained_run, capsys, as_another_user):
    """With the workload given (the checkpoint's own checks, core/launch/training_plan.py, would refuse to import the
    one it names from a run that is not yours, first), the run directory is still not yours to write into."""
    before = {path: path.stat().st_mtime_ns for path in trained_run.rglob("*")}
    err = refused(capsys, TINY, "--resume", str(trained_run), "--steps", "4")
    assert err == (f"the run directory of --resume {trained_run / 'checkpoints' / 'last.pt'} belongs to {me()}, not to "
                   "you: torchlab writes a run only into a folder of yours, which no one else can have prepared. Give "
                   "--run-dir DIR to continue it in a folder of yours.")
    assert {path: path.stat().st_mtime_ns for path in trained_run.rglob("*")} == before


def test_a_resume_into_your_run_that_others_may_write_into_is_refused(trained_run, capsys):
    trained_run.chmod(0o777)
    err = refused(capsys, TINY, "--resume", str(trained_run), "--steps", "4")
    assert f"the run directory of --resume {trained_run / 'checkpoints' / 'last.pt'} can be written by other users (mode 0777)" in err


# ----------------------------------------------------------------------------- case 7: FIFOs and links as run files
@pytest.mark.timeout(20)
def test_a_fifo_as_config_is_refused_at_once(tmp_path, capsys):
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    err = refused(capsys, TINY, "--config", str(fifo))
    assert err == f"--config {fifo}: a FIFO (named pipe), not a regular file: give a TOML file."


def test_a_config_file_through_your_own_link_is_read(tmp_path):
    real = tmp_path / "real.toml"
    real.write_text("steps = 7\n")
    (tmp_path / "current.toml").symlink_to(real)
    assert load_config_file(tmp_path / "current.toml", follow_link=True)["steps"] == 7
    with pytest.raises(UnsafeFileError, match="is a symbolic link"):
        load_config_file(tmp_path / "current.toml")  # a run's config.toml is never read through a link


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_a_journal_that_is_a_fifo_or_a_link_is_refused_by_its_readers(tmp_path, capsys, kind):
    from torchlab.core.launch.compare import main as compare
    from torchlab.tui.run_history import RunHistory

    runs = []
    for name in ("a", "b"):
        run = private_folder(tmp_path / name)
        (run / "metrics.jsonl").write_text(to_json_line(metrics_row(1, loss=1.0).json_object()))
        runs.append(run)
    secret = tmp_path / "secret.jsonl"
    secret.write_text(to_json_line(metrics_row(1, loss=42.0).json_object()))
    metrics = runs[1] / "metrics.jsonl"
    metrics.unlink()
    os.mkfifo(metrics) if kind == "fifo" else metrics.symlink_to(secret)
    with pytest.raises(UnsafeFileError):
        list(rows_of(metrics))
    with pytest.raises(UnsafeFileError):
        list(metrics_rows(metrics))
    with pytest.raises(UnsafeFileError):
        RunHistory.load(runs[1])
    assert compare([str(run) for run in runs]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"{metrics} is a" in err and "Traceback" not in err


@pytest.mark.timeout(20)
def test_a_fifo_as_config_toml_of_a_run_does_not_hang_compare(tmp_path):
    from torchlab.core.records.config import build_config
    from torchlab.tui.run_history import RunHistory, earlier_run

    earlier, later = private_folder(tmp_path / "20260101-000000-tiny"), private_folder(tmp_path / "20260102-000000-tiny")
    (earlier / "metrics.jsonl").write_text(to_json_line(metrics_row(1, loss=1.0).json_object()))
    os.mkfifo(earlier / "config.toml")
    (later / "config.toml").write_text(build_config({"workload": "tiny_gpt"}).to_toml())
    assert RunHistory.load(earlier).settings == {}  # the curves are still worth comparing
    assert earlier_run(later) is None  # a run whose workload cannot be read is not the same workload


@pytest.mark.timeout(20)
def test_the_apps_readers_of_trainer_log_and_profile_tables_refuse_a_fifo(tmp_path):
    from torchlab.tui.link import _tail
    from torchlab.tui.log_tail import LogTail
    from torchlab.tui.profiles import read_table_csv

    log = tmp_path / "trainer.log"
    os.mkfifo(log)
    assert _tail(log) == ""
    tail = LogTail(log, start=-1)  # a size of 0 is never below the start: it tries to read
    with pytest.raises(UnsafeFileError):
        tail.read_lines()
    table = tmp_path / "table.csv"
    os.mkfifo(table)
    with pytest.raises(UnsafeFileError):
        read_table_csv(table)


# ----------------------------------------------------------------------------- two real users
#: What the attacker prepares: the issue's links, or just an empty folder they can read and write.
ATTACKS = {
    "links": "mkdir -m 777 {run} {elsewhere} && ln -s {victim_file} {run}/trials.jsonl && ln -s {elsewhere} {run}/checkpoints",
    "empty": "mkdir -m 777 {run} {elsewhere}",
}


@pytest.mark.parametrize("attack", ATTACKS)
def test_a_run_directory_another_user_prepared_in_tmp_is_refused_with_two_real_users(tmp_path, attacker, attack):
    """Issue 26's attack (1), on the installed command: the attacker makes /tmp/RUN world-writable with
    trials.jsonl linked to the victim's notes and checkpoints linked to a folder of the attacker's (or leaves it
    empty, to read what the run writes); the victim (root here) runs there. Nothing of the victim's changes,
    nothing lands in the attacker's folders, exit 2."""
    notes = tmp_path / "notes.txt"
    notes.write_text("first line\nlast line, no newline")
    run, elsewhere = Path(f"/tmp/{attacker}-run1"), Path(f"/tmp/{attacker}-x")
    try:
        subprocess.run(["runuser", "-u", attacker, "--", "sh", "-c",
                        ATTACKS[attack].format(run=run, victim_file=notes, elsewhere=elsewhere)], check=True, capture_output=True)
        assert os.lstat(run).st_uid != 0  # the attacker's, truly
        script = shutil.which("torchlab-tui", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
        assert script is not None
        done = subprocess.run([script, "mlp", "--headless", "--steps", "2", "--run-dir", str(run)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        err = done.stderr.strip()
        assert err.count("\n") == 0 and "Traceback" not in err
        assert err.startswith(f"torchlab-tui: error: --run-dir {run} belongs to ")
        assert notes.read_text() == "first line\nlast line, no newline"
        assert list(elsewhere.iterdir()) == []
        assert sorted(path.name for path in run.iterdir()) == ([] if attack == "empty" else ["checkpoints", "trials.jsonl"])
    finally:
        shutil.rmtree(run, ignore_errors=True)
        shutil.rmtree(elsewhere, ignore_errors=True)
