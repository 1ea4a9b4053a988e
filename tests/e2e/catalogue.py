"""The nodes and pods the end-to-end cases use: one builder per kind docs/contracts.md names
(#pod-resources, #node-labels, #node-annotations).

Nodes: whole GPUs of several models, dynamic MIG (allocatable advertises each profile's upper bound,
since kube-scheduler's own fit sees `nvidia.com/mig-<profile>`), static MIG with a `mig-layout`
(a media-extension instance included), NVLink topologies, spot and on-demand with hourly prices.
Pods: groups of one request kind each, some with GPU-model affinity, every other one interruptible.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from gpupack.harness.controlplane import node_body, pod_body
from gpupack.scoring.geometry import FAMILIES, SHAPES, resolve_profile, resource_profile

H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-80GB"
H200 = "NVIDIA-H200"
A30 = "NVIDIA-A30"
L4 = "NVIDIA-L4"
MEMORY_MIB = {H100: 81559, A100: 81920, H200: 143771, A30: 24576, L4: 23034}
FAMILY_OF = {H100: "H100-80GB", A100: "A100-80GB", H200: "H200-141GB", A30: "A30-24GB"}
PRODUCT_LABEL = "nvidia.com/gpu.product"


# ============================================================ nodes
def _labels(product: str, gpus: int, capacity_type: str) -> dict[str, str]:
    return {
        PRODUCT_LABEL: product,
        "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.memory": str(MEMORY_MIB[product]),
        "karpenter.sh/capacity-type": capacity_type,
    }


def all_to_all_nvlink(gpus: int, links: int) -> str:
    """`gpupack.io/gpu-topology` of GPUs all NVLinked to each other, half on each NUMA node."""
    nvlink = [[0 if i == j else links for j in range(gpus)] for i in range(gpus)]
    return json.dumps({"nvlink": nvlink, "numa": [i * 2 // gpus for i in range(gpus)]})


def nvlink_islands(gpus: int, island: int, links: int) -> str:
    """`gpupack.io/gpu-topology` of NVLink islands of `island` GPUs, one NUMA node per island."""
    nvlink = [[links if i != j and i // island == j // island else 0 for j in range(gpus)] for i in range(gpus)]
    return json.dumps({"nvlink": nvlink, "numa": [i // island for i in range(gpus)]})


def whole_gpu_node(
    name: str, product: str, gpus: int, capacity_type: str, hourly_cost: float, topology: str | None = None
) -> dict[str, Any]:
    """A node of whole GPUs (no MIG), with a price and optionally an NVLink topology.

    It advertises `gpupack.io/gpu-milli` (GPUs × 1000) as gpupack's node agent does (docs/contracts.md#device-plugins).
    Without it kube-scheduler v1.28 does not requeue a pending share pod when such a node is added or
    updated (its pre-enqueue resource check ignores `ignoredByScheduler`): the pod waits for the
    5-minute flush of unschedulable pods.
    """
    annotations = {"gpupack.io/hourly-cost": f"{hourly_cost:.2f}"}
    if topology is not None:
        annotations["gpupack.io/gpu-topology"] = topology
    allocatable = {"nvidia.com/gpu": gpus, "gpupack.io/gpu-milli": gpus * 1000}
    return node_body(name, allocatable, _labels(product, gpus, capacity_type), annotations)


def dynamic_mig_upper_bounds(product: str, gpus: int) -> dict[str, int]:
    """Allocatable `nvidia.com/mig-<profile>` of a dynamic-MIG node: instances per GPU × GPUs.

    A media-extension variant is advertised for each 1g profile, at most one per GPU.
    """
    family = FAMILIES[FAMILY_OF[product]]
    bounds: dict[str, int] = {}
    for profile, shape_id in family.profiles.items():
        shape = SHAPES[shape_id]
        per_gpu = min(len(shape.starts), shape.compute_total // shape.compute)
        bounds[f"nvidia.com/mig-{profile}"] = per_gpu * gpus
        if shape.compute == 1 and shape.size == 1:
            bounds[f"nvidia.com/mig-{resource_profile(profile + '+me')}"] = gpus
    return bounds


def dynamic_mig_node(name: str, product: str, gpus: int, capacity_type: str, hourly_cost: float) -> dict[str, Any]:
    """A node whose GPUs gpupack partitions on demand (`gpupack.io/mig: dynamic`)."""
    annotations = {"gpupack.io/mig": "dynamic", "gpupack.io/hourly-cost": f"{hourly_cost:.2f}"}
    return node_body(name, dynamic_mig_upper_bounds(product, gpus), _labels(product, gpus, capacity_type), annotations)


def static_mig_node(
    name: str, product: str, layout: dict[str, list[str]], capacity_type: str, hourly_cost: float
) -> dict[str, Any]:
    """A node with fixed MIG instances: `gpupack.io/mig-layout` and the matching allocatable counts."""
    family = FAMILIES[FAMILY_OF[product]]
    allocatable: dict[str, int] = {}
    for entries in layout.values():
        for entry in entries:
            profile = entry.split("@")[0]
            resolve_profile(family, profile)  # a typo here is a bug in the test, not in gpupack
            resource = f"nvidia.com/mig-{resource_profile(profile)}"
            allocatable[resource] = allocatable.get(resource, 0) + 1
    annotations = {"gpupack.io/mig-layout": json.dumps(layout), "gpupack.io/hourly-cost": f"{hourly_cost:.2f}"}
    return node_body(name, allocatable, _labels(product, len(layout), capacity_type), annotations)


# Two H100s cut into fixed instances, a media-extension one among them (docs/contracts.md#mig-geometry spelling `+me`).
STATIC_H100_LAYOUT = {
    "0": ["1g.10gb+me@0", "1g.10gb@1", "2g.20gb@2", "3g.40gb@4"],
    "1": ["4g.40gb@0", "2g.20gb@4", "1g.10gb@6"],
}


def every_kind_of_node(prefix: str) -> list[dict[str, Any]]:
    """One cluster with every node kind docs/contracts.md names (names start with `prefix`)."""
    return [
        whole_gpu_node(f"{prefix}-h100-od-0", H100, 8, "on-demand", 98.32, all_to_all_nvlink(8, 18)),
        whole_gpu_node(f"{prefix}-h100-od-1", H100, 8, "on-demand", 98.32, nvlink_islands(8, 4, 18)),
        whole_gpu_node(f"{prefix}-h100-spot-0", H100, 8, "spot", 39.50, all_to_all_nvlink(8, 18)),
        whole_gpu_node(f"{prefix}-a100-od-0", A100, 8, "on-demand", 32.77, all_to_all_nvlink(8, 12)),
        whole_gpu_node(f"{prefix}-a100-spot-0", A100, 8, "spot", 13.10),
        whole_gpu_node(f"{prefix}-h200-od-0", H200, 8, "on-demand", 84.80, all_to_all_nvlink(8, 18)),
        whole_gpu_node(f"{prefix}-a30-od-0", A30, 4, "on-demand", 6.20),
        whole_gpu_node(f"{prefix}-a30-spot-0", A30, 4, "spot", 2.40),
        whole_gpu_node(f"{prefix}-l4-od-0", L4, 2, "on-demand", 1.60),
        dynamic_mig_node(f"{prefix}-h100-mig-dyn-0", H100, 4, "on-demand", 49.16),
        dynamic_mig_node(f"{prefix}-a100-mig-dyn-0", A100, 2, "spot", 3.30),
        dynamic_mig_node(f"{prefix}-h200-mig-dyn-0", H200, 4, "on-demand", 42.40),
        dynamic_mig_node(f"{prefix}-a30-mig-dyn-0", A30, 2, "on-demand", 3.10),
        static_mig_node(f"{prefix}-h100-mig-static-0", H100, STATIC_H100_LAYOUT, "on-demand", 24.58),
    ]


# ============================================================ pods
@dataclass(frozen=True)
class PodGroup:
    """`count` pods asking for `amount` of `resource`, optionally only on the `products` GPU models."""

    name: str
    resource: str
    amount: int
    count: int
    products: tuple[str, ...] = ()


def whole(count: int, gpus: int, *products: str) -> PodGroup:
    """Pods of `gpus` whole GPUs."""
    suffix = "-" + "-".join(p.split("-")[1].lower() for p in products) if products else ""
    return PodGroup(f"gpu{gpus}{suffix}", "nvidia.com/gpu", gpus, count, products)


def share(count: int, milli: int, *products: str) -> PodGroup:
    """Pods of one `milli`/1000 share of a GPU."""
    suffix = "-" + "-".join(p.split("-")[1].lower() for p in products) if products else ""
    return PodGroup(f"milli{milli}{suffix}", "gpupack.io/gpu-milli", milli, count, products)


def mig(count: int, profile: str, *products: str, instances: int = 1) -> PodGroup:
    """Pods of `instances` MIG instances of `profile` (resource spelling, e.g. `1g.10gb.me`)."""
    label = profile.replace(".", "")
    suffix = "-" + "-".join(p.split("-")[1].lower() for p in products) if products else ""
    return PodGroup(f"mig{instances}x{label}{suffix}", f"nvidia.com/mig-{profile}", instances, count, products)


def pods_of(groups: Sequence[PodGroup]) -> Iterator[dict[str, Any]]:
    """The pod bodies of `groups`, interleaved (a burst of mixed kinds); every other pod interruptible."""
    queues = [[(group, i) for i in range(group.count)] for group in groups]
    serial = 0
    while any(queues):
        for queue in queues:
            if queue:
                group, i = queue.pop(0)
                yield pod_body(
                    f"{group.name}-{i}",
                    {group.resource: group.amount},
                    annotations={"gpupack.io/interruptible": "true"} if serial % 2 else {},
                    node_affinity={PRODUCT_LABEL: list(group.products)} if group.products else None,
                )
                serial += 1


# A burst of every request kind (docs/contracts.md#pod-resources) for `every_kind_of_node`, 300+ pods.
# Demand is a little over capacity, so some pods must stay Pending; the L4 shares are meant to: at most
# two fit on its two GPUs.
BURST: tuple[PodGroup, ...] = (
    whole(8, 1),
    whole(6, 1, H100, H200),
    whole(4, 1, A30),
    whole(5, 2),
    whole(2, 4),
    whole(1, 8),
    share(80, 50),
    share(60, 100),
    share(10, 100, A100),
    share(50, 150),
    share(10, 250),
    share(6, 600, L4),
    mig(12, "1g.10gb"),
    mig(4, "1g.10gb", H100),
    mig(4, "1g.20gb"),
    mig(6, "2g.20gb"),
    mig(4, "3g.40gb"),
    mig(2, "4g.40gb"),
    mig(1, "7g.80gb"),
    mig(4, "1g.10gb.me"),
    mig(1, "1g.10gb", instances=2),
    mig(4, "1g.18gb"),
    mig(2, "1g.35gb"),
    mig(2, "2g.35gb"),
    mig(1, "3g.71gb"),
    mig(1, "7g.141gb"),
    mig(2, "1g.18gb.me"),
    mig(4, "1g.6gb"),
    mig(2, "2g.12gb"),
    mig(1, "4g.24gb"),
    mig(2, "1g.6gb.me"),
)
L4_SHARES = "milli600-l4"

# A mix that fits `restart_nodes` with room to spare: every pod must end up bound.
FITTING_MIX: tuple[PodGroup, ...] = (
    whole(4, 1),
    whole(2, 2),
    whole(1, 4),
    share(30, 100),
    share(12, 250),
    mig(8, "1g.10gb"),
    mig(2, "2g.20gb"),
    mig(1, "3g.40gb"),
    mig(2, "1g.10gb.me"),
)


def restart_nodes(prefix: str) -> list[dict[str, Any]]:
    """A small cluster of every node kind with room for FITTING_MIX."""
    return [
        whole_gpu_node(f"{prefix}-h100-od-0", H100, 8, "on-demand", 98.32, all_to_all_nvlink(8, 18)),
        whole_gpu_node(f"{prefix}-h100-spot-0", H100, 8, "spot", 39.50, nvlink_islands(8, 4, 18)),
        whole_gpu_node(f"{prefix}-a100-spot-0", A100, 8, "spot", 13.10, nvlink_islands(8, 4, 12)),
        whole_gpu_node(f"{prefix}-a30-od-0", A30, 4, "on-demand", 6.20),
        dynamic_mig_node(f"{prefix}-h100-mig-dyn-0", H100, 4, "on-demand", 49.16),
        static_mig_node(f"{prefix}-h100-mig-static-0", H100, STATIC_H100_LAYOUT, "on-demand", 24.58),
    ]
