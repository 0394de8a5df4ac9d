"""The trainer process and its link: real processes, a real socket, the real protocol."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from processes import alive
from torchlab.core.wire import protocol as p
from torchlab.tui.link import ProcessLink

TINY = Path(__file__).parent.parent / "workloads" / "tiny.py"


class Collected:
    """Drains a link, keeping everything, and waits on its ``arrived`` event (no fixed sleeps)."""

    def __init__(self, link: ProcessLink) -> None:
        self.link = link
        self.messages: list[p.Message] = []

    def until(self, predicate, timeout: float = 120.0):
        deadline = time.monotonic() + timeout
        while True:
            self.messages.extend(self.link.drain())
            found = [m for m in self.messages if predicate(m)]
            if found:
                return found[-1]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                errors = [m.message for m in self.messages if isinstance(m, p.Error)]  # what went wrong, in its words
                raise AssertionError(f"timed out; got {[m.type for m in self.messages][-20:]}; errors: {errors}")
            self.link.arrived.wait(min(remaining, 1.0))
            self.link.arrived.clear()

    def of(self, kind):
        return [m for m in self.messages if isinstance(m, kind)]


@pytest.fixture
def link_for(tmp_path):
    links = []

    def start(*training_args: str, run_dir: Path | None = None) -> tuple[ProcessLink, Collected]:
        link = ProcessLink(run_dir or tmp_path / f"run{len(links)}", list(training_args))
        link.start()
        links.append(link)
        return link, Collected(link)

    yield start
    for link in links:
        link.close(grace_s=10)


def test_the_trainer_process_reports_and_obeys_the_app(link_for):
    link, seen = link_for(f"{TINY}:workload", "--steps", "100000", "--checkpoint-every", "0")
    welcome = seen.until(lambda m: isinstance(m, p.Welcome))
    assert [module.name for module in welcome.modules][:2] == ["stem", "body.0.0"]
    assert welcome.modules[0].params == 8 * 16 + 16
    assert welcome.run.run_dir == str(link.run_dir) and welcome.run.pid == link.pid
    seen.until(lambda m: isinstance(m, p.Metrics) and m.rows[-1].step >= 3)
    norms = seen.until(lambda m: isinstance(m, p.GradNorms))
    assert len(norms.norms) == len(welcome.modules)

    link.send(p.SetCommand(option="clip", value="0.5", source="--at"))  # a line cannot pass for the script
    ack = seen.until(lambda m: isinstance(m, p.OptionApplied))
    assert (ack.option, ack.value, ack.previous, ack.source) == ("clip", 0.5, None, "app")
    impact = seen.until(lambda m: isinstance(m, p.Impact) and len(m.segments) == 2)
    assert [row.change for row in impact.segments] == ["start", "clip=0.5"]
    assert impact.segments[1].first_step == ack.step
    link.send(p.SetCommand(option="amp", value="fp16"))
    refusal = seen.until(lambda m: isinstance(m, p.OptionRefused))
    assert "fp16 needs CUDA" in refusal.reason and refusal.step > ack.step - 1
    link.send(p.ProfileCommand(steps=3))
    seen.until(lambda m: isinstance(m, p.ProfileReady))

    link.send(p.DetachCommand())  # acknowledged; until the app closes the connection it stays in control
    seen.until(lambda m: isinstance(m, p.Detached))

    link.send(p.PauseCommand())
    paused = seen.until(lambda m: isinstance(m, p.State) and m.state == "paused")
    link.send(p.ResumeCommand())
    seen.until(lambda m: isinstance(m, p.State) and m.state == "running" and m.step > paused.step)
    rows = [r for m in seen.of(p.Metrics) for r in m.rows]
    assert next(r for r in rows if r.step == ack.step).options.clip == 0.5
    assert next(r for r in rows if r.step == ack.step - 1).options.clip is None

    assert link.close() == 0
    events = [json.loads(line) for line in (link.run_dir / "events.jsonl").read_text().splitlines()]
    [applied] = [e for e in events if e["event"] == "option_applied"]
    assert (applied["option"], applied["step"]) == ("clip", ack.step)
    assert events[-1]["event"] == "run_ended" and events[-1]["status"] == "stopped"
    assert (link.run_dir / "checkpoints" / "last.pt").exists()
    assert "torchlab.core.launch.worker" in " ".join(link.process.args) and str(link.run_dir) in link.process.args


def test_a_bad_workload_becomes_an_error_event_not_a_hang(link_for):
    link, seen = link_for(f"{TINY}:factory_raises")
    error = seen.until(lambda m: isinstance(m, p.Error))
    assert "factory_raises" in error.message and "dataset path /data/missing not found" in error.message
    seen.until(lambda m: isinstance(m, p.State) and m.state == "failed")
    assert link.process.wait(30) == 2


def test_a_killed_trainer_is_reported_with_its_signal(link_for):
    link, seen = link_for(f"{TINY}:workload", "--steps", "100000")
    seen.until(lambda m: isinstance(m, p.Metrics))
    os.kill(link.pid, signal.SIGKILL)
    error = seen.until(lambda m: isinstance(m, p.Error))
    assert "killed by signal 9 (SIGKILL)" in error.message
    assert seen.until(lambda m: isinstance(m, p.State)).state == "failed"


def test_restart_resumes_from_the_last_checkpoint(link_for):
    link, seen = link_for(f"{TINY}:raises_at_step_4", "--steps", "6")
    seen.until(lambda m: isinstance(m, p.Error))
    link.restart(resume=True)  # the workload raises again at its 4th call of this process: step 3 + 4 = 7
    seen.messages.clear()
    welcome = seen.until(lambda m: isinstance(m, p.Welcome))
    assert welcome.step == 3
    seen.until(lambda m: isinstance(m, p.State) and m.state == "finished")


def raw_client(socket_path: Path) -> socket.socket:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(str(socket_path))
    client.settimeout(30)
    return client


def read_message(client: socket.socket) -> p.Message:
    data = b""
    while not data.endswith(b"\n"):
        chunk = client.recv(65536)
        if not chunk:
            break
        data += chunk
    return p.decode(data.split(b"\n")[0])


def test_only_the_token_holder_controls_and_garbage_is_refused(link_for):
    link, seen = link_for(f"{TINY}:workload", "--steps", "100000")
    seen.until(lambda m: isinstance(m, p.Metrics))
    socket_path = link._endpoint.socket_path
    assert oct(socket_path.stat().st_mode & 0o777) == "0o600"
    assert oct(socket_path.parent.stat().st_mode & 0o777) == "0o700"
    assert oct(link._endpoint.token_path.stat().st_mode & 0o777) == "0o600"

    intruder = raw_client(socket_path)
    intruder.sendall(p.Hello(version=p.PROTOCOL_VERSION, token="guess").encode())
    assert "wrong token" in read_message(intruder).reason
    second = raw_client(socket_path)
    second.sendall(p.Hello(version=p.PROTOCOL_VERSION, token=link._endpoint.read_token()).encode())
    assert "another app is already attached" in read_message(second).reason
    garbage = raw_client(socket_path)
    garbage.sendall(b"\x00\xff not json\n")
    assert "expected a hello" in read_message(garbage).reason

    link.send(p.SetCommand(option="accum", value="2"))  # the rightful app is still in control
    assert seen.until(lambda m: isinstance(m, p.OptionApplied)).value == 2
    link._socket.sendall(f'{{"v": {p.PROTOCOL_VERSION}, "type": "set", "option": 3}}\n'.encode())  # malformed from the app itself
    refused = seen.until(lambda m: isinstance(m, p.Refused))
    assert "set.option: expected str" in refused.reason
    count = sum(len(m.columns["step"]) for m in seen.of(p.Metrics))
    seen.until(lambda m: isinstance(m, p.Metrics) and sum(len(x.columns["step"]) for x in seen.of(p.Metrics)) > count)


APP_STAND_IN = """
import sys, time
from pathlib import Path
from torchlab.tui.link import ProcessLink
link = ProcessLink(Path(sys.argv[1]), [sys.argv[2], "--steps", "100000"])
link.start()
print(link.pid, flush=True)
while True:
    time.sleep(1)
"""


def app_stand_in_with_its_trainer(run_dir: Path, workload: str, started) -> tuple[subprocess.Popen, int]:
    """An app's process (APP_STAND_IN) that has spawned its trainer, once ``started()`` holds; and the trainer's pid."""
    app = subprocess.Popen([sys.executable, "-c", APP_STAND_IN, str(run_dir), workload], stdout=subprocess.PIPE, text=True)
    trainer_pid = int(app.stdout.readline())
    deadline = time.monotonic() + 60
    while not started():
        assert time.monotonic() < deadline, "the trainer never got that far"
        time.sleep(0.05)
    return app, trainer_pid


def kill_the_app_and_wait_for_its_trainer(app: subprocess.Popen, trainer_pid: int, within_s: float) -> None:
    app.kill()
    app.wait()
    killed_at = time.monotonic()
    while alive(trainer_pid):
        assert time.monotonic() - killed_at < within_s, f"the trainer outlived its app by {within_s} s"
        time.sleep(0.02)


def test_kill_9_of_the_app_leaves_no_trainer_behind(tmp_path):
    """The app's process dies without a word; its trainer checkpoints and exits within seconds."""
    metrics = tmp_path / "run" / "metrics.jsonl"
    app, trainer_pid = app_stand_in_with_its_trainer(
        tmp_path / "run", f"{TINY}:workload", lambda: metrics.exists() and metrics.stat().st_size > 0)  # training has begun
    kill_the_app_and_wait_for_its_trainer(app, trainer_pid, within_s=5.0)
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert any(e["event"] == "checkpoint" and e["reason"] == "final" for e in events)


def test_a_trainer_stopped_while_it_loads_leaves_nothing_in_the_runtime_directory(tmp_path):
    """The app went away (its parent-death signal, or a SIGTERM) before the workload had loaded: the
    trainer exits at once, and takes its socket, token and entry with it."""
    from torchlab.core.wire.runtime import runtime_dir

    def files_of_run() -> set[Path]:
        return {path for path in runtime_dir().glob("loading-*") if path.suffix in (".sock", ".token", ".json")} - earlier

    earlier = frozenset(runtime_dir().glob("loading-*"))  # another test's, if any
    app, trainer_pid = app_stand_in_with_its_trainer(  # it serves, and has published its entry
        tmp_path / "loading", f"{TINY}:slow_to_load", lambda: any(path.suffix == ".json" for path in files_of_run()))
    kill_the_app_and_wait_for_its_trainer(app, trainer_pid, within_s=10.0)
    assert files_of_run() == set()
