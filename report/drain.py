"""Which nodes could be emptied, and how: every pod moved by the scoring engine to another node.

Decided on a copy of the inventory, so nothing real is reserved. Nodes are tried least allocated
first, the dearer first among equals; a node is emptied when every one of its pods (DaemonSet pods
leave with the node) gets a placement elsewhere from the one `Decider` (scoring.decider) — the same
decision `filter` makes — on a node that is schedulable, not being emptied and not already empty. Then its
moves are kept and it saves its whole price; otherwise every move tried for it is undone.
Non-interruptible pods are never moved onto spot capacity. kube-scheduler's own filters (taints,
selectors beyond the GPU product) are not checked: the plan is a proposal to review.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from gpupack.scoring.decider import Decider
from gpupack.scoring.facts import Placement
from gpupack.scoring.inventory import Inventory
from gpupack.scoring.policies import PolicySpec
from gpupack.scoring.request import PodRequest

DEFAULT_LIMIT = 200  # nodes tried at most (a decision on a 5,000-node cluster takes milliseconds)


@dataclass(frozen=True)
class MovablePod:
    """A pod on a node, as the drain planner needs it."""

    key: str
    node: str
    placement: Placement
    gpus: float
    request: PodRequest | None  # None: gpupack cannot read it, so it cannot be moved
    daemon: bool = False  # a DaemonSet pod: it goes away with its node


@dataclass
class Move:
    """One pod to another node and GPUs."""

    pod: str
    to: str
    gpus: list[dict[str, int | str]]  # as in gpupack.io/assignment

    def to_json(self) -> dict[str, object]:
        return {"pod": self.pod, "to": self.to, "gpus": self.gpus}


@dataclass
class Drain:
    """A node that could be released, the $/h that saves, and the moves that empty it (none if empty)."""

    node: str
    saves_hourly: float
    moves: list[Move] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {"node": self.node, "saves_hourly": self.saves_hourly, "moves": [m.to_json() for m in self.moves]}


@dataclass
class DrainPlan:
    """The nodes to release, in order, and why each other node tried could not be emptied."""

    drains: list[Drain] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)

    @property
    def saves_hourly(self) -> float:
        return round(sum(d.saves_hourly for d in self.drains), 2)


def plan_drains(
    inventory: Inventory,
    pods: Sequence[MovablePod],
    schedulable: set[str],
    policy: PolicySpec,
    limit: int = DEFAULT_LIMIT,
) -> DrainPlan:
    """The drain plan of a cluster (see the module docstring); `inventory` is not changed."""
    scratch = copy.deepcopy(inventory)
    decider = Decider(scratch, policy)  # ties in row order, as in the service; `random` draws unseeded
    by_node: dict[str, list[MovablePod]] = {}
    for pod in pods:
        if pod.request is not None:
            decider.observe(pod.request)
        if not pod.daemon:
            by_node.setdefault(pod.node, []).append(pod)
    plan = DrainPlan()
    gpu_nodes = [n for n, row in scratch.index.items() if scratch.node_gpu_count[row] > 0]
    empty = [n for n in gpu_nodes if n not in by_node]
    plan.drains = [Drain(n, _price(scratch, n)) for n in sorted(empty, key=lambda n: -_price(scratch, n))]
    closed = set(empty)  # takes no pod: released, being emptied, or already taking moved pods
    targets = np.zeros(scratch.size, dtype=np.bool_)
    for name in schedulable - closed:
        row = scratch.index.get(name)
        if row is not None:
            targets[row] = True
    for node in _drain_order(scratch, by_node, gpu_nodes)[:limit]:
        if node in closed:
            continue
        moves, reason = _empty(decider, scratch, by_node[node], targets, node)
        if reason:
            plan.kept[node] = reason
            continue
        plan.drains.append(Drain(node, _price(scratch, node), moves))
        closed.add(node)
        targets[scratch.index[node]] = False
        for move in moves:  # a node taking moved pods is not emptied next (no chains of moves)
            closed.add(move.to)
    return plan


def _drain_order(inventory: Inventory, by_node: dict[str, list[MovablePod]], gpu_nodes: list[str]) -> list[str]:
    """Nodes holding pods, least allocated GPUs first, then dearest first, then by name."""
    held = {n: sum(p.gpus for p in by_node[n]) for n in gpu_nodes if n in by_node}
    return sorted(held, key=lambda n: (held[n], -_price(inventory, n), n))


def _empty(
    decider: Decider, inventory: Inventory, pods: list[MovablePod], targets: np.ndarray, node: str
) -> tuple[list[Move], str]:
    """Move every pod of `node` elsewhere (largest first); on failure undo and say why."""
    row = inventory.index[node]
    was_target = bool(targets[row])
    targets[row] = False
    committed: list[Placement] = []
    reason = ""
    for pod in sorted(pods, key=lambda p: (-p.gpus, p.key)):
        if pod.request is None:
            reason = f"pod {pod.key}: its request cannot be read, so it cannot be moved"
            break
        placement = decider.decide(pod.request, (targets,), observe=False).placement  # learnt above
        if placement is None:
            reason = f"pod {pod.key} fits on no other node"
            break
        inventory.commit(placement)
        committed.append(placement)
    if reason:
        for placement in committed:
            inventory.release(placement)
        targets[row] = was_target
        return [], reason
    for pod in pods:
        inventory.release(pod.placement)
    ordered = sorted(pods, key=lambda p: (-p.gpus, p.key))
    moves = [Move(p.key, c.node, [slot.to_json() for slot in c.slots]) for p, c in zip(ordered, committed, strict=True)]
    return moves, ""


def _price(inventory: Inventory, node: str) -> float:
    price = float(inventory.node_price[inventory.index[node]])
    return 0.0 if np.isnan(price) else round(price, 2)
