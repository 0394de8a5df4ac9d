"""Read-only viewers (issue 16) on a real trainer: beside the one app that controls it, any number of viewers
get the run with its history; what they send is refused; one killed with SIGKILL leaves the run training."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from test_worker import TINY, Collected
from torchlab.core.wire import protocol as p
from torchlab.core.wire.control_server import READ_ONLY
from torchlab.core.wire.runtime import list_runs
from torchlab.tui.link import ProcessLink

VIEWER = """
import socket, sys
from torchlab.core.wire.protocol import PROTOCOL_VERSION, Hello
client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
client.connect(sys.argv[1])
client.sendall(Hello(version=PROTOCOL_VERSION, token=open(sys.argv[2]).read(), view=True).encode())
client.recv(1 << 16)
print("viewing", flush=True)
while client.recv(1 << 16):
    pass
"""


def paused(seen: Collected) -> bool:
    return any(isinstance(m, p.State) and m.state == "paused" for m in seen.messages)


@pytest.fixture(autouse=True)
def private_runtime_dir(tmp_path, monkeypatch):
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))


@pytest.fixture
def controlled(tmp_path):
    """A run, and the link of the app that controls it."""
    link = ProcessLink(tmp_path / "run", [f"{TINY}:workload", "--checkpoint-every", "0", "--steps", "100000"])
    link.start()
    seen = Collected(link)
    seen.until(lambda m: isinstance(m, p.Metrics))
    yield link, seen
    link.close()


def test_viewers_see_the_run_their_commands_are_refused_and_one_killed_leaves_it_training(controlled):
    link, seen = controlled
    [entry] = list_runs()
    viewers = [ProcessLink.attach(entry, view=True) for _ in range(2)]
    views = []
    for viewer in viewers:
        viewer.start()
        views.append(Collected(viewer))
    for view in views:
        view.until(lambda m: isinstance(m, p.Metrics))  # history and the live stream, as the app gets them
    viewers[0].send(p.PauseCommand())
    assert views[0].until(lambda m: isinstance(m, p.Refused)).reason == READ_ONLY
    killed = subprocess.Popen([sys.executable, "-c", VIEWER, str(entry.endpoint.socket_path), str(entry.endpoint.token_path)],
                              stdout=subprocess.PIPE, text=True)
    assert killed.stdout.readline().strip() == "viewing"
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    # `attach --view RUN > file` wrote the app's escape codes into the file and hung at "connecting": now refused
    into_a_file = subprocess.run([sys.executable, "-m", "torchlab.core.launch.cli", "attach", "--view", entry.endpoint.name],
                                 capture_output=True, text=True, timeout=60)
    assert into_a_file.returncode == 2 and into_a_file.stdout == ""
    assert into_a_file.stderr.startswith(f"torchlab-tui attach: not opened: torchlab-tui attach {entry.endpoint.name} draws "
                                         "full screen, and its output and input are not a terminal")
    assert f"{entry.endpoint.name} is running at step " in into_a_file.stderr
    for viewer in viewers:
        viewer.close()  # a viewer closing only disconnects
    link.send(p.SetCommand("clip", 0.5))
    applied = seen.until(lambda m: isinstance(m, p.OptionApplied))
    assert applied.option == "clip" and not paused(seen)  # the viewer's pause never reached the run
    step = applied.step
    seen.until(lambda m: isinstance(m, p.Metrics) and m.columns["step"][-1] > step + 5)  # and it trains on


@pytest.mark.asyncio
async def test_the_viewers_app_shows_only_its_own_keys_sends_nothing_and_leaving_it_leaves_the_run(controlled):
    from torchlab.tui.app import TorchlabApp
    from torchlab.tui.widgets.event_log import EventLog
    from torchlab.tui.widgets.run_header import RunHeader

    link, seen = controlled
    [entry] = list_runs()
    app = TorchlabApp(lambda: ProcessLink.attach(entry, view=True), workload="tiny", poll_interval=0.05)
    async with app.run_test(size=(80, 24)) as pilot:
        while app.run_state.step == 0:
            await pilot.pause(0.05)
        assert "view only" in str(app.query_one(RunHeader).content)
        footer = {binding.key for (_, binding, enabled, _) in app.active_bindings.values() if enabled and binding.show}
        assert footer <= {"q", "question_mark", "ctrl+p"}  # a viewer's footer: only the keys that work for it
        await pilot.press("a", "space", "s")  # keys for the controlling app: nothing is sent, each refused in one line
        await pilot.pause()
        assert [line[9:] for line in app.query_one(EventLog).lines_written if "read-only view" in line] == [
            f"{subject}: read-only view (the controlling app changes the run)" for subject in ("amp", "pause", "save")]
        await pilot.press("q")
    assert app.return_code == 0
    seen.until(lambda m: isinstance(m, p.Metrics) and m.columns["step"][-1] > app.run_state.step + 5)
    assert not seen.of(p.OptionApplied) and not paused(seen) and link.process.poll() is None


@pytest.mark.asyncio
async def test_attaching_replays_the_past_into_the_log_with_one_toast_and_the_newest_lines_last(controlled):
    """Re-attaching used to raise a toast per old acknowledgement (~16 covered an 80x24 screen), log
    "connected" above the replayed past, and end the log with the trainer's old output."""
    from torchlab.tui.app import TorchlabApp
    from torchlab.tui.widgets.event_log import EventLog

    link, seen = controlled
    for value in (0.5, None, 0.25, None):
        link.send(p.SetCommand("clip", value))
        seen.until(lambda m: isinstance(m, p.OptionApplied) and m.value == value)
    with open(link.log_path, "a") as log:
        log.write("printed by the workload before anyone attached\n")
    [entry] = list_runs()
    app = TorchlabApp(lambda: ProcessLink.attach(entry, view=True), workload="tiny", poll_interval=0.05)
    toasts: list[str] = []  # the notices shown beside the log's line (tui/app_notices.py): one for the whole past
    show_notice = app.show_notice
    app.show_notice = lambda text, *args, **kwargs: (toasts.append(text), show_notice(text, *args, **kwargs))  # type: ignore[method-assign]
    async with app.run_test(size=(80, 24)) as pilot:
        log = app.query_one(EventLog)
        for _ in range(1200):
            if any(line.startswith("attached at step") for line in _texts(log)):
                break
            await pilot.pause(0.05)
        lines = _texts(log)
        attached = next(index for index, line in enumerate(lines) if line.startswith("attached at step"))
        assert lines[attached - 1].startswith("connected to the trainer of")
        # after it, only news: where the time goes now, from the rows the run reports since (core/analysis/bottleneck.py)
        assert all(line.startswith(("compute:", "input-bound:")) for line in lines[attached + 1:]), lines[attached:]
        assert sum("clip" in line for line in lines) >= 4  # the past is in the log, oldest first
        assert toasts == [lines[attached]]
        assert not any("before anyone attached" in line for line in lines)
        with open(link.log_path, "a") as output:
            output.write("printed after the viewer came\n")
        while not any("after the viewer came" in line for line in _texts(log)):
            await pilot.pause(0.05)
        await pilot.press("q")


def _texts(log) -> list[str]:
    """The event log's lines without their step column and mark ("   120 · connected to…")."""
    return [line[9:] for line in log.lines_written]
