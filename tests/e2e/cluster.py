"""One test's view of the shared control plane: its namespace, its nodes, waits and read-backs.

Everything is read back from the API server as the JSON it serves (no client models), so the checks
in `checks.py` see exactly what a user's `kubectl get -o json` would.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpupack.harness.controlplane import ControlPlane, ControlPlaneError, wait_until
from tests.e2e.checks import assignment_problems

SETTLE_TIMEOUT = 240.0  # seconds for a burst to be decided on a loaded 2-core machine
QUIET = 4.0  # seconds without a new binding before a burst counts as settled


@dataclass
class Settled:
    """Where a burst ended: bound pods by name -> node, and the FailedScheduling messages of the rest."""

    bound: dict[str, str]
    pending: dict[str, list[str]]
    seconds: float


@dataclass
class E2ECluster:
    """A namespace and a set of nodes on the shared control plane, removed again by `cleanup`."""

    plane: ControlPlane
    namespace: str
    prefix: str
    node_names: list[str] = field(default_factory=list)

    # ------------------------------------------------ nodes
    def add_nodes(self, bodies: Iterable[Mapping[str, Any]]) -> None:
        """Create nodes and wait until gpupack holds every node of the cluster, none unusable."""
        bodies = list(bodies)
        self.plane.create_nodes(bodies)
        self.node_names += [body["metadata"]["name"] for body in bodies]
        self.wait_gpupack_nodes()

    def delete_node(self, name: str) -> None:
        """Delete one of this test's nodes and wait until gpupack has dropped it."""
        self.plane.delete_node(name)
        self.node_names.remove(name)
        self.wait_gpupack_nodes()

    def wait_gpupack_nodes(self, timeout: float = 60) -> None:
        """Wait until gpupack's inventory holds exactly the API server's nodes; fail on an unusable one."""

        def in_step() -> bool:
            unusable = self.plane.gpupack_metric("gpupack_nodes_unusable")
            if unusable:
                reasons = [line for line in self.plane.gpupack_log().splitlines() if "not usable by gpupack" in line]
                raise ControlPlaneError(f"gpupack cannot use {unusable:.0f} node(s): {reasons[-3:]}")
            return self.plane.gpupack_metric("gpupack_nodes") == len(self.api_nodes())

        wait_until("gpupack to see the nodes", in_step, timeout)

    def api_nodes(self) -> list[dict[str, Any]]:
        """Every Node the API server holds."""
        return self._json(self.plane.core().list_node(_preload_content=False))["items"]

    # ------------------------------------------------ pods
    def create_pods(self, bodies: Iterable[Mapping[str, Any]]) -> list[str]:
        """Create pods in this test's namespace; returns their names."""
        bodies = list(bodies)
        self.plane.create_pods(self.namespace, bodies)
        return [body["metadata"]["name"] for body in bodies]

    def pods(self) -> list[dict[str, Any]]:
        """This test's pods as the API server holds them."""
        return self._json(self.plane.core().list_namespaced_pod(self.namespace, _preload_content=False))["items"]

    def bound(self) -> dict[str, str]:
        """Pod name -> spec.nodeName of this test's bound pods."""
        return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in self.pods() if p["spec"].get("nodeName")}

    def failed_scheduling(self) -> dict[str, list[str]]:
        """Pod name -> the messages of its FailedScheduling events, oldest first."""
        response = self.plane.core().list_namespaced_event(
            self.namespace, field_selector="reason=FailedScheduling", _preload_content=False
        )
        events = sorted(self._json(response)["items"], key=lambda e: e["metadata"]["creationTimestamp"])
        messages: dict[str, list[str]] = {}
        for event in events:
            messages.setdefault(event["involvedObject"]["name"], []).append(event.get("message") or "")
        return messages

    def wait_settled(self, names: Iterable[str], timeout: float = SETTLE_TIMEOUT) -> Settled:
        """Wait until every pod in `names` is bound or has a FailedScheduling event, and no bind came for QUIET s."""
        wanted, started = set(names), time.monotonic()
        last_bound: dict[str, str] = {}
        last_change = started
        while True:
            bound = {name: node for name, node in self.bound().items() if name in wanted}
            failed = {name: msgs for name, msgs in self.failed_scheduling().items() if name in wanted}
            now = time.monotonic()
            if bound != last_bound:
                last_bound, last_change = bound, now
            undecided = wanted - bound.keys() - failed.keys()
            if not undecided and now - last_change >= QUIET:
                pending = {name: msgs for name, msgs in failed.items() if name not in bound}
                return Settled(bound, pending, now - started)
            if now - started > timeout:
                waiting = sorted(undecided)[:10]
                raise ControlPlaneError(f"after {timeout:.0f} s {len(bound)}/{len(wanted)} bound; undecided: {waiting}")
            time.sleep(1.0)

    def wait_all_bound(self, names: Iterable[str], timeout: float = SETTLE_TIMEOUT) -> dict[str, str]:
        """Wait until every pod in `names` is bound; returns name -> node."""
        wanted = set(names)
        wait_until(f"{len(wanted)} pods to be bound", lambda: wanted <= self.bound().keys(), timeout, interval=1.0)
        return {name: node for name, node in self.bound().items() if name in wanted}

    # ------------------------------------------------ checks and cleanup
    def assignment_problems(self) -> list[str]:
        """`checks.assignment_problems` over every node and every pod of the cluster."""
        response = self.plane.core().list_pod_for_all_namespaces(_preload_content=False)
        return assignment_problems(self.api_nodes(), self._json(response)["items"])

    def cleanup(self) -> None:
        """Delete this test's pods and nodes, and wait until gpupack has let go of them."""
        self.plane.delete_pods(self.namespace)
        for name in self.node_names:
            self.plane.delete_node(name)
        self.node_names.clear()
        wait_until("the test's pods to go", lambda: not self.pods(), 60)
        self.wait_gpupack_nodes()

    @staticmethod
    def _json(response: Any) -> dict[str, Any]:
        return json.loads(response.data)


def wait_gpupack_holds_the_bound_pods(cluster: E2ECluster) -> None:
    """Wait until gpupack accounts for every bound pod of the cluster, each at its assignment."""
    core = cluster.plane.core()

    def accounted() -> bool:
        pods = json.loads(core.list_pod_for_all_namespaces(_preload_content=False).data)["items"]
        bound = sum(1 for p in pods if p["spec"].get("nodeName"))
        plane = cluster.plane
        return (
            plane.gpupack_metric("gpupack_pods_bound") == bound and plane.gpupack_metric("gpupack_pods_unplaced") == 0
        )

    wait_until("gpupack to account for the bound pods", accounted, 60, interval=0.5)
