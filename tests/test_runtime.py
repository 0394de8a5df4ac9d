"""The runtime directory: what killed trainers leave there is swept when runs are listed, and only that."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from torchlab.core.runtime import ORPHAN_TOKEN_AGE_S, Endpoint, list_runs, runtime_dir


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
