"""Bench clusters from small declarative specs: node model x count, MIG mode, topology, capacity type, price.

`ClusterSpec.build()` gives the `NodeFacts` the simulator runs on; `to_node_yaml` (and
`python -m gpupack.sim.scenarios NAME [SCALE]`) writes the same nodes as v1 Node objects (the labels and
annotations of docs/contracts.md) that `gpupack simulate --nodes` and `kube.node_facts.facts_from_node`
read back into equal facts.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from gpupack.kube.keys import (
    ANNOTATION_GPU_TOPOLOGY,
    ANNOTATION_HOURLY_COST,
    ANNOTATION_MIG,
    ANNOTATION_MIG_LAYOUT,
    LABEL_GPU_COUNT,
    LABEL_GPU_MEMORY,
    LABEL_GPU_PRODUCT,
    LABEL_INSTANCE_TYPE,
    RESOURCE_GPU,
    RESOURCE_MIG_PREFIX,
)
from gpupack.scoring.facts import MigMode, NodeFacts
from gpupack.scoring.geometry import resource_profile

GIB = 1 << 30
TIB = 1 << 40
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"

H100 = "NVIDIA-H100-80GB-HBM3"
H200 = "NVIDIA-H200"
A100 = "NVIDIA-A100-SXM4-80GB"
A100_PCIE = "NVIDIA-A100-80GB-PCIe"
A30 = "NVIDIA-A30"
V100 = "Tesla-V100-SXM2-32GB"
L4 = "NVIDIA-L4"
T4 = "Tesla-T4"

Matrix = tuple[tuple[int, ...], ...]
GpuLayout = tuple[tuple[str, int], ...]

# mig-parted's `all-balanced`: per 80 GB GPU 2 x 1g + 1 x 2g + 1 x 3g; per A30 2 x 1g + 1 x 2g
BALANCED_80GB: GpuLayout = (("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4))
BALANCED_A30: GpuLayout = (("2g.12gb", 0), ("1g.6gb", 2), ("1g.6gb", 3))

# DGX-1 (V100) hybrid cube-mesh: NVLink count per GPU pair
DGX1_LINKS: dict[tuple[int, int], int] = {
    (0, 1): 1,
    (0, 2): 1,
    (0, 3): 2,
    (0, 4): 2,
    (1, 2): 2,
    (1, 3): 1,
    (1, 5): 2,
    (2, 3): 2,
    (2, 6): 1,
    (3, 7): 1,
    (4, 5): 1,
    (4, 6): 1,
    (4, 7): 2,
    (5, 6): 2,
    (5, 7): 1,
    (6, 7): 2,
}


def link_matrix(count: int, links: dict[tuple[int, int], int]) -> Matrix:
    """A symmetric count x count NVLink matrix from {(a, b): links}; the diagonal is 0."""
    rows = [[0] * count for _ in range(count)]
    for (a, b), n in links.items():
        rows[a][b] = rows[b][a] = n
    return tuple(tuple(row) for row in rows)


def nvswitch(count: int = 8, links: int = 18) -> Matrix:
    """Every pair of GPUs joined through NVSwitch (H100 SXM: 18 links each)."""
    return link_matrix(count, {(a, b): links for a in range(count) for b in range(a + 1, count)})


def bridge_pairs(count: int = 4, links: int = 12) -> Matrix:
    """PCIe GPUs with NVLink bridges joining (0, 1), (2, 3), ... (A100 PCIe: 3 bridges, 12 links)."""
    return link_matrix(count, {(a, a + 1): links for a in range(0, count - 1, 2)})


def numa_halves(count: int) -> tuple[int, ...]:
    """First half of the GPUs on NUMA node 0, the rest on node 1."""
    return tuple(0 if j < count // 2 else 1 for j in range(count))


@dataclass(frozen=True)
class NodeSpec:
    """`count` identical nodes."""

    product: str
    count: int
    gpus: int
    cpu_milli: int
    memory_bytes: int
    prefix: str = ""  # node names are <prefix>-<i>; default: derived from the product
    pods: int = 110
    mig: MigMode = MigMode.NONE
    layout: GpuLayout = ()  # static MIG: the instances every GPU holds
    nvlink: Matrix | None = None
    numa: tuple[int, ...] | None = None
    spot: bool = False
    hourly_cost: float | None = None
    instance_type: str = ""

    def name_prefix(self) -> str:
        """The node-name prefix of this group."""
        base = self.prefix or self.product.lower().replace("nvidia-", "").replace("tesla-", "")
        return f"{base}-spot" if self.spot and not self.prefix else base

    def facts(self, index: int) -> NodeFacts:
        """Facts of the `index`-th node of the group."""
        layout = {g: self.layout for g in range(self.gpus)} if self.mig == MigMode.STATIC else {}
        labels = {CAPACITY_TYPE_LABEL: "spot" if self.spot else "on-demand"}
        if self.instance_type:
            labels[LABEL_INSTANCE_TYPE] = self.instance_type
        return NodeFacts(
            name=f"{self.name_prefix()}-{index}",
            cpu_milli=self.cpu_milli,
            memory_bytes=self.memory_bytes,
            pods=self.pods,
            gpu_product=self.product,
            gpu_count=self.gpus,
            mig_mode=self.mig,
            mig_layout=layout,
            nvlink=self.nvlink,
            numa=self.numa,
            spot=self.spot,
            hourly_cost=self.hourly_cost,
            labels=labels,
        )


@dataclass(frozen=True)
class ClusterSpec:
    """A named cluster: groups of identical nodes."""

    name: str
    groups: tuple[NodeSpec, ...] = field(default_factory=tuple)

    def build(self) -> list[NodeFacts]:
        """Every node's facts, group by group."""
        names = [g.name_prefix() for g in self.groups]
        duplicates = [n for n, c in Counter(names).items() if c > 1]
        if duplicates:
            raise ValueError(f"cluster {self.name}: node groups share the prefix {duplicates[0]!r}")
        return [group.facts(i) for group in self.groups for i in range(group.count)]

    def scaled(self, factor: float) -> ClusterSpec:
        """The same mix with every group's node count times `factor` (at least one node each)."""
        return replace(self, groups=tuple(replace(g, count=max(1, round(g.count * factor))) for g in self.groups))

    def with_mig(self, mode: MigMode, layouts: dict[str, GpuLayout] | None = None) -> ClusterSpec:
        """Every group of a product in `layouts` (static) or every group (dynamic) in `mode`."""
        groups = []
        for g in self.groups:
            if mode == MigMode.STATIC:
                groups.append(replace(g, mig=mode, layout=(layouts or {})[g.product]))
            else:
                groups.append(replace(g, mig=mode, layout=()))
        return replace(self, groups=tuple(groups))

    @property
    def node_count(self) -> int:
        return sum(g.count for g in self.groups)

    @property
    def gpu_count(self) -> int:
        return sum(g.count * g.gpus for g in self.groups)

    def describe(self) -> list[dict[str, object]]:
        """One row per group, for the report."""
        return [
            {
                "product": g.product,
                "nodes": g.count,
                "gpus": g.gpus,
                "cpu_cores": g.cpu_milli // 1000,
                "memory_gib": g.memory_bytes // GIB,
                "mig": g.mig.name.lower(),
                "spot": g.spot,
                "hourly_cost": g.hourly_cost,
            }
            for g in self.groups
        ]


# ----------------------------------------------------------------------------- the bench clusters
def mig_cluster() -> ClusterSpec:
    """~780 nodes: H100-80GB x 8 and A100-80GB x 8 in dynamic MIG mode, A30 x 4 (also dynamic)."""
    return ClusterSpec(
        "mig",
        (
            NodeSpec(H100, 300, 8, 192_000, 2 * TIB, mig=MigMode.DYNAMIC),
            NodeSpec(A100, 300, 8, 192_000, 2 * TIB, mig=MigMode.DYNAMIC),
            NodeSpec(A30, 180, 4, 96_000, TIB, mig=MigMode.DYNAMIC),
        ),
    )


STATIC_BALANCED = {H100: BALANCED_80GB, A100: BALANCED_80GB, A30: BALANCED_A30}


def churn_cluster() -> ClusterSpec:
    """The churn scenario's cluster: A100-80GB, H100-80GB and H200 nodes x 8 GPUs, all in dynamic MIG mode."""
    return ClusterSpec(
        "churn",
        (
            NodeSpec(A100, 10, 8, 192_000, 2 * TIB, mig=MigMode.DYNAMIC),
            NodeSpec(H100, 10, 8, 192_000, 2 * TIB, mig=MigMode.DYNAMIC),
            NodeSpec(H200, 10, 8, 192_000, 2 * TIB, mig=MigMode.DYNAMIC),
        ),
    )


def nvlink_cluster() -> ClusterSpec:
    """NVSwitch H100 x 8, DGX-1 V100 hybrid cube-mesh x 8 and A100 PCIe x 4 with NVLink bridge pairs."""
    return ClusterSpec(
        "nvlink",
        (
            NodeSpec(H100, 250, 8, 192_000, 2 * TIB, nvlink=nvswitch(8), numa=numa_halves(8)),
            NodeSpec(V100, 250, 8, 96_000, TIB, nvlink=link_matrix(8, DGX1_LINKS), numa=numa_halves(8)),
            NodeSpec(A100_PCIE, 500, 4, 96_000, TIB, nvlink=bridge_pairs(4), numa=numa_halves(4)),
        ),
    )


# on-demand hourly list prices (AWS us-east-1, rounded); spot at ~35 % of on-demand
ON_DEMAND = {
    H100: ("p5.48xlarge", 98.32),
    A100: ("p4de.24xlarge", 40.97),
    L4: ("g6.12xlarge", 4.60),
    T4: ("g4dn.12xlarge", 3.91),
}
SPOT_FRACTION = 0.35


def cost_cluster() -> ClusterSpec:
    """On-demand and spot node groups of four GPU models, with hourly prices."""
    groups: list[NodeSpec] = []
    for product, count, gpus, cpu, memory in (
        (H100, 40, 8, 192_000, 2 * TIB),
        (A100, 40, 8, 96_000, TIB),
        (L4, 60, 4, 48_000, 192 * GIB),
        (T4, 60, 4, 48_000, 192 * GIB),
    ):
        instance, price = ON_DEMAND[product]
        for spot in (False, True):
            cost = round(price * SPOT_FRACTION, 2) if spot else price
            groups.append(
                NodeSpec(product, count, gpus, cpu, memory, spot=spot, hourly_cost=cost, instance_type=instance)
            )
    return ClusterSpec("cost", tuple(groups))


# ----------------------------------------------------------------------------- Node objects
def node_object(facts: NodeFacts) -> dict[str, Any]:
    """A v1 Node that `facts_from_node` reads back into `facts` (labels beyond gpupack's are kept)."""
    labels = dict(facts.labels)
    annotations: dict[str, str] = {}
    allocatable: dict[str, str] = {
        "cpu": f"{facts.cpu_milli}m",
        "memory": str(facts.memory_bytes),
        "pods": str(facts.pods),
    }
    if facts.gpu_count:
        labels[LABEL_GPU_PRODUCT] = facts.gpu_product
        labels[LABEL_GPU_COUNT] = str(facts.gpu_count)
        if facts.gpu_memory_mib:
            labels[LABEL_GPU_MEMORY] = str(facts.gpu_memory_mib)
        whole = facts.gpu_count
        if facts.mig_mode == MigMode.DYNAMIC:
            annotations[ANNOTATION_MIG] = "dynamic"
        elif facts.mig_mode == MigMode.STATIC:
            annotations[ANNOTATION_MIG_LAYOUT] = json.dumps(
                {str(g): [f"{p}@{s}" for p, s in instances] for g, instances in sorted(facts.mig_layout.items())}
            )
            counts = Counter(p for instances in facts.mig_layout.values() for p, _ in instances)
            for profile, n in sorted(counts.items()):
                allocatable[RESOURCE_MIG_PREFIX + resource_profile(profile)] = str(n)
            whole -= len(facts.mig_layout)
        allocatable[RESOURCE_GPU] = str(whole)
    if facts.nvlink is not None or facts.numa is not None:
        topology: dict[str, object] = {}
        if facts.nvlink is not None:
            topology["nvlink"] = [list(row) for row in facts.nvlink]
        if facts.numa is not None:
            topology["numa"] = list(facts.numa)
        annotations[ANNOTATION_GPU_TOPOLOGY] = json.dumps(topology, separators=(",", ":"))
    if facts.hourly_cost is not None:
        annotations[ANNOTATION_HOURLY_COST] = repr(float(facts.hourly_cost))
    if facts.spot:
        labels[CAPACITY_TYPE_LABEL] = "spot"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": facts.name, "labels": labels, "annotations": annotations},
        "status": {"allocatable": allocatable, "capacity": dict(allocatable)},
    }


def node_objects(nodes: Iterable[NodeFacts]) -> list[dict[str, Any]]:
    """`node_object` of every node."""
    return [node_object(facts) for facts in nodes]


def to_node_yaml(nodes: Sequence[NodeFacts]) -> str:
    """The nodes as a YAML `v1 List` of Node objects, for `gpupack simulate --nodes`."""
    return yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": node_objects(nodes)}, sort_keys=False)


CLUSTERS = {
    "mig": mig_cluster,
    "mig-static-balanced": lambda: mig_cluster().with_mig(MigMode.STATIC, STATIC_BALANCED),
    "nvlink": nvlink_cluster,
    "cost": cost_cluster,
    "churn": churn_cluster,
}


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m gpupack.sim.scenarios NAME [SCALE]`: print a bench cluster as Node YAML (for `simulate --nodes`)."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in CLUSTERS:
        print(f"usage: python -m gpupack.sim.scenarios {{{','.join(CLUSTERS)}}} [SCALE]", file=sys.stderr)
        return 2
    spec = CLUSTERS[args[0]]()
    sys.stdout.write(to_node_yaml(spec.scaled(float(args[1]) if len(args) > 1 else 1.0).build()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
