"""Hooks and session fixtures for every test (helpers to import live in trainers.py)."""

from __future__ import annotations

import os

import pytest
import torch

from torchlab.core.records import storage


@pytest.fixture(autouse=True, scope="session")
def tests_runtime_dir(tmp_path_factory):
    """Runs, sockets and tokens of the tests in a runtime directory of their own (children inherit it).

    In the user's one, a run of the user's (or of a benchmark) showed up in the tests' ``list_runs()``
    and failed them, and runs the tests left behind showed up in the user's ``torchlab-tui attach``.
    """
    base = tmp_path_factory.mktemp("xdg-runtime")
    base.chmod(0o700)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_RUNTIME_DIR", str(base))
        yield base / "torchlab"


@pytest.fixture
def links_followed(monkeypatch):
    """A link to /dev/full stands for a full disk: the run's files are opened through links for this test
    (torchlab follows none, core/safe_open.py)."""
    monkeypatch.setattr(storage, "open_regular", lambda path, flags, mode: os.open(path, flags, mode))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
