"""Fixtures shared by the test modules, and where their data lives.

The captures and command outputs the tests read are copied into `tests/data/` (from `../shared`), so a fresh
clone without `../shared` passes `make test`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fake_apiserver import Extender

DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture
def extenders() -> Iterator[list[Extender]]:
    """Extenders a test starts (append them); each is stopped when the test ends."""
    started: list[Extender] = []
    yield started
    for extender in started:
        extender.stop()
