"""Fixtures shared by the test modules, and where their data lives.

The captures and command outputs the tests read are copied into `tests/data/` (from `../shared`), so a fresh
clone without `../shared` passes `make test`. The openb traces are whole published files and stay outside:
tests that read them carry `needs_openb` (`needs_data`): without the traces they skip and say where to get
them, under `CI=true` they fail.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fake_apiserver import Extender

DATA = Path(__file__).resolve().parent / "data"
SHARED = Path(os.environ.get("GPUPACK_SHARED") or Path(__file__).resolve().parents[2] / "shared")
OPENB = Path(os.environ.get("GPUPACK_OPENB_TRACES") or SHARED / "traces" / "openb")
GET_OPENB = (
    "the openb traces (cluster-trace-gpu-v2023/csv from github.com/alibaba/clusterdata) go in "
    "../shared/traces/openb beside the repository, or set $GPUPACK_OPENB_TRACES (or $GPUPACK_SHARED)"
)


def needs_data(path: Path, how_to_get_it: str) -> pytest.MarkDecorator:
    """Mark for a test (or a module's `pytestmark`) that reads `path`, data the repository does not hold.

    Without it the test skips with `how_to_get_it`; under `CI=true` it fails instead, so that CI cannot
    pass with those tests silently skipped (`pytest_runtest_setup` below).
    """
    return pytest.mark.needs_data(path=path, get=how_to_get_it)


needs_openb = needs_data(OPENB, GET_OPENB)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip, or fail under CI=true, a test marked `needs_data` whose data is missing (before its fixtures)."""
    for mark in item.iter_markers("needs_data"):
        path = mark.kwargs["path"]
        if not path.exists():
            message = f"{path} not found: {mark.kwargs['get']}"
            if os.environ.get("CI") == "true":
                pytest.fail(f"CI=true, and {message}", pytrace=False)
            pytest.skip(message)


@pytest.fixture
def extenders() -> Iterator[list[Extender]]:
    """Extenders a test starts (append them); each is stopped when the test ends."""
    started: list[Extender] = []
    yield started
    for extender in started:
        extender.stop()
