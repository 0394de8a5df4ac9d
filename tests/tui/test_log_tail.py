"""Following trainer.log: complete lines only, from where the last read stopped."""

from __future__ import annotations

from pathlib import Path

from torchlab.tui.log_tail import LogTail


def test_lines_arrive_once_and_only_when_complete(tmp_path: Path) -> None:
    path = tmp_path / "trainer.log"
    tail = LogTail(path)
    assert tail.read_lines() == []  # not there yet
    path.write_text("one\ntw")
    assert tail.read_lines() == ["one"]
    with path.open("a") as handle:
        handle.write("o\nthree\n")
    assert tail.read_lines() == ["two", "three"]
    assert tail.read_lines() == []


def test_a_long_log_is_followed_from_near_its_end(tmp_path: Path) -> None:
    path = tmp_path / "trainer.log"
    path.write_text("".join(f"line {i}\n" for i in range(10_000)))
    lines = LogTail(path, initial_bytes=100).read_lines()
    assert lines[-1] == "line 9999"
    assert len(lines) < 20 and all(line.startswith("line ") for line in lines)


def test_a_rewritten_log_is_read_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "trainer.log"
    path.write_text("a long first line\n")
    tail = LogTail(path)
    tail.read_lines()
    path.write_text("new\n")
    assert tail.read_lines() == ["new"]


def test_undecodable_bytes_do_not_raise(tmp_path: Path) -> None:
    path = tmp_path / "trainer.log"
    path.write_bytes(b"\xff\xfe bad\n")
    assert LogTail(path).read_lines() == ["\ufffd\ufffd bad"]
