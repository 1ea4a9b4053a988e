"""Gang placement (#29): every member of a group placed, or none, in the smallest topology domain that holds them.

A group of `count` identical members is planned at once. The nodes are cut into topology domains,
smallest level first: NVLink domains (GPU feature discovery's `nvidia.com/gpu.clique`), then racks (a
configurable node label), then zones, then the whole candidate set. At each level every domain is tried
by placing the members one after another with the decider's own rules (each member's exact GPUs, MIG
placement or share, CPU and memory, the NVLink rules inside a node), committing each so the next sees it,
and giving everything back afterwards: a plan changes nothing. The first level with a domain that holds
all members wins; among its domains the one whose placements score highest (the sum of the members'
scores, the terms single pods are scored by), the first in domain order on a tie.

`widest` stops the walk at a level: a group that must stay inside one NVLink domain is not spread over
a rack. The plan of a group that does not fit says the most members any one domain took (`largest_fit`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from gpupack.scoring.decider import Decider
from gpupack.scoring.facts import Placement
from gpupack.scoring.inventory import Inventory
from gpupack.scoring.request import Kind, PodRequest

CLIQUE_LABEL = "nvidia.com/gpu.clique"  # GPU feature discovery: the node's multi-node NVLink domain
ZONE_LABEL = "topology.kubernetes.io/zone"
DEFAULT_RACK_LABEL = "gpupack.io/rack"


class Level(IntEnum):
    """Topology levels, smallest first."""

    NVLINK = 0
    RACK = 1
    ZONE = 2
    CLUSTER = 3

    @property
    def text(self) -> str:
        """How reasons name a domain of this level."""
        return ("NVLink domain", "rack", "zone", "cluster")[self]


@dataclass(frozen=True)
class Domain:
    """Nodes that share one topology label value (or every candidate, at the cluster level)."""

    level: Level
    name: str  # the label's value ("" for the cluster)
    nodes: tuple[str, ...]

    def describe(self) -> str:
        """'NVLink domain clique-a', 'rack r7', 'the cluster'."""
        return f"{self.level.text} {self.name}" if self.name else "the cluster"


@dataclass(frozen=True)
class GangPlan:
    """Where each member goes (empty: the group does not fit), the domain chosen and the most members any
    tried domain took."""

    placements: tuple[Placement, ...]
    domain: Domain | None
    largest_fit: int
    score: float = 0.0

    @property
    def fits(self) -> bool:
        """Every member has a placement."""
        return bool(self.placements)


def level_labels(rack_label: str = DEFAULT_RACK_LABEL) -> dict[Level, str]:
    """The node label of each level below the cluster."""
    return {Level.NVLINK: CLIQUE_LABEL, Level.RACK: rack_label, Level.ZONE: ZONE_LABEL}


def topology_domains(
    node_labels: Mapping[str, Mapping[str, str]], labels: Mapping[Level, str], widest: Level = Level.CLUSTER
) -> list[Domain]:
    """Every domain of every level up to `widest`, smallest level first, each level's domains by name.

    A node without a level's label belongs to no domain of that level. A domain whose nodes equal those of
    a domain already listed (a rack that is one NVLink domain) is not listed again.
    """
    domains: list[Domain] = []
    seen: set[frozenset[str]] = set()
    for level in Level:
        if level > widest:
            break
        for domain in _level_domains(node_labels, level, labels.get(level, "")):
            members = frozenset(domain.nodes)
            if members and members not in seen:
                seen.add(members)
                domains.append(domain)
    return domains


def _level_domains(node_labels: Mapping[str, Mapping[str, str]], level: Level, label: str) -> Iterable[Domain]:
    if level == Level.CLUSTER:
        yield Domain(level, "", tuple(node_labels))
        return
    by_value: dict[str, list[str]] = {}
    for node, node_label_map in node_labels.items():
        value = node_label_map.get(label, "") if label else ""
        if value:
            by_value.setdefault(value, []).append(node)
    for value in sorted(by_value):
        yield Domain(level, value, tuple(by_value[value]))


def node_labels_of(inventory: Inventory, candidates: np.ndarray | None = None) -> dict[str, Mapping[str, str]]:
    """The labels of the inventory's nodes (only the rows set in `candidates`, when given), by name."""
    labels: dict[str, Mapping[str, str]] = {}
    for name, row in inventory.index.items():
        facts = inventory.facts[row]
        if facts is not None and (candidates is None or candidates[row]):
            labels[name] = facts.labels
    return labels


def plan_gang(decider: Decider, request: PodRequest, count: int, domains: Sequence[Domain]) -> GangPlan:
    """Place `count` members of `request` in the smallest level's best domain (module docstring); the
    inventory is left as it was."""
    if count <= 0:
        return GangPlan((), None, 0)
    largest = 0
    best: GangPlan | None = None
    for domain in domains:
        if best is not None and domain.level > best.domain.level:  # type: ignore[union-attr]  # a best has one
            break
        placements, score = place_members(decider, request, count, domain.nodes)
        largest = max(largest, len(placements))
        if len(placements) == count and (best is None or score > best.score):
            best = GangPlan(tuple(placements), domain, count, score)
    if best is None:
        return GangPlan((), None, largest)
    return best


def place_members(
    decider: Decider, request: PodRequest, count: int, nodes: Sequence[str]
) -> tuple[list[Placement], float]:
    """(the placements of up to `count` members among `nodes`, one after another, their summed score);
    stops at the first member that does not fit. The inventory is left as it was."""
    inventory = decider.inventory
    mask = np.zeros(inventory.size, dtype=np.bool_)
    rows = [row for node in nodes if (row := inventory.index.get(node)) is not None]
    mask[rows] = True
    placements: list[Placement] = []
    score = 0.0
    try:
        for _ in range(count):
            decision = decider.look(request, mask)
            placement = decision.placement
            if placement is None:
                break
            score += decision.score_of(inventory.index[placement.node]) or 0.0
            inventory.commit(placement)
            placements.append(placement)
    finally:
        for placement in reversed(placements):
            inventory.release(placement)
    return placements, score


def describe_request(request: PodRequest) -> str:
    """What one member asks for, as reasons word it: '8 GPUs', '500 milli of a GPU', '1g.10gb x2', 'CPU and memory'."""
    if request.kind == Kind.WHOLE:
        text = f"{request.gpus} GPU" + ("s" if request.gpus > 1 else "")
    elif request.kind == Kind.SHARE:
        text = f"{request.milli} milli of a GPU"
    elif request.kind == Kind.MIG:
        text = " + ".join(f"{profile} x{count}" if count > 1 else profile for profile, count in request.mig)
    else:
        return "CPU and memory"
    products = sorted(request.allowed_products or ())
    return f"{text} ({' or '.join(products)})" if products else text
