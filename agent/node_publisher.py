"""Publishes `gpupack.io/gpu-topology` and, on static-MIG nodes, `gpupack.io/mig-layout` on the agent's Node.

The agent owns exactly these two annotations and `gpupack.io/devices-in-use` (agent.devices_in_use;
docs/contracts.md#node-annotations): it merge-patches only them, only when they differ from what the
Node holds, and removes `mig-layout` (null in the patch) when the node is not static MIG. `numa` is left
out of the topology while a GPU's NUMA node is unknown: `gpupack serve` reads NUMA nodes as 0..1023, and
"absent" means "no preference" there (docs/contracts.md#gpupackiogpu-topology).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any, Protocol

from gpupack.agent.node_gpus import NodeGpus
from gpupack.agent.topology import UNKNOWN_NUMA, Topology
from gpupack.kube.keys import ANNOTATION_GPU_TOPOLOGY, ANNOTATION_MIG, ANNOTATION_MIG_LAYOUT

Annotations = dict[str, str | None]


class NodeApi(Protocol):
    """The agent's own Node: read it, merge-patch its annotations."""

    def get_node(self) -> Mapping[str, Any]:
        """The Node object (raw JSON)."""
        ...

    def patch_annotations(self, annotations: Annotations) -> None:
        """Merge-patch `metadata.annotations` with exactly these keys (None removes one)."""
        ...


def desired_annotations(topology: Topology, gpus: NodeGpus, out_of_service: Collection[int] = ()) -> Annotations:
    """The values the agent's two annotations should have now.

    `mig-layout` leaves out the GPUs `out_of_service` (agent.gpu_health): their instances are Unhealthy,
    so the kubelet leaves them out of allocatable, and the layout must hold exactly what allocatable does.
    """
    value: dict[str, object] = {"nvlink": [list(row) for row in topology.nvlink]}
    if UNKNOWN_NUMA not in topology.numa:
        value["numa"] = list(topology.numa)
    layout = None
    if not gpus.dynamic_mig and any(gpus.mig_enabled):
        layout = json.dumps(
            {str(gpu.index): [f"{i.profile}@{i.start}" for i in gpus.instances[gpu.index]] for gpu in gpus.gpus
             if gpus.mig_enabled[gpu.index] and gpus.instances[gpu.index] and gpu.index not in out_of_service},
            separators=(",", ":"),
        )
    return {ANNOTATION_GPU_TOPOLOGY: json.dumps(value, separators=(",", ":")), ANNOTATION_MIG_LAYOUT: layout}


def is_dynamic_mig(node: Mapping[str, Any]) -> bool:
    """The operator's `gpupack.io/mig: dynamic` on the Node."""
    return ((node.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_MIG) == "dynamic"


def publish(api: NodeApi, desired: Annotations) -> Annotations:
    """Patch the keys whose value differs from the Node's; returns the patch ({} when nothing changed)."""
    current = (api.get_node().get("metadata") or {}).get("annotations") or {}
    patch = {key: value for key, value in desired.items() if current.get(key) != value}
    if patch:
        api.patch_annotations(patch)
    return patch


class KubeNodeApi:
    """NodeApi over the official client (RBAC: get and patch on its own Node)."""

    def __init__(self, core_api: Any, node: str, timeout: float = 10.0) -> None:
        self._core = core_api
        self._node = node
        self._timeout = timeout

    def get_node(self) -> Mapping[str, Any]:
        """GET /api/v1/nodes/<node>, raw."""
        response = self._core.read_node(self._node, _preload_content=False, _request_timeout=self._timeout)
        return json.loads(response.data)

    def patch_annotations(self, annotations: Annotations) -> None:
        """PATCH as application/merge-patch+json: only these keys change."""
        self._core.patch_node(
            self._node,
            {"metadata": {"annotations": annotations}},
            _content_type="application/merge-patch+json",
            _request_timeout=self._timeout,
        )
