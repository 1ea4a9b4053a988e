"""A cluster file without nodes is said so in the log, not served in silence (#18 item 4)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gpupack.kube.sources import ClusterFileSource
from tests.extender_helpers import EXAMPLE_CLUSTER

EXAMPLE_PODS = EXAMPLE_CLUSTER.parent / "pods.yaml"


def warnings_of(path: Path, caplog: pytest.LogCaptureFixture) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gpupack.kube.sources.file_source"):
        ClusterFileSource(path, lambda event: None).start()
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_the_pods_file_given_as_the_cluster_is_named(caplog: pytest.LogCaptureFixture) -> None:
    (message,) = warnings_of(EXAMPLE_PODS, caplog)
    assert "no Node objects, only 5 Pod(s): a pods file given as the cluster?" in message
    assert str(EXAMPLE_PODS) in message


def test_an_empty_cluster_file_is_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("apiVersion: v1\nkind: List\nitems: []\n")
    (message,) = warnings_of(empty, caplog)
    assert "no Node or Pod objects: the cluster is empty" in message


def test_a_cluster_with_nodes_gets_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    assert warnings_of(EXAMPLE_CLUSTER, caplog) == []
