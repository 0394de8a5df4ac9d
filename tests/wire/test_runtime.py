"""The runtime directory: what killed trainers leave there is swept when runs are listed, and only that."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time

import shutil
import tempfile

import pytest

from torchlab.core.safe_open import UnsafeFileError
from torchlab.core.wire.runtime import ORPHAN_TOKEN_AGE_S, Endpoint, list_runs, read_runs, runtime_dir


@pytest.fixture
def short_runtime_dir(monkeypatch):
    """A runtime directory of this test's runs only, 0700 as the system makes one, at a path short enough for the
    sockets bound in it: a socket's path is at most 107 bytes, which one under pytest-xdist's ``tmp_path``
    (``/tmp/pytest-of-root/pytest-482/popen-gw0/test_the_attach_listing_fits_80/xdg/torchlab/...``) passes."""
    folder = tempfile.mkdtemp(prefix="tl-xdg-")
    monkeypatch.setenv("XDG_RUNTIME_DIR", folder)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_listing_runs_sweeps_what_killed_trainers_left_and_nothing_else(tmp_path, monkeypatch):
    (tmp_path / "xdg").mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))  # this test's runs only
    directory = runtime_dir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_writer = directory / f"run-dead.json.tmp-{gone.stdout.strip()}"
    live_writer = directory / f"run-live.json.tmp-{os.getpid()}"
    old_orphan, new_orphan = directory / "run-old.token", directory / "run-new.token"
    for path in (dead_writer, live_writer, old_orphan, new_orphan):
        path.write_text("x")
    long_ago = time.time() - ORPHAN_TOKEN_AGE_S - 60
    os.utime(old_orphan, (long_ago, long_ago))
    with_entry = Endpoint.create("run-listed")  # an old token beside its run's entry stays
    with_entry.write_info({"pid": os.getpid(), "state": "running", "started": time.time()})
    os.utime(with_entry.token_path, (long_ago, long_ago))

    [entry] = list_runs()

    assert entry.endpoint.name == "run-listed" and with_entry.token_path.exists()
    assert not dead_writer.exists() and not old_orphan.exists()
    assert live_writer.exists(), "a writer that still runs may be between its write and its rename"
    assert new_orphan.exists(), "a trainer that is starting makes its socket and entry after its token"


def test_sockets_no_process_serves_are_swept_once_old_and_served_ones_are_kept(tmp_path, monkeypatch):
    import socket

    from torchlab.core.wire.runtime import STALE_SOCKET_AGE_S

    (tmp_path / "xdg").mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    directory = runtime_dir()
    long_ago = time.time() - STALE_SOCKET_AGE_S - 60

    def bound(name: str, *, listening: bool, old: bool) -> tuple[socket.socket, os.PathLike]:
        path = directory / name
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(path))
        if listening:
            server.listen(1)
        if old:
            os.utime(path, (long_ago, long_ago), follow_symlinks=False)
        return server, path

    killed_at_start_up, killed_path = bound("run-killed.sock", listening=False, old=True)
    (directory / "run-killed.token").write_text("x")
    stale_ranks, stale_ranks_path = bound("ranks-0a1b2c.sock", listening=False, old=True)
    live_ranks, live_ranks_path = bound("ranks-3d4e5f.sock", listening=True, old=True)
    just_bound, just_bound_path = bound("run-starting.sock", listening=False, old=False)
    try:
        assert list_runs() == []
        assert not killed_path.exists() and not (directory / "run-killed.token").exists()
        assert not stale_ranks_path.exists()
        assert live_ranks_path.exists(), "a supervisor's channel that still serves its ranks"
        assert just_bound_path.exists(), "a trainer between its bind and its listen"
    finally:
        for server in (killed_at_start_up, stale_ranks, live_ranks, just_bound):
            server.close()


def test_attach_lists_a_run_killed_while_starting_once_then_forgets_it(tmp_path, monkeypatch, capsys):
    from torchlab.core.launch.attach import main as attach

    (tmp_path / "xdg").mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    endpoint = Endpoint.create("run-killed-starting")
    endpoint.write_info({"pid": int(dead.stdout), "state": "starting", "step": 0, "started": time.time(), "run_dir": "runs/x"})

    assert attach([]) == 0
    first = capsys.readouterr().out
    assert "run-killed-starting" in first and "gone" in first and "listed this once" in first
    assert not endpoint.info_path.exists() and not endpoint.token_path.exists()
    assert attach([]) == 0
    assert "run-killed-starting" not in capsys.readouterr().out


def test_a_run_whose_socket_nobody_serves_is_gone_even_when_its_pid_now_names_another_process(monkeypatch, short_runtime_dir):
    import socket

    from torchlab.core.launch.attach import forget_gone_runs
    from torchlab.core.wire.runtime import STALE_SOCKET_AGE_S

    long_ago = time.time() - STALE_SOCKET_AGE_S - 60
    killed, live = Endpoint.create("run-killed-starting"), Endpoint.create("run-live")
    # Both pids name this process, which runs: as after the system gave a dead trainer's pid to another one.
    killed.write_info({"pid": os.getpid(), "state": "starting", "step": 0, "started": long_ago, "run_dir": "runs/x"})
    live.write_info({"pid": os.getpid(), "state": "running", "step": 40, "started": long_ago + 1, "run_dir": "runs/y"})
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unserved, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as served:
        unserved.bind(str(killed.socket_path))  # its trainer was killed: the file stays, nobody listens
        served.bind(str(live.socket_path))
        served.listen(1)
        for endpoint in (killed, live):
            os.utime(endpoint.socket_path, (long_ago, long_ago))

        entries = list_runs()
        assert [(entry.endpoint.name, entry.state, entry.live) for entry in entries] == [
            ("run-killed-starting", "gone", False), ("run-live", "running", True)]
        forget_gone_runs(entries)  # what attach does once it has listed them
        assert not any(path.exists() for path in (killed.socket_path, killed.token_path, killed.info_path))
        assert all(path.exists() for path in (live.socket_path, live.token_path, live.info_path))


def test_a_socket_listens_privately_without_touching_the_process_umask(tmp_path, monkeypatch):
    """The umask is process-wide: set around bind(), a folder another thread made meanwhile came out 0600."""
    from torchlab.core.wire.runtime import listen_privately

    monkeypatch.setattr(os, "umask", lambda *_: pytest.fail("the process umask was changed"))
    listener = listen_privately(tmp_path / "run.sock")
    try:
        assert stat.S_ISSOCK((tmp_path / "run.sock").stat().st_mode)
        assert (tmp_path / "run.sock").stat().st_mode & 0o777 == 0o600
        assert [path.name for path in tmp_path.iterdir()] == ["run.sock"]  # no staging folder left
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(tmp_path / "run.sock"))
            listener.accept()[0].close()
    finally:
        listener.close()


def test_the_attach_listing_fits_80_columns_with_each_runs_step_and_its_directory_under_it(monkeypatch, capsys, short_runtime_dir):
    import socket

    from torchlab.core.launch.attach import main as attach

    live = Endpoint.create("20261123-204626-tiny_gpt")
    live.write_info({"pid": os.getpid(), "state": "running", "step": 1240, "steps": 20000, "started": time.time() - 750,
                     "attached": True, "workload": "/home/someone/projects/models/transformer.py:workload",
                     "run_dir": "/home/someone/projects/models/runs/20261123-204626-transformer"})
    other = Endpoint.create("20261123-210000-mlp")  # two live runs: attach lists them and opens neither
    other.write_info({"pid": os.getpid(), "state": "paused", "step": 7, "steps": 200, "started": time.time() - 5,
                      "workload": "mlp", "run_dir": "runs/20261123-210000-mlp"})
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as served, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as also:
        served.bind(str(live.socket_path))
        served.listen(1)
        also.bind(str(other.socket_path))
        also.listen(1)
        assert attach([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[3].split()[:3] == ["20261123-210000-mlp", "7/200", "paused"] and lines[4] == "  mlp · runs/20261123-210000-mlp"
    assert lines[0].split() == ["NAME", "STEP", "STATE", "STARTED"]
    assert lines[1].split()[:2] == ["20261123-204626-tiny_gpt", "1240/20000"] and "running, app attached" in lines[1]
    assert lines[1].endswith("12m ago")
    assert lines[2] == "  /home/someone/projects/models/transformer.py:workload · /home/someone/projects/models/runs/20261123-204626-transformer"
    assert all(len(line) <= 80 for line in lines[:2] + lines[3:5])


def test_a_run_with_a_long_name_is_listed_in_80_columns_its_name_on_a_line_of_its_own():
    """Seen as a user: a custom workload's long file name in the run's name, attached and far along, made a
    listing line of 91 columns."""
    from torchlab.core.launch.attach import format_runs

    class Entry:  # what format_runs reads of a RunEntry
        def __init__(self, name: str, info: dict) -> None:
            self.endpoint, self.info, self.state, self.live = type("E", (), {"name": name})(), info, info["state"], True

    long_name = "20261124-194448-my_transformer_experiment_v2"[:47]
    listing = format_runs([
        Entry(long_name, {"state": "running", "attached": True, "step": 1234567, "steps": 10000000,
                          "started": time.time() - 45000, "workload": "my_transformer_experiment_v2.py:workload",
                          "run_dir": "runs/x"}),
        Entry("20261124-200000-mlp", {"state": "paused", "step": 7, "steps": 200, "started": time.time(),
                                      "workload": "mlp", "run_dir": "runs/y"}),
    ]).splitlines()
    assert all(len(line) <= 80 for line in listing), listing
    assert listing[0] == long_name and listing[1].startswith("  step 1234567/10000000 · running, app attached · started 12h")
    assert listing[3:5] == ["20261124-200000-mlp", "  step 7/200 · paused · started 0s ago"]


def test_a_runtime_dir_that_cannot_be_made_is_one_paragraph_naming_xdg_runtime_dir(tmp_path, monkeypatch, capsys):
    from torchlab.core.launch.attach import main as attach

    not_a_folder = tmp_path / "run-user-1000"  # as after `su bob`: the first user's XDG_RUNTIME_DIR, not bob's to use
    not_a_folder.write_text("")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(not_a_folder))
    assert attach([]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"torchlab-tui attach: {not_a_folder / 'torchlab'} cannot be used: ") and "Traceback" not in err
    assert err.rstrip().endswith(f"XDG_RUNTIME_DIR={not_a_folder} is not a folder of yours: set XDG_RUNTIME_DIR to your own (or unset it).")


def test_attach_listing_into_a_pipe_closed_early_ends_quietly(tmp_path):
    (tmp_path / "xdg").mkdir(mode=0o700)
    read_end, write_end = os.pipe()
    os.close(read_end)  # `torchlab-tui attach | head -1`, head gone before the listing is written
    done = subprocess.run([sys.executable, "-m", "torchlab.core.launch.cli", "attach"], stdout=write_end, stderr=subprocess.PIPE,
                          text=True, env={**os.environ, "XDG_RUNTIME_DIR": str(tmp_path / "xdg")}, timeout=60)
    os.close(write_end)
    assert (done.returncode, done.stderr) == (0, "")


# ------------------------------------------------------------------------------ entries someone else made (issue 26)
# The runtime directory is the user's own (0700): what lies in it was put there by the user's processes, or by
# someone who could already act as the user. Still, a FIFO there must not hang a listing, a link is not followed,
# and an entry that is not one of ours is skipped with a line, never a traceback.


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    (tmp_path / "xdg").mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    return runtime_dir()


def bounded(call, timeout_s: float = 10.0):
    """``call()``'s result, or a failure if it has not returned within ``timeout_s`` (a FIFO's open blocks for ever)."""
    import threading

    outcome = {}

    def run():
        try:
            outcome["value"] = call()
        except BaseException as error:  # noqa: BLE001 - handed to the test below
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"still blocked after {timeout_s} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def unblock(fifo) -> None:
    """Open a FIFO's other end, so that a reader blocked on it (before a fix) can end."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def test_a_fifo_or_a_link_as_an_entry_is_skipped_without_blocking_or_following(runtime, tmp_path):
    good = Endpoint.create("run-good")
    good.write_info({"pid": os.getpid(), "state": "running", "step": 3, "started": time.time(), "run_dir": "runs/x"})
    os.mkfifo(runtime / "run-fifo.json")
    elsewhere = tmp_path / "not-an-entry.json"
    elsewhere.write_text('{"pid": 1, "state": "running", "run_dir": "/elsewhere"}')
    os.symlink(elsewhere, runtime / "run-link.json")
    try:
        entries, skipped = bounded(read_runs)
    finally:
        unblock(runtime / "run-fifo.json")
    assert [entry.endpoint.name for entry in entries] == ["run-good"]
    assert sorted(skipped) == sorted([
        f"{runtime / 'run-fifo.json'}: a FIFO (named pipe), not a regular file",
        f"{runtime / 'run-link.json'}: a symbolic link, not a regular file",
    ])


def test_a_fifo_or_a_link_as_a_token_is_refused_in_one_paragraph(runtime, tmp_path):
    fifo = Endpoint(runtime / "run-fifo.sock", runtime / "run-fifo.token")
    os.mkfifo(fifo.token_path)
    try:
        with pytest.raises(UnsafeFileError, match="is a FIFO"):
            bounded(fifo.read_token)
    finally:
        unblock(fifo.token_path)
    someone_elses = tmp_path / "their-file"
    someone_elses.write_text("theirs")
    linked = Endpoint(runtime / "run-link.sock", runtime / "run-link.token")
    os.symlink(someone_elses, linked.token_path)
    with pytest.raises(UnsafeFileError, match="is a symbolic link"):
        linked.read_token()
    with pytest.raises(UnsafeFileError, match="is a symbolic link"):
        linked.create_token()  # a new token is never written through a link
    os.symlink(someone_elses, linked.info_path.with_suffix(f".json.tmp-{os.getpid()}"))
    with pytest.raises(UnsafeFileError, match="is a symbolic link"):
        linked.write_info({"state": "running"})
    assert someone_elses.read_text() == "theirs"


CORRUPT_ENTRIES = {
    "started-text": ('{"pid": 1, "state": "running", "started": "abc"}', "started: expected a number, got 'abc'"),
    "pid-huge": ('{"pid": 1180591620717411303424, "state": "running"}', "pid: expected a process id, got 1180591620717411303424"),
    "pid-text": ('{"pid": "1", "state": "running"}', "pid: expected a process id, got '1'"),
    "step-list": ('{"pid": 1, "step": [1]}', "step: expected a count, got [1]"),
    "steps-infinite": ('{"pid": 1, "steps": 1e400}', "steps: expected a count or null, got inf"),
    "started-infinite": ('{"pid": 1, "started": 1e400}', "started: expected a number, got inf"),
    "state-number": ('{"pid": 1, "state": 5}', "state: expected text, got 5"),
    "run-dir-dict": ('{"pid": 1, "run_dir": {"a": 1}}', "run_dir: expected text, got {'a': 1}"),
    "args-text": ('{"pid": 1, "training_args": "--steps 5"}', "training_args: expected a list of text, got '--steps 5'"),
    "attached-text": ('{"pid": 1, "attached": "yes"}', "attached: expected true or false, got 'yes'"),
    "a-list": ("[1, 2, 3]", "not a JSON object"),
    "not-json": ("{pid: 1", "not JSON (or nested too deep, or a number too long to read)"),
    "nested": ('{"pid": ' + "[" * 100_000 + "]" * 100_000 + "}", "not JSON (or nested too deep, or a number too long to read)"),
    "digits": ('{"pid": ' + "9" * 5000 + "}", "not JSON (or nested too deep, or a number too long to read)"),
    "not-utf-8": ("\udcff", "not JSON (or nested too deep, or a number too long to read)"),
}


def test_an_entry_that_is_not_one_of_ours_is_skipped_with_why_and_the_others_listed(runtime):
    """``"started": "abc"`` raised ValueError from the listing's sort, a 70-bit pid OverflowError from os.kill,
    a nested one RecursionError: attach ended in a traceback, for the one bad entry, listing none."""
    good = Endpoint.create("run-good")
    good.write_info({"pid": os.getpid(), "state": "running", "step": 3, "steps": 10, "started": time.time(),
                     "run_dir": "runs/x", "workload": "mlp", "attached": False, "training_args": ["mlp"]})
    for name, (text, _) in CORRUPT_ENTRIES.items():
        (runtime / f"run-{name}.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    entries, skipped = read_runs()
    assert [entry.endpoint.name for entry in entries] == ["run-good"] and list_runs() == entries
    assert sorted(skipped) == sorted(f"{runtime / f'run-{name}.json'}: {why}" for name, (_, why) in CORRUPT_ENTRIES.items())


def test_attach_lists_the_good_runs_and_says_one_line_for_each_entry_it_skipped(runtime, capsys):
    from torchlab.core.launch.attach import main as attach

    (runtime / "run-bad.json").write_text('{"pid": 1, "state": "running", "started": "abc"}')
    good = Endpoint.create("run-good")
    good.write_info({"pid": os.getpid(), "state": "finished", "step": 3, "started": time.time(), "run_dir": "runs/x"})
    assert attach([]) == 0
    out, err = capsys.readouterr()
    assert "run-good" in out and "run-bad" not in out
    assert err == (f"torchlab-tui attach: skipped {runtime / 'run-bad.json'}: started: expected a number, got 'abc'; "
                   "it is not an entry torchlab wrote: remove it.\n")


def test_what_attach_prints_of_an_entry_shows_control_characters_escaped(runtime, capsys):
    """A run_dir of ``\\x1b]0;evil\\x07`` retitled the terminal, ``\\x1b[2J`` cleared it: attach printed them raw."""
    from torchlab.core.launch.attach import main as attach

    evil = "\x1b]0;evil\x07/runs/\x1b[2J\u202ex"
    name = "run-\x1b[31mred"
    entry = Endpoint.create(name)
    entry.write_info({"pid": os.getpid(), "state": "finished", "step": 3, "started": time.time(), "run_dir": evil,
                      "workload": "\x1b[2Jmlp"})
    assert attach([]) == 0
    assert attach([name]) == 0  # a run that ended: said once, with its directory
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "\\x1b]0;evil\\x07/runs/\\x1b[2J\\u202ex" in out and "run-\\x1b[31mred" in out and "\\x1b[2Jmlp" in out


def test_the_runtime_directory_is_refused_unless_it_is_the_users_own_folder_0700(tmp_path, monkeypatch):
    """Refused as a ConfigError, which every entry point shows as one paragraph (the app included)."""
    from torchlab.core.errors import ConfigError
    from torchlab.core.wire.runtime import RuntimeDirError

    (tmp_path / "xdg").mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    (tmp_path / "xdg" / "torchlab").mkdir(mode=0o755)
    with pytest.raises(RuntimeDirError, match=r"has mode 755, not 700: run chmod 700 .*torchlab\.$") as refused:
        runtime_dir()
    assert isinstance(refused.value, ConfigError)
    (tmp_path / "xdg" / "torchlab").rmdir()
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    os.symlink(tmp_path / "elsewhere", tmp_path / "xdg" / "torchlab")
    with pytest.raises(RuntimeDirError, match="is not a directory"):
        runtime_dir()
    (tmp_path / "xdg" / "torchlab").unlink()
    assert runtime_dir() == tmp_path / "xdg" / "torchlab" and stat.S_IMODE(runtime_dir().stat().st_mode) == 0o700
