"""Fixtures shared by the test modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fake_apiserver import Extender


@pytest.fixture
def extenders() -> Iterator[list[Extender]]:
    """Extenders a test starts (append them); each is stopped when the test ends."""
    started: list[Extender] = []
    yield started
    for extender in started:
        extender.stop()
