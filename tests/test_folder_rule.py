"""One rule for every folder torchlab writes into, in every command, and one for every path's length (issue 46,
items 1, 2, 3, 7 and 8; core/safe_open.py ``who_else_may_change`` and ``refuse_a_path_too_long``).

Training's ``--tensorboard`` wrote its event file into another user's world-writable folder that ``export``
refused; ``export --tensorboard DIR/sub`` wrote under another user's folder that could swap ``sub``; ``--force``
replaced a FIFO with a file; a 300-byte name was a traceback; a full disk under ``export --tensorboard`` was a
traceback from TensorBoard's thread and an empty folder left behind. The tests with another real user need
root and useradd (the ``attacker`` of tests/helpers/second_user.py) and skip without them.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from metrics_rows import metrics_row
from second_user import attacker  # noqa: F401  (a fixture: a second real user)
from tmpfs import leave_free, small_disk  # noqa: F401  (a fixture: a 3 MB tmpfs)
from trainers import WORKLOADS
from torchlab.core.errors import EXIT_FAILED, EXIT_USAGE
from torchlab.core.launch.cli import main
from torchlab.core.records.export_files import output_file
from torchlab.core.records.rundir import to_json_line
from torchlab.core.safe_open import UnsafeFileError, who_else_may_change

TINY = f"{WORKLOADS / 'tiny.py'}:workload"
LONG_NAME = "x" * 300
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to give a file to another uid)")


def one_paragraph(argv: list[str], capsys, code: int = EXIT_USAGE) -> str:
    """The one paragraph ``torchlab-tui argv`` is refused with: exit ``code``, no traceback."""
    assert main(argv) == code
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def a_run(folder: Path, rows: int = 3) -> Path:
    """A run directory with ``rows`` metrics rows (what export reads), made without training."""
    folder.mkdir(mode=0o700)
    (folder / "metrics.jsonl").write_text("".join(to_json_line(metrics_row(step).json_object()) for step in range(1, rows + 1)))
    return folder


def torchlab_tui() -> str:
    script = shutil.which("torchlab-tui", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    assert script is not None
    return script


def as_user(name: str, command: str) -> None:
    subprocess.run(["runuser", "-u", name, "--", "sh", "-c", command], check=True, capture_output=True)


# ----------------------------------------------------------------------------- the rule itself
def test_folders_on_the_way_may_be_open_to_others_only_if_sticky(tmp_path):
    open_folder, sticky = tmp_path / "open", tmp_path / "sticky"
    for folder, mode in ((open_folder, 0o777), (sticky, 0o1777)):
        folder.mkdir()
        folder.chmod(mode)
    fault = who_else_may_change(open_folder / "tb" / "deeper")
    assert (fault.at, fault.where, str(fault)) == (open_folder, "above", f"is inside {open_folder}, which other users can write into (mode 0777)")
    assert who_else_may_change(sticky / "tb") is None  # /tmp's case: made by you, no one else may touch it
    (sticky / "tb").mkdir(mode=0o700)
    assert who_else_may_change(sticky / "tb") is None
    assert str(who_else_may_change(sticky)) == "can be written by other users (mode 1777)"  # written into: never


@needs_root
def test_a_link_on_the_way_that_another_user_made_is_not_followed(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(mine)
    assert who_else_may_change(link / "tb") is None  # your own link: followed
    os.lchown(link, 4242, 4242)
    fault = who_else_may_change(link / "tb")
    assert (fault.at, fault.where, fault.theirs) == (link, "link", True)
    assert str(fault) == f"leads through {link}, a symbolic link that belongs to uid 4242"


# ----------------------------------------------------------------------------- item 1 and 2, with a real second user
def test_training_tensorboard_into_another_users_open_folder_is_refused_before_anything_is_made(tmp_path, attacker):
    """Item 1: accepted, the event file 0644 in the other user's 0777 folder; now refused as export refuses it."""
    board = Path(f"/tmp/{attacker}-tb")
    try:
        as_user(attacker, f"mkdir -m 777 {board}")
        done = subprocess.run([torchlab_tui(), TINY, "--headless", "--steps", "2", "--tensorboard", str(board),
                               "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
        assert done.returncode == EXIT_USAGE, done.stderr
        err = done.stderr.strip()
        assert "\n" not in err and "Traceback" not in err, err
        assert err.startswith(f"torchlab-tui: error: --tensorboard {board} belongs to {attacker} (uid "), err
        assert "Give a new folder in a folder of yours" in err
        assert list(board.iterdir()) == [] and not (tmp_path / "run").exists()
    finally:
        shutil.rmtree(board, ignore_errors=True)


@pytest.mark.parametrize("flag", ["--tensorboard", "--csv"])
def test_export_under_another_users_open_folder_is_refused_and_makes_nothing_there(tmp_path, capsys, attacker, flag):
    """Item 2: ``export --tensorboard /tmp/pub/sub`` (``pub`` another user's, 0777, not sticky) was accepted: they
    could swap ``sub`` while the export wrote. ``--csv`` into that folder too."""
    run = a_run(tmp_path / "run")
    public = Path(f"/tmp/{attacker}-pub")
    target = public / ("sub" if flag == "--tensorboard" else "m.csv")
    try:
        as_user(attacker, f"mkdir -m 777 {public}")
        err = one_paragraph(["export", str(run), flag, str(target)], capsys)
        assert err.startswith(f"torchlab-tui export: {flag} {target} is inside {public}, which belongs to {attacker} (uid ")
        assert list(public.iterdir()) == []
    finally:
        shutil.rmtree(public, ignore_errors=True)


def test_a_runs_root_in_another_users_folder_is_refused_before_a_folder_is_made_in_it(tmp_path, capsys, attacker):
    public = Path(f"/tmp/{attacker}-pub")
    try:
        as_user(attacker, f"mkdir -m 777 {public}")
        err = one_paragraph([TINY, "--headless", "--steps", "2", "--runs-root", str(public / "runs")], capsys)
        assert f"is inside {public}, which belongs to {attacker} (uid " in err
        assert list(public.iterdir()) == []  # the runs root was made there, then refused
    finally:
        shutil.rmtree(public, ignore_errors=True)


def test_a_folder_its_group_may_write_into_is_refused_where_others_are_in_the_group(tmp_path, capsys, attacker):
    """A group-writable folder on the way is fine for a user private group (umask 002), not where another user is
    in the group: the attacker is in their own group, given to a folder of root's, 0775."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shutil.chown(shared, group=attacker)
    shared.chmod(0o775)
    err = one_paragraph([TINY, "--headless", "--steps", "2", "--run-dir", str(shared / "run")], capsys)
    assert f"is inside {shared}, which other members of its group {attacker} ({attacker}) can write into (mode 0775)" in err
    assert list(shared.iterdir()) == []


# ----------------------------------------------------------------------------- item 3: --force replaces regular files only
@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_force_never_replaces_a_fifo_or_a_device(tmp_path, capsys, kind):
    run, target = a_run(tmp_path / "run"), tmp_path / "m.csv"
    if kind == "fifo":
        os.mkfifo(target)
    else:
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root")
        os.mknod(target, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # a /dev/null of the test's own
    err = one_paragraph(["export", str(run), "--csv", str(target), "--force"], capsys)
    assert "--force replaces a regular file only" in err
    assert not stat.S_ISREG(os.lstat(target).st_mode)


def test_a_fifo_put_at_the_path_while_the_file_was_written_is_not_replaced(tmp_path):
    target = tmp_path / "m.csv"
    with pytest.raises(UnsafeFileError, match="a FIFO"):
        with output_file(target, replace=True, text=True) as handle:
            handle.write("step\n")
            os.mkfifo(target)  # the race: after the export's checks, before its rename
    assert stat.S_ISFIFO(os.lstat(target).st_mode) and [path.name for path in tmp_path.iterdir()] == ["m.csv"]


# ----------------------------------------------------------------------------- item 7: one rule for a path's length
@pytest.mark.parametrize("argv", [
    [f"{LONG_NAME}.py", "--headless"],
    ["mlp", "--headless", "--runs-root", "{tmp}/" + LONG_NAME],
    ["mlp", "--headless", "--tensorboard", "{tmp}/" + LONG_NAME, "--run-dir", "{tmp}/run"],
    ["export", LONG_NAME, "--csv", "{tmp}/m.csv"],
    ["export", "{run}", "--csv", f"{{tmp}}/{LONG_NAME}.csv"],
    ["export", "{run}", "--tensorboard", f"{{tmp}}/{LONG_NAME}"],
], ids=["workload-file", "runs-root", "tensorboard", "export-run", "csv", "export-tensorboard"])
def test_a_name_over_255_bytes_is_one_paragraph_wherever_it_is_given(tmp_path, capsys, argv):
    run = a_run(tmp_path / "exported")
    argv = [part.format(tmp=tmp_path, run=run) for part in argv]
    err = one_paragraph([*argv, "--steps", "2"] if argv[0] != "export" else argv, capsys)
    assert "a name in it is longer than the 255 bytes a file name may have: give a shorter " in err
    assert len(err) < 400  # the name is shown cut
    assert sorted(path.name for path in tmp_path.iterdir()) == ["exported"]  # no run directory made


# ----------------------------------------------------------------------------- item 8: export onto a full disk
@pytest.mark.parametrize("folder", ["new", "existing"])
def test_export_tensorboard_onto_a_full_disk_is_one_paragraph_and_leaves_what_was_there(small_disk, tmp_path, folder):
    """The paragraph was followed by a traceback from TensorBoard's writer thread, and an empty folder was left.
    ``new``: the disk is full from the first event; ``existing``: a folder of one's own with a file in it
    (``--force``) and the disk full partway through the export."""
    run = a_run(tmp_path / "run", rows=2000)
    board = small_disk / "tb"
    if folder == "existing":
        board.mkdir(mode=0o700)
        (board / "notes.txt").write_text("mine\n")
    leave_free(small_disk, 0 if folder == "new" else 12 * 1024)
    done = subprocess.run([torchlab_tui(), "export", str(run), "--tensorboard", str(board), "--force"],
                          capture_output=True, text=True, timeout=120)
    err = done.stderr.strip()
    assert done.returncode == EXIT_FAILED and "\n" not in err and "Traceback" not in err and "Exception" not in err, err
    assert err.startswith(f"torchlab-tui export: --tensorboard {board}: cannot be written: no space left on device; ")
    assert "Free some space, then export again." in err
    if folder == "new":
        assert not board.exists()
    else:
        assert [path.name for path in board.iterdir()] == ["notes.txt"]


def test_the_app_refuses_an_unfit_tensorboard_folder_before_it_makes_a_run_directory(tmp_path, capsys, monkeypatch):
    """The app's process, not only the trainer it starts, judges ``--tensorboard`` before ``runs/<new>`` is made
    (a link stands for any unfit folder: no second user needed)."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "tb").symlink_to(tmp_path / "elsewhere")
    monkeypatch.chdir(tmp_path)
    err = one_paragraph(["mlp", "--tensorboard", str(tmp_path / "tb")], capsys)
    assert err.startswith(f"torchlab-tui: error: --tensorboard {tmp_path / 'tb'} is a symbolic link"), err
    assert not (tmp_path / "runs").exists()
