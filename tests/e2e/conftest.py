"""Fixtures of the end-to-end suite: one real control plane per session, a namespace and nodes per test.

`make e2e` runs this folder; `make test` does not (pyproject's `norecursedirs`). The control-plane
cases run once per Kubernetes release of `CONTROL_PLANE_VERSIONS`. `make e2e` builds missing programs
first; when one is still missing the cases fail naming it and the command that builds it. They skip
only when asked to (`GPUPACK_E2E_ALLOW_SKIP=1`), never under `CI=true`: a green run means they ran.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Generator, Iterator

import pytest

from gpupack.harness.controlplane import ControlPlane
from gpupack.harness.kube_programs import CONTROL_PLANE_VERSIONS, MissingBinary
from tests.e2e.cluster import E2ECluster

LOG_TAIL = 40  # lines of each log printed when a test fails


def missing_program(exc: MissingBinary) -> None:
    """Fail (or, when asked for outside CI, skip) because a program the suite needs is missing."""
    if os.environ.get("GPUPACK_E2E_ALLOW_SKIP") == "1" and os.environ.get("CI") != "true":
        pytest.skip(f"GPUPACK_E2E_ALLOW_SKIP=1 and {exc}")
    pytest.fail(f"the e2e suite cannot run: {exc}", pytrace=False)


@pytest.fixture(scope="session", params=CONTROL_PLANE_VERSIONS)
def control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """etcd, kube-apiserver, kube-scheduler (the shipped config) and `gpupack serve` of one release."""
    try:
        plane = ControlPlane(version=request.param).start()
    except MissingBinary as exc:
        missing_program(exc)
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture
def cluster(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[E2ECluster]:
    """A fresh namespace and node-name prefix for one test; its pods and nodes are deleted afterwards."""
    short = uuid.uuid4().hex[:5]
    namespace = f"e2e-{request.node.originalname[5:30].replace('_', '-').strip('-').lower()}-{short}"
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
