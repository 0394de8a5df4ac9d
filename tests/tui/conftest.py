"""Fixtures for the app's tests: a FakeLink with deterministic training data, and the app built on it."""

from __future__ import annotations

import pytest
from fake_link import FakeLink, quiet_app

from torchlab.tui.app import TorchlabApp


@pytest.fixture
def link() -> FakeLink:
    return FakeLink()


@pytest.fixture
def app(link: FakeLink) -> TorchlabApp:
    return quiet_app(link)
