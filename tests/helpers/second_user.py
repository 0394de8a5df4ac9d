"""Code run as a second, real user of this machine, for the tests of what another user meets when they point a
command at a user's run (issue 46: ``stop`` on another user's private run directory).

Why fork and ``setuid`` rather than ``runuser -u OTHER -- python -m ...``: the tests' interpreter is the project's
virtual environment, which lives under ``/root`` (mode 0700), and another user cannot execute a file there, nor
import torchlab from there. A child forked from the test process has the interpreter and the modules it needs in
memory already; it gives up root (``setgroups``, ``setgid``, ``setuid``: for good, no way back) and runs the code as
the other user would, on the same files and with the same permissions. Import what the code needs before calling
``run_as``: the child cannot read the virtual environment to import it.

The user is made with ``useradd`` and removed after (``userdel``); without root or ``useradd`` the test is skipped.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

#: The exit code of a child whose function raised (its traceback is in its stderr): no command exits so.
RAISED = 70


@dataclass(frozen=True)
class OtherUser:
    """A throwaway user: its name and ids, and a private runtime directory of its own (``XDG_RUNTIME_DIR``, where
    its runs' sockets would be), which ``run_as`` gives the code it runs."""

    name: str
    uid: int
    gid: int
    runtime_dir: Path


@dataclass(frozen=True)
class Ran:
    """What the code run as the other user did: its exit code, and what it wrote on stdout and stderr."""

    code: int
    stdout: str
    stderr: str


@contextmanager
def throwaway_user() -> Iterator[OtherUser]:
    """A new user with no home and no login shell, removed (with its runtime directory) when the block ends; the
    test is skipped where one cannot be made (not root, no ``useradd``)."""
    if os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("needs root and useradd/userdel to make a second user")
    name = f"tlab{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", name],
                   check=True, capture_output=True)
    runtime_dir = Path(tempfile.mkdtemp(prefix=f"{name}-xdg-"))
    try:
        entry = pwd.getpwnam(name)
        os.chown(runtime_dir, entry.pw_uid, entry.pw_gid)  # mkdtemp made it 0700: the user's alone
        yield OtherUser(name, entry.pw_uid, entry.pw_gid, runtime_dir)
    finally:
        shutil.rmtree(runtime_dir, ignore_errors=True)
        subprocess.run(["userdel", name], check=False, capture_output=True)


@pytest.fixture
def attacker():
    """A throwaway user by name alone, for commands run as them with ``runuser`` (root and useradd needed),
    removed with its files after the test (a fixture)."""
    if os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("runuser") is None:
        pytest.skip("needs root and useradd/runuser to make a second user")
    name = f"tlab{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True, capture_output=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


def run_as(user: OtherUser, function: Callable[..., int | None], *args: object) -> Ran:
    """``function(*args)`` run as ``user`` in a forked child; its return value is the child's exit code (None: 0)."""
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:  # open before: the child inherits them
        sys.stdout.flush()
        sys.stderr.flush()
        child = os.fork()
        if child == 0:
            _be(user, function, args, stdout.fileno(), stderr.fileno())  # never returns
        _, status = os.waitpid(child, 0)
        stdout.seek(0)
        stderr.seek(0)
        return Ran(os.waitstatus_to_exitcode(status), stdout.read().decode("utf-8", "replace"),
                   stderr.read().decode("utf-8", "replace"))


def _be(user: OtherUser, function: Callable[..., int | None], args: tuple, stdout_fd: int, stderr_fd: int) -> None:
    """The child: become ``user`` for good, run ``function``, and end with its code, whatever happens (``_exit``:
    none of the test process's cleanups, which are the parent's, run here)."""
    code = RAISED
    try:
        os.dup2(stdout_fd, 1)
        os.dup2(stderr_fd, 2)
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False, buffering=1)  # pytest's capture is the parent's
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False, buffering=1)
        os.setgroups([])
        os.setgid(user.gid)
        os.setuid(user.uid)
        os.environ.update(XDG_RUNTIME_DIR=str(user.runtime_dir), HOME=str(user.runtime_dir), USER=user.name,
                          LOGNAME=user.name)
        result = function(*args)
        code = 0 if result is None else int(result)
    except SystemExit as exit_:  # argparse's usage error: its code, as the command would end
        code = exit_.code if isinstance(exit_.code, int) else RAISED
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
