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


@pytest.fixture
def dynamo_only(monkeypatch):
    """torch.compile without inductor (its ``aot_eager`` backend): Dynamo traces, breaks graphs, guards and recompiles as
    in a real compile, and AOTAutograd makes the forward and backward graphs, but no kernel is generated. For the
    tests of what Dynamo and the engine do with a compile (boundaries, recompiles, the watch, resumes and trials of a
    compiled run), not of the code inductor makes: inductor's C++ build of each graph was most of their time, cold
    (two of the watch's tests: 34 s, 6 s this way). The tests of inductor itself (a real compile's speed, a missing
    C++ compiler, the first compile end to end) compile for real."""
    from torchlab.core.engine.compiling import DYNAMIC_ARGUMENT

    def compile_model(module: torch.nn.Module, dynamic: str) -> torch.nn.Module:
        return torch.compile(module, dynamic=DYNAMIC_ARGUMENT[dynamic], backend="aot_eager")

    monkeypatch.setattr("torchlab.core.engine.option_hooks.compile_model", compile_model)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
