"""A run's journals are read as the protocol reads a socket: bounded. A line nested 5,000 deep, or holding a
400-digit number, 1e400 or NaN (none of which torchlab writes), is left out as a torn line is, and counted;
``compare``, ``export`` and ``--resume`` read such a journal without a traceback (issue 26, case 9)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainers import TINY
from torchlab.core.errors import EXIT_OK
from torchlab.core.launch.cli import main
from torchlab.core.records.rundir import SkippedLine, rows_of
from torchlab.core.records.storage import parse_line
from torchlab.core.wire import strict_json
from torchlab.tui.run_history import RunHistory

HOSTILE = {
    "nested 5000 deep": '{"step": 2, "loss": ' + "[" * 5000 + "]" * 5000 + "}",
    "nested 900 deep": '{"step": 2, "loss": ' + "[" * 900 + "]" * 900 + "}",  # within json's own limit
    "a 400-digit loss": '{"step": 3, "loss": ' + "9" * 400 + "}",
    "a 5000-digit loss": '{"step": 4, "loss": ' + "9" * 5000 + "}",  # over Python's int() limit
    "a 400-digit step": '{"step": ' + "9" * 400 + ', "loss": 1.0}',
    "1e400": '{"step": 5, "loss": 1e400}',
    "NaN": '{"step": 6, "loss": NaN}',
    "-Infinity": '{"step": 6, "loss": -Infinity}',
}
GOOD = ['{"step": 1, "loss": 0.5, "grad_norms": {"head": 0.1}}', '{"step": 7, "loss": 0.25, "elapsed_s": 1.5}']


def journal_with_hostile_lines(path: Path) -> None:
    path.write_text("\n".join([GOOD[0], *HOSTILE.values(), GOOD[1]]) + "\n")


@pytest.mark.parametrize("line", list(HOSTILE.values()), ids=list(HOSTILE))
def test_a_value_torchlab_never_writes_is_unreadable_json(line):
    with pytest.raises(strict_json.UnreadableJson):
        strict_json.loads(line)
    assert parse_line(line.encode() + b"\n") is None


def test_what_torchlab_writes_reads_back_as_it_was():
    record = {"step": 2**63 - 1, "loss": -1.5e300, "nan": float("nan"), "deep": [[[[{"x": [1, 2]}]]]], "text": "[{"}
    assert strict_json.loads(strict_json.dumps(record)) == {**record, "nan": None}
    assert strict_json.loads(strict_json.dumps(record).encode()) == {**record, "nan": None}


def test_rows_of_leaves_hostile_lines_out_and_counts_them(tmp_path):
    journal_with_hostile_lines(tmp_path / "metrics.jsonl")
    skipped: list[SkippedLine] = []
    assert [row["step"] for row in rows_of(tmp_path / "metrics.jsonl", skipped)] == [1, 7]
    assert [line.number for line in skipped] == list(range(2, 2 + len(HOSTILE)))
    assert skipped[0].reason == "nested more than 32 levels deep"


def _run_with_hostile_lines(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    assert main([TINY, "--headless", "--steps", "3", "--telemetry-interval", "0", "--eval-every", "0",
                 "--run-dir", str(run)]) == EXIT_OK
    for name in ("metrics.jsonl", "events.jsonl"):
        with open(run / name, "a") as journal:
            journal.write("\n".join(HOSTILE.values()) + "\n")
    return run


def test_compare_export_and_resume_read_a_journal_with_hostile_lines(tmp_path, capsys):
    run = _run_with_hostile_lines(tmp_path)
    history = RunHistory.load(run)
    assert list(history.by_step["loss"].xs) == [1, 2, 3]

    capsys.readouterr()
    assert main(["export", str(run), "--csv", str(tmp_path / "metrics.csv"), "--tensorboard", str(tmp_path / "board")]) == EXIT_OK
    err = capsys.readouterr().err
    assert "Traceback" not in err
    said = f"3 rows ({len(HOSTILE)} unreadable lines of metrics.jsonl skipped; line 4: nested more than 32 levels deep)"
    assert f"{tmp_path / 'metrics.csv'}: {said}" in err
    assert f"{tmp_path / 'board'}: {said}," in err
    assert len((tmp_path / "metrics.csv").read_text().splitlines()) == 1 + 3

    assert main(["--resume", str(run), "--headless", "--steps", "5", "--telemetry-interval", "0"]) == EXIT_OK
    assert "Traceback" not in capsys.readouterr().err
    assert [row["step"] for row in rows_of(run / "metrics.jsonl")] == [1, 2, 3, 4, 5]
