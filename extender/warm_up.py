"""Compile every numba kernel before `/readyz` says ready, through the path real requests take.

Running only the scoring kernels left the name-lookup kernels (`scoring.names`) to the first real
`/filter`, which then took 3–7 s with an empty numba cache (#13). So the warm-up answers real filter
and prioritize bodies — NodeNames bytes, one known node, one unknown, a node that does not fit —
on a scratch state with the service's own settings, both `decideInFilter` settings included.
"""

from __future__ import annotations

from typing import Any

import orjson

from gpupack.extender.settings import Settings
from gpupack.extender.state import ClusterState
from gpupack.extender.verbs import filter_body, prioritize_body
from gpupack.kube.objects import make_node, make_pod
from gpupack.kube.sources import NodeUpserted, Synced

_LIMITS = (
    {"nvidia.com/gpu": "2"},
    {"gpupack.io/gpu-milli": "250"},
    {"nvidia.com/mig-1g.10gb": "1"},
)


def warm_up(state: ClusterState) -> None:
    """Compile every kernel through the path real requests take with `state`'s settings, then mark it warm."""
    compile_kernels(state.settings)
    state.mark_warm()


def compile_kernels(service_settings: Settings) -> None:
    """Answer a few real bodies on scratch states with the service's settings (both decideInFilter)."""
    for decide_in_filter in (True, False):
        settings = service_settings.model_copy(update={"decide_in_filter": decide_in_filter})
        scratch = ClusterState(settings)
        nodes = _nodes()
        for node in nodes:
            scratch.apply(NodeUpserted(node))
        scratch.apply(Synced())
        names = [node["metadata"]["name"] for node in nodes] + ["warm-up-unknown"]
        for number, limits in enumerate(_LIMITS):
            body = _filter_body(number, limits, names)
            filter_body(scratch, settings, body)
            prioritize_body(scratch, body)


def _nodes() -> list[dict[str, Any]]:
    """An 8-GPU dynamic-MIG node and a 1-GPU node."""
    dynamic = make_node("warm-up-dynamic", gpus=8, cpu="64", memory="512Gi", annotations={"gpupack.io/mig": "dynamic"})
    return [dynamic, make_node("warm-up-small", gpus=1, cpu="64", memory="512Gi")]


def _filter_body(number: int, limits: dict[str, str], names: list[str]) -> bytes:
    name = f"warm-up-{number}"
    pod = make_pod(name, namespace="gpupack-warm-up", uid=name, requests=limits)
    return orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})
