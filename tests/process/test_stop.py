"""``torchlab-tui stop``: a detached run stops through its socket, with a final checkpoint, and says where."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from test_detach import _detach, _started
from test_worker import TINY, Collected
from torchlab.core.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from torchlab.core.launch.cli import main
from torchlab.core.wire import protocol as p
from torchlab.core.wire.events import StopRequested, describe
from torchlab.core.wire.runtime import list_runs
from torchlab.tui.link import ProcessLink


@pytest.fixture(autouse=True)
def private_runtime_dir(tmp_path, monkeypatch):
    """Each test stops only its own runs (the runtime directory is per user, shared by every run)."""
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))


def stops_journalled(run_dir) -> list[str]:
    """The reason of each stop the run's journal records as asked."""
    records = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return [record["reason"] for record in records if record["event"] == "stop_requested"]


def test_stop_ends_a_detached_run_with_a_final_checkpoint_says_where_and_the_journal_and_a_viewer_say_who(tmp_path, capsys):
    """The real command, in a process of its own: one that imported the protocol alone decoded the run's
    ``stop_requested`` with a registry lacking the trainer's events, and ended in a traceback, exit 1.

    The worker worded every stop from the socket "stopped from the app", and journalled no reason at all: the
    run's events.jsonl and a viewer's event log did not say who stopped it (one run shows both: a trainer each
    was a torch import each)."""
    run_dir = tmp_path / "run"
    link, seen = _started(run_dir, "--steps", "1000000")
    seen.until(lambda m: isinstance(m, p.Metrics))
    _detach(link, seen)
    name = link.endpoint_name
    [entry] = list_runs()
    viewer = ProcessLink.attach(entry, view=True)
    viewer.start()
    watched = Collected(viewer)
    try:
        watched.until(lambda m: isinstance(m, p.Metrics))
        said = subprocess.run([sys.executable, "-m", "torchlab.core.launch.cli", "stop", name[:10]],
                              capture_output=True, text=True, timeout=120)
        stop_seen = watched.until(lambda m: isinstance(m, StopRequested))
    finally:
        viewer.close()
    assert (said.returncode, "Traceback" in said.stderr) == (EXIT_OK, False), said.stderr
    assert link.process.wait(timeout=30) == 0
    stopped_at = int(re.search(rf"^{name} stopped at step (\d+)\.$", said.stdout, re.MULTILINE).group(1))
    final = run_dir.resolve() / "checkpoints" / f"step-{stopped_at:07d}.pt"
    assert f"\nFinal checkpoint: {final}\n" in said.stdout and final.exists()
    assert f"Run directory: {run_dir.resolve()}" in said.stdout
    assert f"Stopping {name}" in said.stderr
    assert list_runs() == [], "a stopped run's entry is gone, as after q in its app"
    assert describe(stop_seen).text == "stopped by `torchlab-tui stop` (at the end of this step, with a final checkpoint)"
    assert stops_journalled(run_dir) == ["stopped by `torchlab-tui stop`"]

    assert main(["stop", str(run_dir)]) == EXIT_FAILED  # by its run directory: not running any more
    assert capsys.readouterr().err == (
        f"torchlab-tui stop: {run_dir} is not running in an app (no app's or detached run has that run directory); a "
        "--headless run stops at its next step with a checkpoint on Ctrl-C in its terminal or `kill -TERM` of its "
        "process.\n")


def test_stop_leaves_a_run_that_an_app_controls_to_that_app_and_a_stop_from_the_app_is_journalled_as_such(
        tmp_path, capsys):
    """One run for both (a trainer each was a torch import each): while an app controls it, ``torchlab-tui stop``
    refuses; the app's own stop is then told and journalled as from the app, whatever reason a client claims."""
    run_dir = tmp_path / "run"
    link, seen = _started(run_dir, "--steps", "1000000")
    try:
        seen.until(lambda m: isinstance(m, p.Metrics))
        assert main(["stop"]) == EXIT_USAGE
        assert "an app controls" in capsys.readouterr().err and link.process.poll() is None
        link.send(p.StopCommand(reason="anything a client claims"))
        said = seen.until(lambda m: isinstance(m, StopRequested))
        assert link.process.wait(timeout=30) == 0
    finally:
        link.close()
    assert describe(said).text == "stopped from the app (at the end of this step, with a final checkpoint)"
    assert stops_journalled(run_dir) == ["stopped from the app"]


def test_stop_with_no_run_running_says_so_in_one_line(capsys):
    assert main(["stop"]) == EXIT_FAILED
    assert capsys.readouterr().err == "torchlab-tui stop: no run is running; `torchlab-tui attach` lists your runs.\n"
    assert main(["stop", "nothing-like-it"]) == EXIT_USAGE
    assert "no run named 'nothing-like-it'" in capsys.readouterr().err


def test_stop_on_another_users_private_run_directory_is_one_paragraph_with_two_real_users(tmp_path):
    """Issue 46 item 6: a second user's ``stop RUN_DIR`` on a run directory in the owner's private folder ended in a
    PermissionError traceback (``attach`` and ``serve`` say a paragraph for the same input)."""
    import shutil
    import uuid

    import torchlab.core.launch.stop  # noqa: F401  (the other user cannot read the virtual environment to import it)
    from second_user import run_as, throwaway_user

    private = Path(f"/tmp/tlab-{uuid.uuid4().hex[:8]}-home")  # /tmp: the other user reaches it; tmp_path is root's
    run_dir = private / "runs" / "20261129-054537-mlp"
    run_dir.mkdir(parents=True)
    private.chmod(0o700)
    try:
        with throwaway_user() as other:
            ran = run_as(other, main, ["stop", str(run_dir)])
    finally:
        shutil.rmtree(private)
    assert (ran.code, ran.stdout) == (EXIT_USAGE, ""), ran.stderr
    assert ran.stderr == (f"torchlab-tui stop: no run of yours has the run directory {run_dir}, which cannot be looked "
                          "into (Permission denied): a run directory is private to the user who started it, and only "
                          "they (or root) can stop its run. `torchlab-tui attach` lists your runs.\n")
