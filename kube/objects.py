"""Builders of v1 Node and Pod objects as the API server sends them (camelCase JSON dicts).

One way to make a Node or a Pod for tests, benchmarks and examples, in the spirit of
scheduler-plugins' `st.MakePod()`: every field has a plain default, and a call names only what
matters to it. The shapes follow docs/contracts.md (labels, annotations and resources gpupack reads).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from gpupack.kube.keys import (
    LABEL_GPU_COUNT,
    LABEL_GPU_PRODUCT,
    RESOURCE_CPU,
    RESOURCE_GPU,
    RESOURCE_MEMORY,
    RESOURCE_PODS,
)

H100 = "NVIDIA-H100-80GB-HBM3"
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"

Quantity = str | int
Resources = Mapping[str, Quantity]
V = TypeVar("V")


def make_node(
    name: str,
    *,
    gpus: int = 8,
    product: str | None = H100,
    cpu: Quantity = "192",
    memory: Quantity = "2Ti",
    pods: Quantity = "110",
    spot: bool | None = None,
    labels: Mapping[str, str | None] | None = None,
    annotations: Mapping[str, str] | None = None,
    allocatable: Mapping[str, Quantity | None] | None = None,
    uid: str | None = None,
    resource_version: str | None = None,
) -> dict[str, Any]:
    """A Node with `gpus` whole GPUs of `product` (labelled as NVIDIA's GPU feature discovery does).

    `product=None` makes a node without GPUs. `spot` sets the Karpenter capacity-type label (None: no
    label). `labels` and `allocatable` are merged over the defaults; a value of None removes that
    default key. Capacity equals allocatable. `annotations=None` leaves metadata.annotations out.
    """
    resources: dict[str, Quantity | None] = {RESOURCE_CPU: cpu, RESOURCE_MEMORY: memory, RESOURCE_PODS: pods}
    node_labels: dict[str, str | None] = {}
    if product is not None:
        resources[RESOURCE_GPU] = gpus
        node_labels |= {LABEL_GPU_PRODUCT: product, LABEL_GPU_COUNT: str(gpus)}
    if spot is not None:
        node_labels[CAPACITY_TYPE_LABEL] = "spot" if spot else "on-demand"
    metadata: dict[str, Any] = {
        "name": name,
        "uid": uid or f"uid-{name}",
        "labels": _present(node_labels | dict(labels or {})),
    }
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    quantities = {key: str(value) for key, value in _present(resources | dict(allocatable or {})).items()}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": metadata,
        "spec": {},
        "status": {"allocatable": quantities, "capacity": dict(quantities)},
    }


def make_pod(
    name: str,
    *,
    namespace: str = "default",
    uid: str | None = None,
    requests: Resources | None = None,
    containers: Sequence[Resources] | None = None,
    init_containers: Sequence[Resources] = (),
    node: str | None = None,
    phase: str | None = None,
    annotations: Mapping[str, str] | None = None,
    scheduler: str | None = "gpupack",
    image: str = "x",
    resource_version: str | None = None,
    created: str | None = None,
) -> dict[str, Any]:
    """A Pod whose one container, `main`, asks for `requests`; or containers `c0`, `c1`, … asking for
    the entries of `containers` (and init containers `init0`, … for `init_containers`).

    Limits equal requests, as extended resources such as GPUs require. `node` sets spec.nodeName;
    the phase is then Running, else Pending, unless `phase` says otherwise. The uid defaults to
    `uid-<namespace>-<name>`. `scheduler=None` leaves spec.schedulerName out, `annotations=None`
    metadata.annotations.
    """
    if containers is None:
        main = requests if requests is not None else {RESOURCE_CPU: "1", RESOURCE_MEMORY: "1Gi"}
        named = [_container("main", main, image)]
    elif requests is None:
        named = [_container(f"c{i}", ask, image) for i, ask in enumerate(containers)]
    else:
        raise ValueError("pass requests or containers, not both")
    spec: dict[str, Any] = {} if scheduler is None else {"schedulerName": scheduler}
    spec["containers"] = named
    if init_containers:
        spec["initContainers"] = [_container(f"init{i}", ask, image) for i, ask in enumerate(init_containers)]
    if node is not None:
        spec["nodeName"] = node
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid or f"uid-{namespace}-{name}",
    }
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    if created is not None:
        metadata["creationTimestamp"] = created
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": spec,
        "status": {"phase": phase or ("Running" if node is not None else "Pending")},
    }


def _container(name: str, ask: Resources, image: str) -> dict[str, Any]:
    """A container whose limits and requests are both `ask`."""
    limits = {key: str(value) for key, value in ask.items()}
    return {"name": name, "image": image, "resources": {"limits": limits, "requests": dict(limits)}}


def _present(values: Mapping[str, V | None]) -> dict[str, V]:
    """`values` without the keys whose value is None."""
    return {key: value for key, value in values.items() if value is not None}
