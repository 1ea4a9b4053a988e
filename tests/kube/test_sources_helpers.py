"""Shared helpers of the source tests: API-shaped objects and a consumer that mirrors the events."""

from __future__ import annotations

from typing import Any

from gpupack.kube import objects
from gpupack.kube.pods import pod_is_terminal, pod_key
from gpupack.kube.sources import (
    Event,
    JsonObject,
    NodeDeleted,
    NodeUpserted,
    PodDeleted,
    PodUpserted,
    Synced,
)


def make_node(name: str, rv: str = "1", uid: str | None = None, gpus: int = 8) -> JsonObject:
    """`objects.make_node` with a resourceVersion, as the API server sends it."""
    return objects.make_node(
        name, gpus=gpus, cpu="96", memory="1024Gi", uid=uid or f"uid-node-{name}", resource_version=rv
    )


def make_pod(
    name: str,
    rv: str = "1",
    *,
    namespace: str = "default",
    uid: str | None = None,
    phase: str = "Running",
    node: str | None = "gpu-1",
    gpus: int = 1,
    annotations: dict[str, str] | None = None,
) -> JsonObject:
    """`objects.make_pod` with a resourceVersion, as the API server sends it (bound to gpu-1 unless told)."""
    return objects.make_pod(
        name,
        namespace=namespace,
        uid=uid or f"uid-pod-{namespace}-{name}",
        requests={"nvidia.com/gpu": gpus, "cpu": "4", "memory": "16Gi"},
        node=node,
        phase=phase,
        annotations=annotations,
        image="trainer:1",
        resource_version=rv,
    )


class Mirror:
    """A consumer applying source events to dicts, as the real cluster state would.

    It never raises (the source would log and resync); inconsistencies are collected in ``errors``.
    """

    def __init__(self) -> None:
        self.nodes: dict[str, JsonObject] = {}
        self.pods: dict[str, JsonObject] = {}
        self.events: list[Event] = []
        self.errors: list[str] = []

    def __call__(self, event: Event) -> None:
        self.events.append(event)
        match event:
            case NodeUpserted(node=node):
                self._check_same_uid("node", self.nodes.get(event.name), node)
                self.nodes[event.name] = node
            case NodeDeleted(name=name):
                if self.nodes.pop(name, None) is None:
                    self.errors.append(f"NodeDeleted for unknown node {name}")
            case PodUpserted(pod=pod):
                if pod_is_terminal(pod):
                    self.errors.append(f"PodUpserted for terminal pod {event.key}")
                self._check_same_uid("pod", self.pods.get(event.key), pod)
                self.pods[event.key] = pod
            case PodDeleted(key=key, uid=uid):
                held = self.pods.pop(key, None)
                if held is None or held["metadata"]["uid"] != uid:
                    self.errors.append(f"PodDeleted for unknown pod {key} uid {uid}")
            case Synced():
                pass

    def _check_same_uid(self, what: str, held: JsonObject | None, new: JsonObject) -> None:
        """A new object under a held name must come after a Deleted of the old one (uid-keyed consumers)."""
        if held is not None and held["metadata"]["uid"] != new["metadata"]["uid"]:
            self.errors.append(f"{what} {new['metadata']['name']} replaced without a Deleted")

    @property
    def synced_count(self) -> int:
        return sum(isinstance(event, Synced) for event in self.events)

    def of_type(self, kind: type) -> list[Any]:
        return [event for event in self.events if isinstance(event, kind)]

    def assert_equals_fresh_list(self, nodes: list[JsonObject], pods: list[JsonObject]) -> None:
        """The mirror holds exactly what a fresh list of ``nodes`` and ``pods`` would give."""
        assert self.errors == []
        assert self.nodes == {node["metadata"]["name"]: node for node in nodes}
        assert self.pods == {pod_key(pod): pod for pod in pods if not pod_is_terminal(pod)}
