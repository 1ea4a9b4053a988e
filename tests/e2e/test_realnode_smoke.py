"""A real node (containerd + runc + the upstream kubelet) joins the suite's API server and runs pods (issue #24).

One control plane and one node for the module; timings of the node's start and stop are printed (`-s`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpupack.harness.controlplane import ControlPlane
from gpupack.harness.kube_programs import NEWEST, MissingBinary, kube_bin_dir
from tests.e2e import images
from tests.e2e.conftest import missing_program
from tests.e2e.realnode import (
    DEVICE_PLUGIN_DIR,
    KUBELET_ROOT,
    NODE_NAME,
    POD_RESOURCES_SOCKET,
    RealNode,
    container_log,
    host_pod_body,
    wait_pod_phase,
)

KUBELET_ROOT_EXISTED = KUBELET_ROOT.exists()


@dataclass
class Timings:
    """Seconds each step of the node's life took."""

    seconds: dict[str, float] = field(default_factory=dict)

    def report(self) -> str:
        """One line: step=seconds, ..."""
        return ", ".join(f"{step}={value:.1f}s" for step, value in self.seconds.items())


@pytest.fixture(scope="module")
def timings() -> Iterator[Timings]:
    """Timings of this module's node, printed at the end."""
    measured = Timings()
    yield measured
    print(f"\nreal node timings: {measured.report()}")


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    """The control plane of the newest release (kube-apiserver, kube-scheduler, gpupack serve)."""
    try:
        started = ControlPlane(version=NEWEST).start()
    except MissingBinary as exc:
        missing_program(exc)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def node(plane: ControlPlane, timings: Timings) -> Iterator[RealNode]:
    """A real kubelet registered as node 127.0.0.1, with the pause and busybox images imported."""
    try:
        kubelet = kube_bin_dir(NEWEST, ("kubelet",)) / "kubelet"
    except MissingBinary as exc:
        missing_program(exc)
    cache = images.cache_dir()
    archives = [images.build_pause(cache), images.build_busybox(cache)]
    begun = time.monotonic()
    real = RealNode(plane, kubelet).start(images=archives)
    timings.seconds["start"] = time.monotonic() - begun
    try:
        yield real
    finally:
        begun = time.monotonic()
        real.stop()
        timings.seconds["stop"] = time.monotonic() - begun
        real.stop()  # a second stop does nothing
        assert not Path(real.workdir).exists()
        assert not KUBELET_ROOT.exists() or KUBELET_ROOT_EXISTED


@pytest.fixture
def namespace(plane: ControlPlane, node: RealNode, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace (with its default ServiceAccount); the node's logs are printed when the test fails."""
    name = f"realnode-{uuid.uuid4().hex[:6]}"
    plane.create_namespace(name)
    yield name
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(node.log_tails(60))


def test_node_is_ready_and_untainted(node: RealNode) -> None:
    """The kubelet registered node 127.0.0.1, Ready, schedulable, with its sockets and our images."""
    registered = node.node()
    assert registered.metadata.name == NODE_NAME
    assert not [t for t in (registered.spec.taints or []) if t.key == "node.kubernetes.io/not-ready"]
    assert {"localhost/pause:3.10", "localhost/busybox:e2e"} <= set(node.images())
    assert node.pod_resources_socket == POD_RESOURCES_SOCKET and POD_RESOURCES_SOCKET.is_socket()
    assert node.device_plugin_dir == DEVICE_PLUGIN_DIR and (DEVICE_PLUGIN_DIR / "kubelet.sock").is_socket()


def test_pod_prints_env_var_and_succeeds(plane: ControlPlane, node: RealNode, namespace: str, timings: Timings) -> None:
    """A hostNetwork busybox pod prints an env var and exits; Succeeded, and its log (through the API) shows it."""
    core = plane.core()
    body = host_pod_body(
        "greeter", images.BUSYBOX_REF, ["sh", "-c", 'echo "GREETING=$GREETING"'], env={"GREETING": "hello kubelet"}
    )
    begun = time.monotonic()
    core.create_namespaced_pod(namespace, body)
    assert wait_pod_phase(core, namespace, "greeter", {"Succeeded", "Failed"}, timeout=90) == "Succeeded"
    timings.seconds["pod-to-succeeded"] = time.monotonic() - begun
    assert container_log(core, namespace, "greeter").strip() == "GREETING=hello kubelet"
