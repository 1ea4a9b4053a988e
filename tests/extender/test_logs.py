"""The service's log handler writes to the stderr of the moment, as JSON lines."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator

import pytest

from gpupack.extender import logs


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield root
    root.handlers[:] = handlers
    root.setLevel(level)


def test_records_go_to_the_current_stderr_after_the_old_one_is_closed(
    root_logger: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    logs.configure()
    first.close()  # what a test runner does to the stream a test captured
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)

    logging.getLogger("gpupack.test").warning("node %s", "n1", extra={"fields": {"node": "n1"}})

    (line,) = second.getvalue().splitlines()
    record = json.loads(line)
    assert (record["level"], record["logger"], record["msg"], record["node"]) == (
        "WARNING",
        "gpupack.test",
        "node n1",
        "n1",
    )
