"""Which pods to move, and only where a simulation shows the move helps (#31 item 1).

A move is a set of evictions with one goal, proven on a copy of the inventory with the one `Decider`
(scoring.decider), the decision `filter` makes:

- `Goal.PENDING`: a pending GPU pod that fits nowhere now. On each schedulable node the cheapest set of
  movable residents whose eviction lets it be placed there (`scoring.preemption.plan_victims`: gpupack's
  own placement rules, so aligned MIG slices and untouched GPUs, not counts); the pod's placement is then
  taken, and every evicted pod must be placed again elsewhere. The node whose move evicts fewest pods,
  then loses least GPU-time, wins.
- `Goal.FREE_GPU`: a GPU in use only by movable pods whose pods all fit on the cluster's other GPUs that
  are in use already (the GPU itself is blocked while they are placed), so that one more GPU is untouched,
  for a whole-GPU pod or the largest MIG profile. Least used GPUs first.
- `Goal.FREE_NODE`: a GPU node whose pods are all movable and fit on other nodes, so it can be scaled down.
  Nodes holding the fewest GPUs are tried first, the dearer first among equals. A node that takes pods
  of this plan's moves is not emptied afterwards (no chains of moves: a pod moves once). `gpupack report`'s
  drain plan is this goal alone, with every pod allowed to move (report.drain).

A move is kept only when every evicted pod is placed again and the goal is met on the copy afterwards
(the pending pod placed; one more untouched GPU, counted over the cluster; the node empty); its state is
then the one the next move is planned on. An evicted pod's new placement is where gpupack's filter puts
it when nothing else changes in between; the executor holds the freed capacity for a pending pod.
Pods that may not move (`Resident.unmovable`) are never evicted; nothing runs on the live inventory.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from gpupack.scoring.decider import Decider
from gpupack.scoring.defrag_goals import DEFAULT_MAX_EVICTIONS, Goal
from gpupack.scoring.facts import GpuSlot, Placement
from gpupack.scoring.inventory import MAX_GPUS, Inventory, InventoryError
from gpupack.scoring.policies import PolicySpec
from gpupack.scoring.preemption import Occupant, plan_victims
from gpupack.scoring.request import MILLI_PER_GPU, Kind, PodRequest

GPU_CANDIDATES = 64  # GPUs tried for Goal.FREE_GPU per plan, least used first


@dataclass(frozen=True)
class Resident:
    """A bound pod holding capacity: what it holds, its request, and why it may not move ("" : it may)."""

    key: str  # namespace/name
    placement: Placement
    request: PodRequest | None  # None: gpupack cannot read it, so it cannot be placed again
    unmovable: str = ""
    gpu_seconds: float = 0.0  # the GPU-time a restart loses: GPUs held x seconds run
    daemon: bool = False  # a DaemonSet's pod: it never moves, and leaves with its node


@dataclass(frozen=True)
class Pending:
    """A pending GPU pod gpupack would place."""

    key: str
    request: PodRequest


@dataclass(frozen=True)
class Eviction:
    """One pod evicted, and where the simulation placed it again."""

    pod: str
    node: str  # where it runs now
    to: Placement

    def to_json(self) -> dict[str, object]:
        return {"pod": self.pod, "from": self.node, "to": self.to.to_assignment()}


@dataclass(frozen=True)
class Move:
    """The evictions that meet one goal, what they gain, and what they cost."""

    goal: Goal
    target: str  # the pending pod's key, "node/gpu-N", or the node
    evictions: tuple[Eviction, ...]
    gain: str
    gpu_seconds: float  # restarted work
    placement: Placement | None = None  # Goal.PENDING: where the pending pod goes (the capacity to hold for it)

    def to_json(self) -> dict[str, object]:
        return {
            "goal": self.goal.value,
            "target": self.target,
            "gain": self.gain,
            "gpu_seconds": round(self.gpu_seconds, 1),
            "placement": self.placement.to_assignment() if self.placement else None,
            "evictions": [e.to_json() for e in self.evictions],
        }


@dataclass
class DefragPlan:
    """The moves, in the order to carry them out, and why each other target got none."""

    moves: list[Move] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def evictions(self) -> int:
        return sum(len(m.evictions) for m in self.moves)

    def to_json(self) -> dict[str, object]:
        return {
            "moves": [m.to_json() for m in self.moves],
            "evictions": self.evictions,
            "skipped": dict(sorted(self.skipped.items())),
        }


def plan_defrag(
    inventory: Inventory,
    residents: Sequence[Resident],
    pending: Sequence[Pending],
    schedulable: Iterable[str],
    policy: PolicySpec,
    goals: Iterable[Goal] = tuple(Goal),
    max_evictions: int = DEFAULT_MAX_EVICTIONS,
    nodes_tried: int | None = None,
) -> DefragPlan:
    """The moves for the cluster (module docstring), at most `max_evictions` evictions and, for
    `Goal.FREE_NODE`, at most `nodes_tried` nodes tried (None: all); `inventory` is not changed."""
    planner = _Planner(inventory, residents, schedulable, policy, max_evictions)
    wanted = set(goals)
    if Goal.PENDING in wanted:
        for pod in sorted(pending, key=lambda p: (-_gpus_asked(p.request), p.key)):
            planner.for_pending(pod)
    if Goal.FREE_GPU in wanted:
        planner.free_gpus()
    if Goal.FREE_NODE in wanted:
        planner.free_nodes(nodes_tried)
    return planner.plan


class _Planner:
    """The copy of the inventory moves are simulated on, the residents still where they were, the plan."""

    def __init__(
        self,
        inventory: Inventory,
        residents: Sequence[Resident],
        schedulable: Iterable[str],
        policy: PolicySpec,
        max_evictions: int,
    ) -> None:
        self.scratch = copy.deepcopy(inventory)
        self.decider = Decider(self.scratch, policy)
        for resident in residents:
            if resident.request is not None:
                self.decider.observe(resident.request)
        self.residents = {r.key: r for r in residents}  # a moved pod leaves: it is not moved twice
        self.by_node: dict[str, dict[str, Resident]] = {}  # the residents again, by node, in the same order
        for resident in residents:
            self.by_node.setdefault(resident.placement.node, {})[resident.key] = resident
        self.targets = np.zeros(self.scratch.size, dtype=np.bool_)
        for name in schedulable:
            row = self.scratch.index.get(name)
            if row is not None:
                self.targets[row] = True
        self.budget = max_evictions
        self.plan = DefragPlan()
        self.taking: dict[str, str] = {}  # node -> the target of the first move that placed a pod there

    # ------------------------------------------------------------------ goals
    def for_pending(self, pod: Pending) -> None:
        """The cheapest proven move that lets `pod` be placed, if it needs one."""
        if self.decider.decide(pod.request, (self.targets,), observe=False).placement is not None:
            self.plan.skipped[pod.key] = "fits now without a move"
            return
        best: tuple[tuple[int, float], Move] | None = None
        for node in self._target_nodes():
            move = self._pending_on(pod, node)
            if move is not None and len(move.evictions) <= self.budget:
                cost = (len(move.evictions), move.gpu_seconds)
                if best is None or cost < best[0]:
                    best = (cost, move)
        if best is None:
            self.plan.skipped[pod.key] = "no move of movable pods within the eviction budget lets it be placed"
            return
        self._apply(best[1])

    def free_gpus(self) -> None:
        """Empty GPUs in use only by movable pods, least used first, while each move frees one."""
        for node, gpu in self._gpu_candidates()[:GPU_CANDIDATES]:
            target = f"{node}/gpu-{gpu}"
            movers = [r for r in self._on(node) if any(s.index == gpu for s in r.placement.slots)]
            why = self._why_not_movable(movers)
            if why:
                self.plan.skipped[target] = why
                continue
            blocker = Placement(node, (GpuSlot(gpu),), pod_slots=0)
            before = self._untouched()
            move = self._proven(Goal.FREE_GPU, target, movers, blocker, None, functools.partial(self._gpu_gain, before))
            if isinstance(move, str):
                self.plan.skipped[target] = move
            else:
                self._apply(move)

    def free_nodes(self, nodes_tried: int | None) -> None:
        """Empty GPU nodes whose pods are all movable and fit elsewhere, the fewest GPUs in use first, the dearer
        first among equals; at most `nodes_tried` nodes (None: all)."""
        for node in self._free_node_order()[:nodes_tried]:
            if node in self.taking:
                self.plan.skipped[node] = f"takes pods of the move for {self.taking[node]}: a pod moves once"
                continue
            movers = self._movers_of(node)
            why = self._why_not_movable(movers)
            if why:
                self.plan.skipped[node] = why
                continue
            row = self.scratch.index[node]
            self.targets[row] = False
            move = self._proven(Goal.FREE_NODE, node, movers, None, None, functools.partial(self._node_gain, row))
            if isinstance(move, str):
                self.targets[row] = True
                self.plan.skipped[node] = move
            else:
                self._apply(move)  # an emptied node takes no pod of a later move

    def _free_node_order(self) -> list[str]:
        """Schedulable GPU nodes with pods to move: the fewest GPUs held first, then the dearest, then by name."""
        order: list[tuple[float, float, str]] = []
        for node in self._target_nodes():
            row = self.scratch.index[node]
            movers = self._movers_of(node)
            if movers and self.scratch.node_gpu_count[row] > 0:
                held = sum(_gpus_asked(r.request) for r in movers)
                order.append((held, -self.scratch.hourly_price(row), node))
        return [node for *_, node in sorted(order)]

    # ------------------------------------------------------------------ one move
    def _pending_on(self, pod: Pending, node: str) -> Move | None:
        """The proven move that places `pod` on `node`, or None."""
        movable = [r for r in self._on(node) if not r.unmovable and r.request is not None]
        if not movable:
            return None
        occupants = [Occupant(r.key, r.key, r.placement, 0, False, False, r.gpu_seconds) for r in movable]
        victims = plan_victims(self.decider, pod.request, node, 1, occupants)
        if victims is None:
            return None
        chosen = [self.residents[v.key] for v in victims.victims]
        move = self._proven(Goal.PENDING, pod.key, chosen, None, victims.placement, lambda: "the pod is placed")
        return None if isinstance(move, str) else move

    def _proven(
        self,
        goal: Goal,
        target: str,
        movers: Sequence[Resident],
        blocker: Placement | None,
        placement: Placement | None,
        gain: Callable[[], str],
    ) -> Move | str:
        """Simulate the move: evict `movers`, take `placement` (the pending pod's) and `blocker` (what must stay
        free), place every mover again. A move whose evictions all land and whose `gain` is met (a text), else
        why not, with the copy as it was. The copy keeps the move's state only through `_apply`."""
        if not movers:
            return "no pod to move"
        if len(movers) > self.budget:
            return f"{len(movers)} pods to move, more than the {self.budget} evictions left"
        for mover in movers:
            self.scratch.release(mover.placement)
        held = self._take([p for p in (placement, blocker) if p is not None])
        evictions = self._place_again(movers) if held is not None else "the capacity it must hold is taken already"
        if blocker is not None and held:
            self.scratch.release(blocker)
        outcome: Move | str = evictions if isinstance(evictions, str) else "the moves would not meet the goal"
        if not isinstance(evictions, str):
            won = gain()  # on the copy as after the move
            for eviction in evictions:
                self.scratch.release(eviction.to)
            if won:
                outcome = Move(goal, target, tuple(evictions), won, sum(m.gpu_seconds for m in movers), placement)
        if placement is not None and held:
            self.scratch.release(placement)
        for mover in movers:
            self.scratch.commit(mover.placement)
        return outcome

    def _take(self, pieces: Sequence[Placement]) -> list[Placement] | None:
        """Commit the pieces on the copy; None (none taken) when one does not fit, e.g. a hold of the live state."""
        taken: list[Placement] = []
        for piece in pieces:
            try:
                self.scratch.commit(piece)
            except InventoryError:
                for done in taken:
                    self.scratch.release(done)
                return None
            taken.append(piece)
        return taken

    def _place_again(self, movers: Sequence[Resident]) -> list[Eviction] | str:
        """Each mover placed again, largest first, committed on the copy; when one fits nowhere, all undone and
        which one."""
        evictions: list[Eviction] = []
        for mover in sorted(movers, key=lambda r: (-_gpus_asked(r.request), r.key)):
            assert mover.request is not None  # `_why_not_movable` / `_pending_on` keep unreadable pods out
            to = self.decider.decide(mover.request, (self.targets,), observe=False).placement
            if to is None:
                for eviction in evictions:
                    self.scratch.release(eviction.to)
                return f"pod {mover.key} fits nowhere else"
            self.scratch.commit(to)
            evictions.append(Eviction(mover.key, mover.placement.node, to))
        return evictions

    def _apply(self, move: Move) -> None:
        """Keep the move: the copy as after it, its pods out of the residents, the budget spent."""
        for eviction in move.evictions:
            resident = self.residents.pop(eviction.pod)
            del self.by_node[resident.placement.node][resident.key]
            self.scratch.release(resident.placement)
            self.scratch.commit(eviction.to)
            self.taking.setdefault(eviction.to.node, move.target)
        if move.placement is not None:
            self.scratch.commit(move.placement)
            self.taking.setdefault(move.placement.node, move.target)
        self.budget -= len(move.evictions)
        self.plan.moves.append(move)

    # ------------------------------------------------------------------ gains
    def _gpu_gain(self, before: int) -> str:
        """The gain of a move that left `after` untouched GPUs where `before` were, or "" when none."""
        after = self._untouched()
        return f"untouched GPUs {before} -> {after}" if after > before else ""

    def _node_gain(self, row: int) -> str:
        in_use = self.scratch.node_gpu_count[row] - self._untouched(row)
        return "" if in_use else "no GPU of the node in use: it can be released"

    def _untouched(self, only: int | None = None) -> int:
        """GPUs with nothing on them, on schedulable nodes (or on node row `only`)."""
        n = self.scratch.size
        nodes = self.targets[:n].copy()
        if only is not None:
            nodes[:] = False
            nodes[only] = True
        rows = np.repeat(nodes, MAX_GPUS)
        present = (np.arange(MAX_GPUS)[None, :] < self.scratch.node_gpu_count[:n, None]).ravel()
        grid = n * MAX_GPUS
        free = (
            (self.scratch.gpu_milli_free[:grid] == MILLI_PER_GPU)
            & ~self.scratch.gpu_whole[:grid]
            & (self.scratch.gpu_slices[:grid] == 0)
            & (self.scratch.gpu_static_used[:grid] == 0)
        )
        return int(np.count_nonzero(rows & present & free))

    # ------------------------------------------------------------------ reading the copy
    def _on(self, node: str) -> list[Resident]:
        return list(self.by_node.get(node, {}).values())

    def _movers_of(self, node: str) -> list[Resident]:
        """The node's residents that leave for it to be empty: all but its DaemonSets' pods."""
        return [r for r in self._on(node) if not r.daemon]

    def _target_nodes(self) -> list[str]:
        return sorted(name for name, row in self.scratch.index.items() if self.targets[row])

    def _why_not_movable(self, movers: Sequence[Resident]) -> str:
        for mover in movers:
            if mover.daemon:
                return f"pod {mover.key} is a DaemonSet's: it stays with its node"
            if mover.unmovable:
                return f"pod {mover.key} may not move: {mover.unmovable}"
            if mover.request is None:
                return f"pod {mover.key}: its request cannot be read"
        return ""

    def _gpu_candidates(self) -> list[tuple[str, int]]:
        """(node, GPU) of schedulable nodes in use by some resident, the least used first (`_slot_use`)."""
        used: dict[tuple[str, int], float] = {}
        for resident in self.residents.values():
            node = resident.placement.node
            if self.targets[self.scratch.index[node]]:
                for slot in resident.placement.slots:
                    used[(node, slot.index)] = used.get((node, slot.index), 0.0) + _slot_use(slot)
        return sorted(used, key=lambda key: (used[key], key))


def _gpus_asked(request: PodRequest | None) -> float:
    """GPUs a request asks for, for ordering: whole GPUs, a share's fraction, MIG instances' compute slices / 7."""
    if request is None:
        return 0.0
    if request.kind == Kind.WHOLE:
        return float(request.gpus)
    if request.kind == Kind.SHARE:
        return request.milli / MILLI_PER_GPU
    if request.kind == Kind.MIG:
        return sum(_compute_slices(profile) * count for profile, count in request.mig) / 7
    return 0.0


def _slot_use(slot: GpuSlot) -> float:
    """How much of its GPU a slot takes, for ordering: 1 whole, a share's fraction, a MIG instance's slices / 7."""
    if slot.mig:
        return _compute_slices(slot.mig) / 7
    return slot.milli / MILLI_PER_GPU if slot.milli else 1.0


def _compute_slices(profile: str) -> int:
    head = profile.split("g.", 1)[0]
    return int(head) if head.isdigit() else 1


__all__ = ["DEFAULT_MAX_EVICTIONS", "DefragPlan", "Eviction", "Goal", "Move", "Pending", "Resident", "plan_defrag"]
