"""The pods bound to this node: a small interface, an in-memory one for tests, the real one.

The real lister asks the API server on every call (field selector `spec.nodeName=<node>`): Allocate
runs moments after the pod was bound, and a cache could still miss it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from gpupack.kube.pod_request import AssignmentError, assignment_from_pod
from gpupack.kube.pods import pod_is_terminal
from gpupack.scoring.facts import GpuSlot
from gpupack.scoring.request import RequestError

Pod = Mapping[str, Any]


class PodLister(Protocol):
    """Lists this node's pods as raw JSON dicts."""

    def pods_on_node(self) -> list[Pod]:
        """Every pod whose spec.nodeName is this node."""
        ...


@dataclass
class MemoryPods:
    """A PodLister over a list the caller edits (tests)."""

    pods: list[Pod] = field(default_factory=list)

    def pods_on_node(self) -> list[Pod]:
        """A copy of the list."""
        return list(self.pods)


class KubePods:
    """PodLister over the official client: `list_pod_for_all_namespaces(field_selector=spec.nodeName=...)`."""

    def __init__(self, core_api: Any, node: str, timeout: float = 10.0) -> None:
        self._core = core_api
        self._node = node
        self._timeout = timeout

    def pods_on_node(self) -> list[Pod]:
        """The node's pods, raw (no client models: see kube/sources/kube_api.py for why)."""
        response = self._core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self._node}", _preload_content=False, _request_timeout=self._timeout
        )
        return list(orjson.loads(response.data).get("items") or [])


def live_assigned(pods: Iterable[Mapping[str, Any]], node: str) -> set[GpuSlot]:
    """Slots named by the assignments of the pods on `node` that have not finished."""
    return {
        slot
        for pod in pods
        if (pod.get("spec") or {}).get("nodeName") == node and not pod_is_terminal(pod)
        for slot in assigned_slots(pod)
    }


def assigned_slots(pod: Mapping[str, Any]) -> tuple[GpuSlot, ...]:
    """The slots the pod's assignment names; none when it has none or it cannot be read (Allocate refuses such
    a pod, so it holds nothing the agent could know of)."""
    try:
        placement = assignment_from_pod(pod)
    except (AssignmentError, RequestError):
        return ()
    return placement.slots if placement else ()
