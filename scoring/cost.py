"""Split cost allocation (docs/contracts.md#report-json, `gpupack report`), in whole cents so that it adds up exactly.

As EKS split cost allocation: on each node that holds GPU pods, a pod is charged the node's cost x its
share of the node's GPUs, and the node's unused part is spread over its pods in proportion to that
share — together, the node's whole cost split in proportion to the shares. A node without a GPU pod
is charged to nobody (the unallocated cost). Every amount is rounded to the cent once, per node, and
that node's cents are apportioned by largest remainder, so the pods' charges plus the unallocated
cost equal the cluster's cost to the cent.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpupack.scoring.facts import Placement
from gpupack.scoring.geometry import SHAPE_COMPUTE, resolve_profile
from gpupack.scoring.inventory import Inventory
from gpupack.scoring.request import MILLI_PER_GPU


def placement_gpus(inventory: Inventory, placement: Placement) -> float:
    """GPUs a placement takes, in whole-GPU units: a share its milli/1000, a MIG instance its compute
    slices over the GPU's (a 3g.40gb on an H100 is 3/7)."""
    model = inventory.models[int(inventory.node_model[inventory.index[placement.node]])]
    total = 0.0
    for slot in placement.slots:
        if slot.mig:
            family = model.mig_family
            if family is None:
                raise ValueError(f"node {placement.node} has no MIG geometry for {slot.mig}")
            shape, _ = resolve_profile(family, slot.mig)
            total += int(SHAPE_COMPUTE[shape]) / family.compute_total
        elif slot.milli:
            total += slot.milli / MILLI_PER_GPU
        else:
            total += 1.0
    return total


def to_cents(amount: float) -> int:
    """An amount of money in whole cents, halves rounded up (98.325 -> 9833)."""
    return math.floor(amount * 100 + 0.5 + 1e-9)


def apportion(total: int, weights: Sequence[float]) -> list[int]:
    """`total` (cents) split in proportion to `weights` into whole parts that sum to `total` exactly.

    Largest remainder (Hamilton): every part gets the floor of its quota, then the parts with the
    largest remainders get one more, ties to the earlier part. All-zero weights get nothing.
    """
    weight_sum = float(sum(weights))
    if total == 0 or weight_sum <= 0:
        return [0] * len(weights)
    quotas = [total * w / weight_sum for w in weights]
    parts = [math.floor(q) for q in quotas]
    left = total - sum(parts)
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - parts[i]), i))
    for i in by_remainder[:left]:
        parts[i] += 1
    return parts


@dataclass
class Bill:
    """Who is charged what over a window: cents per pod, the unallocated cents, and the total."""

    total_cents: int = 0
    unallocated_cents: int = 0
    pod_cents: dict[str, int] = field(default_factory=dict)
    unpriced_nodes: list[str] = field(default_factory=list)

    def by_group(self, group_of: Mapping[str, str]) -> dict[str, int]:
        """Cents per group (e.g. namespace) of the pods, groups sorted by name."""
        grouped: dict[str, int] = {}
        for pod, cents in self.pod_cents.items():
            grouped[group_of[pod]] = grouped.get(group_of[pod], 0) + cents
        return dict(sorted(grouped.items()))


def split_costs(
    node_costs: Iterable[tuple[str, float | None]],
    shares: Mapping[str, Mapping[str, float]],
    hours: float = 1.0,
) -> Bill:
    """The split cost allocation of a cluster over `hours`.

    `node_costs`: (node, hourly cost or None when unpriced); `shares`: node -> pod -> GPUs the pod
    holds there (pods holding no GPU may be listed with 0: they are charged nothing).
    """
    bill = Bill()
    for node, hourly in node_costs:
        if hourly is None:
            bill.unpriced_nodes.append(node)
            hourly = 0.0
        cents = to_cents(hourly * hours)
        bill.total_cents += cents
        on_node = shares.get(node, {})
        pods = list(on_node)
        parts = apportion(cents, [on_node[pod] for pod in pods])
        if sum(parts) != cents:  # no GPU pod on the node: nobody is charged
            bill.unallocated_cents += cents
            parts = [0] * len(pods)
        for pod, part in zip(pods, parts, strict=True):
            bill.pod_cents[pod] = bill.pod_cents.get(pod, 0) + part
    return bill
