"""A run's files are opened without following links and only when they are regular files."""

from __future__ import annotations

import os

import pytest

from torchlab.core.records.storage import JsonLines, create_file, make_folder
from torchlab.core.safe_open import UnsafeFileError, open_regular, read_regular_bytes, require_real_folder


def test_a_link_is_refused_and_its_target_untouched(tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("first\nlast line without newline")
    (tmp_path / "trials.jsonl").symlink_to(target)
    with pytest.raises(UnsafeFileError, match="trials.jsonl is a symbolic link"):
        JsonLines(tmp_path / "trials.jsonl")
    assert target.read_text() == "first\nlast line without newline"


def test_a_fifo_is_refused_at_once_for_reading_and_writing(tmp_path):
    fifo = tmp_path / "metrics.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(UnsafeFileError, match="FIFO"):
        read_regular_bytes(fifo)
    with pytest.raises(UnsafeFileError, match="FIFO"):
        create_file(fifo)


def test_a_device_and_a_folder_are_refused(tmp_path):
    with pytest.raises(UnsafeFileError, match="character device"):
        open_regular("/dev/null")
    with pytest.raises(UnsafeFileError, match="a folder"):
        read_regular_bytes(tmp_path)


def test_a_linked_folder_is_refused_where_one_would_be_made(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "checkpoints").symlink_to(elsewhere)
    with pytest.raises(UnsafeFileError, match="checkpoints is a symbolic link, not a folder"):
        make_folder(tmp_path / "checkpoints")
    assert require_real_folder(elsewhere) and not require_real_folder(tmp_path / "missing")


def test_a_regular_file_opens_blocking(tmp_path):
    path = tmp_path / "ok.txt"
    path.write_bytes(b"abc")
    descriptor = open_regular(path)
    try:
        assert os.get_blocking(descriptor) and os.read(descriptor, 10) == b"abc"
    finally:
        os.close(descriptor)
