"""Fixtures of the end-to-end suite: one real control plane per session, a namespace and nodes per test.

`make e2e` runs this folder; `make test` does not (pyproject's `norecursedirs`). Without the
binaries the suite skips with a message saying how to get them, except in CI (`CI=true`), where it
fails: there it must run.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Generator, Iterator

import pytest

from gpupack.bench.controlplane import ControlPlane, MissingBinary
from tests.e2e.cluster import E2ECluster

LOG_TAIL = 40  # lines of each log printed when a test fails


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """etcd, kube-apiserver, kube-scheduler (the shipped config) and `gpupack serve`, for the session."""
    try:
        plane = ControlPlane().start()
    except MissingBinary as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the e2e suite must run in CI, but: {exc}", pytrace=False)
        pytest.skip(f"no control plane for the e2e suite: {exc}")
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture
def cluster(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[E2ECluster]:
    """A fresh namespace and node-name prefix for one test; its pods and nodes are deleted afterwards."""
    short = uuid.uuid4().hex[:5]
    namespace = f"e2e-{request.node.name[5:30].replace('_', '-').strip('-').lower()}-{short}"
    control_plane.create_namespace(namespace)
    test_cluster = E2ECluster(control_plane, namespace, prefix=f"n{short}")
    try:
        yield test_cluster
    finally:
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            print_logs(control_plane)
        test_cluster.cleanup()


def print_logs(plane: ControlPlane) -> None:
    """The tails of kube-scheduler's and gpupack's logs (shown with a failed test's output)."""
    for name, text in (("kube-scheduler", plane.scheduler_log()), ("gpupack", plane.gpupack_log())):
        print(f"----- last {LOG_TAIL} lines of {name}'s log -----")
        print("\n".join(text.splitlines()[-LOG_TAIL:]))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the item, so fixtures can tell whether the test failed."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
