"""Which nodes could be released, and how: defrag's planner with its one goal of emptying nodes, priced.

GPU nodes with no pod (DaemonSet pods leave with the node) are released as they are, the dearer first.
The others are planned by `scoring.defrag` with `Goal.FREE_NODE` alone, on a copy of the inventory:
nodes holding the fewest GPUs first (the dearer first among equals), each emptied when every one of its
pods gets a placement elsewhere from the one `Decider` (scoring.decider), the decision `filter` makes, on a
node that is schedulable, not being emptied and not released; a node that takes moved pods is not emptied
afterwards. So the report proposes exactly the node moves the defrag controller would make, except that
here every pod gpupack can read may move (defrag moves only pods labelled `gpupack.io/movable`), with no
eviction budget. Non-interruptible pods are never moved onto spot capacity (`build.drain_policy`).
kube-scheduler's own filters (taints, selectors beyond the GPU product) are not checked: the plan is a
proposal to review.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpupack.scoring.defrag import Goal, Resident, plan_defrag
from gpupack.scoring.inventory import Inventory
from gpupack.scoring.policies import PolicySpec

DEFAULT_LIMIT = 200  # nodes tried at most (a decision on a 5,000-node cluster takes milliseconds)


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
    residents: Sequence[Resident],
    schedulable: Iterable[str],
    policy: PolicySpec,
    limit: int = DEFAULT_LIMIT,
) -> DrainPlan:
    """The drain plan of a cluster (see the module docstring), at most `limit` nodes with pods tried;
    `inventory` is not changed. Every resident may move unless it is a DaemonSet's or unreadable."""
    holding = {r.placement.node for r in residents if not r.daemon}
    empty = [n for n, row in inventory.index.items() if inventory.node_gpu_count[row] > 0 and n not in holding]
    empty.sort(key=lambda n: -_price(inventory, n))
    targets = set(schedulable).difference(empty)
    moves = plan_defrag(
        inventory, residents, (), targets, policy, (Goal.FREE_NODE,), max_evictions=len(residents), nodes_tried=limit
    )
    plan = DrainPlan([Drain(n, _price(inventory, n)) for n in empty], dict(moves.skipped))
    for move in moves.moves:
        steps = [Move(e.pod, e.to.node, [slot.to_json() for slot in e.to.slots]) for e in move.evictions]
        plan.drains.append(Drain(move.target, _price(inventory, move.target), steps))
    return plan


def _price(inventory: Inventory, node: str) -> float:
    return round(inventory.hourly_price(inventory.index[node]), 2)
