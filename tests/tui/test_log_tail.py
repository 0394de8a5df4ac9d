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


def test_lines_written_before_the_link_started_are_not_news(tmp_path: Path) -> None:
    path = tmp_path / "trainer.log"
    path.write_text("".join(f"line {i}\n" for i in range(10_000)))
    tail = LogTail(path, start=path.stat().st_size)
    assert tail.read_lines() == []
    with path.open("a") as handle:
        handle.write("new\n")
    assert tail.read_lines() == ["new"]


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


def test_torch_native_log_lines_are_told_from_the_trainers_own_output() -> None:
    from torchlab.tui.log_tail import is_native_torch_log

    native = [
        # As torch 2.13 printed them into trainer.log during a profile snapshot.
        "[W1123 21:00:42.901699812 CPUAllocator.cpp:245] Memory block of unknown size was allocated before the profiling "
        "started, profiler results will not include the deallocation event",
        "USDT:2026-11-23 21:00:42 30607:30607 SyncActivityProfilerHandler.cpp:52] profiler_start",
        "STAGE:2024-01-05 10:00:00 1234:1234 ActivityProfilerController.cpp:312] Completed Stage: Warm Up",
        "[W socket.cpp:663] [c10d] The client socket has failed to connect to [localhost]:29500",
        "[E105 07:45:12.345678901 ProcessGroupGloo.cpp:143] Gloo connectFullMesh failed",
    ]
    own = [
        "UserWarning: something",
        "/work/model.py:12: UserWarning: [W] looks like a native line but is Python's",
        "Traceback (most recent call last):",
        "[rank0]: RuntimeError: boom",
        "epoch 3: loss 0.5 [see model.cpp:3]",
    ]
    assert all(is_native_torch_log(line) for line in native)
    assert not any(is_native_torch_log(line) for line in own)
