"""Compile every numba kernel before `/readyz` says ready, through the path real requests take.

Running only the scoring kernels left the name-lookup kernels (`scoring.names`) to the first real
`/filter`, which then took 3–7 s with an empty numba cache (#13). So the warm-up answers real filter
and prioritize bodies — NodeNames bytes, one known node, one unknown, a node that does not fit —
on a scratch state with the service's own settings, both `decideInFilter` settings included.
"""

from __future__ import annotations

import orjson

from gpupack.extender.settings import Settings
from gpupack.extender.sources import NodeUpserted, Synced
from gpupack.extender.state import ClusterState
from gpupack.extender.verbs import filter_body, prioritize_body

_NODES = (
    ("warm-up-dynamic", {"gpupack.io/mig": "dynamic"}, {"nvidia.com/gpu": "8"}),
    ("warm-up-small", {}, {"nvidia.com/gpu": "1"}),
)
_LIMITS = (
    {"nvidia.com/gpu": "2"},
    {"gpupack.io/gpu-milli": "250"},
    {"nvidia.com/mig-1g.10gb": "1"},
)


def compile_kernels(service_settings: Settings) -> None:
    """Answer a few real bodies on scratch states with the service's settings (both decideInFilter)."""
    for decide_in_filter in (True, False):
        settings = service_settings.model_copy(update={"decide_in_filter": decide_in_filter})
        scratch = ClusterState(settings)
        for name, node_annotations, allocatable in _NODES:
            scratch.apply(NodeUpserted(_node(name, node_annotations, allocatable)))
        scratch.apply(Synced())
        for number, limits in enumerate(_LIMITS):
            body = _filter_body(number, limits)
            filter_body(scratch, settings, body)
            prioritize_body(scratch, body)


def _node(name: str, annotations: dict[str, str], allocatable: dict[str, str]) -> dict[str, object]:
    labels = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": allocatable["nvidia.com/gpu"]}
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", **allocatable}
    return {
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "status": {"allocatable": resources, "capacity": resources},
    }


def _filter_body(number: int, limits: dict[str, str]) -> bytes:
    pod = {
        "metadata": {"name": f"warm-up-{number}", "namespace": "gpupack-warm-up", "uid": f"warm-up-{number}"},
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
    }
    names = [name for name, _, _ in _NODES] + ["warm-up-unknown"]
    return orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})
