"""Detach and attach: a detached trainer trains on alone, ``attach`` finds it, and history replays."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from processes import alive
from test_worker import TINY, Collected
from torchlab.core.wire import protocol as p
from torchlab.core.launch.attach import main as attach_main
from torchlab.core.wire.runtime import Endpoint, find_run, list_runs
from torchlab.core.launch.worker import Worker
from torchlab.tui.link import ProcessLink


@pytest.fixture(autouse=True)
def private_runtime_dir(tmp_path, monkeypatch):
    """Each test lists only its own runs (the runtime directory is per user, shared by every run)."""
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))


def _started(run_dir: Path, *args: str) -> tuple[ProcessLink, Collected]:
    link = ProcessLink(run_dir, [f"{TINY}:workload", "--checkpoint-every", "0", *args])
    link.start()
    return link, Collected(link)


def _detach(link: ProcessLink, seen: Collected) -> p.Detached:
    link.send(p.DetachCommand())
    acknowledgement = seen.until(lambda m: isinstance(m, p.Detached))
    link.close(detach=True)
    return acknowledgement


def _until(condition, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _last_step(run_dir: Path) -> int:
    """The step of the last whole row: the trainer may be in the middle of writing the next one."""
    lines = (run_dir / "metrics.jsonl").read_text().split("\n")[:-1]  # what follows the last newline is unfinished
    return json.loads(lines[-1])["step"] if lines else 0


def test_a_detached_trainer_trains_on_and_attach_replays_its_history(tmp_path, capsys):
    """Also: ``attach`` without a name, piped (`torchlab-tui attach | head`), drew the app's escape codes into the
    pipe of a live run; it only lists where its output is not a terminal (this run shows it: a trainer of its own
    was a torch import more)."""
    run_dir = tmp_path / "run"
    link, seen = _started(run_dir, "--steps", "1000000")
    seen.until(lambda m: isinstance(m, p.Metrics) and m.rows[-1].step >= 20)
    detached_at = _detach(link, seen).step
    assert link.process.poll() is None, "detaching must not stop the trainer"

    entry = find_run(link.endpoint_name)
    _until(lambda: not find_run(link.endpoint_name).info["attached"], what="the entry to say no app is attached")
    assert entry.live and entry.info["run_dir"] == str(run_dir.resolve()) and entry.info["pid"] == link.pid
    assert find_run(str(run_dir)).endpoint == entry.endpoint  # by run directory, too
    _until(lambda: _last_step(run_dir) > detached_at + 50, what="training to go on while detached")

    assert attach_main([]) == 0
    assert (f"Not opened (the output is not a terminal): `torchlab-tui attach {entry.endpoint.name}` from one."
            in capsys.readouterr().out)
    assert link.process.poll() is None

    attached = ProcessLink.attach(find_run(link.endpoint_name))
    attached.start()
    again = Collected(attached)
    welcome = again.until(lambda m: isinstance(m, p.Welcome))
    assert welcome.state == "running" and welcome.step > detached_at
    again.until(lambda m: isinstance(m, p.Metrics))
    assert again.of(p.Metrics)[0].rows[0].step == 1, "the curves are full at once: history replays from the ring"
    _until(lambda: find_run(link.endpoint_name).info["attached"], what="the entry to say an app is attached")

    second = ProcessLink.attach(find_run(link.endpoint_name))  # one app per run: a second is turned away
    second.start()
    turned_away = Collected(second)
    left = turned_away.until(lambda m: isinstance(m, p.State) and m.state == "detached")
    assert "another app is already attached" in second.refused and left.detail == second.refused
    second.close(detach=True)
    assert link.process.poll() is None, "a refused app must not stop the run"

    attached.send(p.SetCommand(option="accum", value="2"))
    assert again.until(lambda m: isinstance(m, p.OptionApplied) and m.option == "accum").value == 2
    attached.close()  # q in the attached app: the trainer stops, with a final checkpoint
    assert link.process.wait(timeout=30) == 0
    assert (run_dir / "checkpoints" / "last.pt").exists()
    assert [e.endpoint.name for e in list_runs()] == []  # nothing left behind


def test_a_detached_run_that_finishes_is_reported_once_by_attach(tmp_path, capsys):
    run_dir = tmp_path / "run"
    link, seen = _started(run_dir, "--steps", "400")
    seen.until(lambda m: isinstance(m, p.Metrics))
    _detach(link, seen)
    assert link.process.wait(timeout=120) == 0
    [entry] = list_runs()
    assert entry.state == "finished" and entry.info["step"] == 400 and not entry.live
    assert not entry.endpoint.socket_path.exists() and not entry.endpoint.token_path.exists()

    assert attach_main([]) == 0
    listing = capsys.readouterr().out
    assert entry.endpoint.name in listing and "finished" in listing and "400/400" in listing
    assert attach_main([entry.endpoint.name[:12]]) == 0
    said = capsys.readouterr().out
    assert "finished at step 400" in said and str(run_dir.resolve()) in said
    assert list_runs() == []
    assert attach_main(["nothing-like-it"]) == 2


def test_the_final_entry_is_not_overwritten_by_a_late_registry_write(tmp_path):
    """The registry thread read "running" just before the end and wrote it just after the final entry."""
    endpoint = Endpoint.create("final-entry")
    worker = Worker(tmp_path / "run", endpoint, endpoint.read_token(), [f"{TINY}:workload"])
    try:
        worker.reporter.set_state("finished", 400)
        worker.publish(final=True)
        worker.reporter.set_state("running", 399)
        worker.publish()
        [entry] = list_runs()
        assert (entry.state, entry.info["step"]) == ("finished", 400)
    finally:
        worker.server.close()


APP_THAT_DETACHES_THEN_DIES = """
import sys, time
from pathlib import Path
from torchlab.tui.link import ProcessLink
link = ProcessLink(Path(sys.argv[1]), [sys.argv[2], "--steps", "1000000", "--checkpoint-every", "0"])
link.start()
while link._socket is None:
    time.sleep(0.05)
assert link.detach_and_wait(30.0), "no acknowledgement of the detach"
print(link.pid, link.endpoint_name, flush=True)
time.sleep(3600)
"""


def test_after_a_detach_the_apps_death_does_not_stop_the_trainer(tmp_path):
    """kill -9 of the app that started it (the parent-death signal fires): a detached trainer ignores it."""
    run_dir = tmp_path / "run"
    app = subprocess.Popen([sys.executable, "-c", APP_THAT_DETACHES_THEN_DIES, str(run_dir), f"{TINY}:workload"],
                           stdout=subprocess.PIPE, text=True)
    pid_text, name = app.stdout.readline().split()
    trainer = int(pid_text)
    try:
        app.kill()
        app.wait()
        step_at_death = _last_step(run_dir)
        _until(lambda: _last_step(run_dir) > step_at_death + 100, what="training to go on after the app died")
        assert alive(trainer)
        entry = find_run(name)
        assert entry.live and not entry.info["attached"]
        attached = ProcessLink.attach(entry)
        attached.start()
        Collected(attached).until(lambda m: isinstance(m, p.Welcome))
        attached.close()
        _until(lambda: not alive(trainer), timeout=30, what="the trainer to stop when the attached app quits")
    finally:
        if alive(trainer):
            os.kill(trainer, signal.SIGKILL)
