"""A simulated end state as a cluster file: the simulator's placements written as bound Pods.

The simulator (`gpupack.sim.simulate.run_once`, the decider the extender runs) places the pods of
a trace in the FGD protocol's order at `load` x the cluster's GPU capacity (seeded shuffle, copies
or removals to reach the load); every placed pod becomes a Pod bound to its node with its
`gpupack.io/assignment`, every node a Node object (`gpupack.sim.scenarios.node_object`). The file
reads back through the extender like any cluster file, and `gpupack serve --cluster-file` serves it.
Labels of Pods read from a YAML/JSON file are kept (a `-tuned-K` copy has its original's).
"""

from __future__ import annotations

from typing import Any

import orjson
import yaml

from gpupack.errors import GpupackError
from gpupack.kube.keys import (
    ANNOTATION_ASSIGNMENT,
    ANNOTATION_INTERRUPTIBLE,
    LABEL_GPU_PRODUCT,
    RESOURCE_GPU,
    RESOURCE_GPU_MILLI,
    RESOURCE_MIG_PREFIX,
)
from gpupack.kube.objects import make_pod
from gpupack.scoring.facts import Placement
from gpupack.scoring.geometry import resource_profile
from gpupack.scoring.request import Kind, PodRequest

SIMULATED_IMAGE = "gpupack.io/simulated"


class SimulationError(GpupackError, ValueError):
    """Simulation input that cannot be used; says which file and why."""


def simulated_cluster_yaml(nodes_path: str, pods_path: str, policy: str, seed: int, load: float) -> str:
    """The end state of simulating `pods_path` on `nodes_path` as a cluster-file YAML `List`."""
    from gpupack.sim.load import OBJECT_SUFFIXES, load_trace
    from gpupack.sim.objects_loader import load_objects
    from gpupack.sim.protocol import TUNED_SUFFIX, fgd_order
    from gpupack.sim.scenarios import node_objects
    from gpupack.sim.simulate import make_policy, run_once
    from gpupack.sim.workload import TraceError

    if load <= 0:
        raise SimulationError("--load must be positive")
    try:
        trace = load_trace(nodes_path, pods_path)
        spec = make_policy(policy, trace.pods)
        labels = _pod_labels(load_objects(pods_path)) if pods_path.endswith(OBJECT_SUFFIXES) else {}
    except (OSError, TraceError, ValueError) as exc:
        raise SimulationError(str(exc)) from None
    order = fgd_order(trace.pods, trace.gpu_milli_capacity, seed, load)
    requests = {pod.name: pod.request for pod in order}
    result = run_once(trace, order, spec, seed, keep_placements=True)
    pods = []
    for name, placement in result.placements.items():
        match = TUNED_SUFFIX.match(name)
        base = match["base"] if match else name
        pods.append(pod_object(name, requests[name], placement, labels.get(base, {})))
    items = [*node_objects(trace.nodes), *pods]
    return yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}, sort_keys=False)


def _pod_labels(objects: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    labels = {}
    for obj in objects:
        metadata = obj.get("metadata") or {}
        if obj.get("kind") == "Pod" and isinstance(metadata.get("labels"), dict):
            labels[f"{metadata.get('namespace') or 'default'}/{metadata.get('name')}"] = metadata["labels"]
    return labels


def pod_object(key: str, request: PodRequest, placement: Placement, labels: dict[str, str]) -> dict[str, Any]:
    """A running v1 Pod asking for `request`, bound to `placement.node` with its assignment annotation
    (`kube.pod_request.request_from_pod` reads `request` back from it)."""
    namespace, name = key.split("/", 1) if "/" in key else ("default", key)
    resources: dict[str, str] = {"cpu": f"{request.cpu_milli}m", "memory": str(request.memory_bytes)}
    if request.kind == Kind.WHOLE:
        resources[RESOURCE_GPU] = str(request.gpus)
    elif request.kind == Kind.SHARE:
        resources[RESOURCE_GPU_MILLI] = str(request.milli)
    for profile, count in request.mig:
        resources[RESOURCE_MIG_PREFIX + resource_profile(profile)] = str(count)
    annotations = {ANNOTATION_ASSIGNMENT: orjson.dumps(placement.to_assignment()).decode()}
    if request.interruptible:
        annotations[ANNOTATION_INTERRUPTIBLE] = "true"
    pod = make_pod(
        name, namespace=namespace, requests=resources, node=placement.node, annotations=annotations,
        image=SIMULATED_IMAGE,
    )  # fmt: skip
    pod["metadata"]["labels"] = dict(labels)
    if request.allowed_products is not None:
        expression = {"key": LABEL_GPU_PRODUCT, "operator": "In", "values": sorted(request.allowed_products)}
        pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [expression]}]}}}  # fmt: skip
    return pod
