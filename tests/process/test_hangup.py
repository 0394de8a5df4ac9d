"""A hang-up detaches: the real app in a real pseudo-terminal, whose terminal then goes away.

Closing a pty's master side is what sshd does when the connection drops (and tmux when a pane is
killed): the kernel hangs up the terminal and sends SIGHUP to its session. The app must ask its
trainer to go on, and the run must be there for ``attach``.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import threading

import pytest

from processes import alive
from test_detach import TINY, _last_step, _until, private_runtime_dir  # noqa: F401  (a fixture)
from test_worker import Collected
from torchlab.core.wire import protocol as p
from torchlab.core.wire.runtime import list_runs
from torchlab.tui.link import ProcessLink


def _controlling_terminal() -> None:
    """In the child: a session of its own, with the pty (its stdin) as controlling terminal."""
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Screen:
    """Reads the pty's master side so the app never blocks on a full terminal; stops on request."""

    def __init__(self, master: int) -> None:
        self.master = master
        self.stopped = threading.Event()
        self.output = bytearray()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while not self.stopped.is_set():
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                try:
                    self.output += os.read(self.master, 65536)
                except OSError:
                    return

    def hang_up(self) -> None:
        self.stopped.set()
        self.thread.join()
        os.close(self.master)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pty and controlling-terminal semantics of Linux")
def test_a_hang_up_detaches_and_the_run_trains_on(tmp_path):
    run_dir = tmp_path / "run"
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    environment = {**os.environ, "TERM": "xterm-256color"}
    app = subprocess.Popen(
        [sys.executable, "-m", "torchlab.core.launch.cli", f"{TINY}:workload", "--steps", "1000000", "--checkpoint-every", "0",
         "--run-dir", str(run_dir)],
        stdin=slave, stdout=slave, stderr=slave, env=environment, preexec_fn=_controlling_terminal,
    )
    os.close(slave)
    screen = Screen(master)
    trainer = None
    try:
        _until(lambda: len(list_runs()) == 1 and list_runs()[0].info.get("attached"), what="the app to attach")
        [entry] = list_runs()
        trainer = entry.info["pid"]
        _until(lambda: (run_dir / "metrics.jsonl").exists() and _last_step(run_dir) > 20, what="training")
        assert b"gradient norms" in screen.output  # the app really drew in this terminal

        screen.hang_up()
        assert app.wait(timeout=30) == 0
        step_at_hangup = _last_step(run_dir)
        _until(lambda: _last_step(run_dir) > step_at_hangup + 100, what="training to go on after the hang-up")
        [entry] = list_runs()
        assert entry.live and not entry.info["attached"] and alive(trainer)
        events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
        assert not any(event["event"] == "run_ended" for event in events)

        attached = ProcessLink.attach(entry)
        attached.start()
        Collected(attached).until(lambda m: isinstance(m, p.Welcome))
        attached.close()
        _until(lambda: not alive(trainer), timeout=30, what="the trainer to stop when the attached app quits")
        assert (run_dir / "checkpoints" / "last.pt").exists()
    finally:
        if not screen.stopped.is_set():
            screen.hang_up()
        if app.poll() is None:
            app.kill()
        if trainer is not None and alive(trainer):
            os.kill(trainer, 9)

