"""A full-screen command whose output is a file, typed at a terminal: ``torchlab-tui compare A B > out.txt`` drew its
screen into the file and waited for keys for ever. Each one (the app, ``compare``; ``attach``'s is
tests/process/test_viewers.py) now refuses in one paragraph, exit 2, the file left empty, even with a terminal for
its keys. The other tests of the refusal redirect both streams (pytest's); this is the case the issue met."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from metrics_rows import metrics_row
from torchlab.core.errors import EXIT_USAGE
from torchlab.core.records.config import build_config
from torchlab.core.wire import strict_json

CLI = Path(sys.executable).with_name("torchlab-tui")


def _finished_run(root: Path, name: str) -> Path:
    run = root / name
    run.mkdir(parents=True)
    (run / "config.toml").write_text(build_config({"workload": "mlp", "steps": 2}).to_toml())
    rows = [strict_json.dumps(metrics_row(step, loss=3.0 - step).json_object()) for step in (1, 2)]
    (run / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    return run


@pytest.mark.parametrize("command", [
    pytest.param(lambda tmp: ["mlp", "--runs-root", str(tmp / "runs")], id="app"),
    pytest.param(lambda tmp: ["compare", str(_finished_run(tmp, "a")), str(_finished_run(tmp, "b"))], id="compare"),
])
def test_a_full_screen_command_into_a_file_is_refused_even_from_a_terminal(command, tmp_path):
    keys, terminal = os.openpty()  # its input a terminal, as at a shell prompt
    out = tmp_path / "out.txt"
    try:
        with out.open("w") as into_a_file:
            done = subprocess.run([str(CLI), *command(tmp_path)], stdin=terminal, stdout=into_a_file, stderr=subprocess.PIPE,
                                  text=True, timeout=120)
    finally:
        os.close(keys)
        os.close(terminal)
    assert done.returncode == EXIT_USAGE and out.read_text() == ""
    assert "draws full screen, and its output is not a terminal" in done.stderr and done.stderr.count("\n") == 1
    assert not (tmp_path / "runs").exists()  # the app made no run directory
