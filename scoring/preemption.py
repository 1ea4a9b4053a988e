"""Preemption: the cheapest set of pods on one node whose eviction lets a pod be placed there (#28).

kube-scheduler's DefaultPreemption picks victims by counting resources, which frees seven 1g slices
scattered over two GPUs for a 3g instance that needs four aligned ones, or 600 milli split over two GPUs
for a 500-milli share. Here a set of victims works only when gpupack's own placement rules place the
pod once they are gone: `Decider.look` over the node with the victims' placements released from the
live inventory (a legal MIG placement at a valid start, untouched GPUs for whole-GPU pods, a share on
one GPU, CPU, memory and a pod slot).

The rule (`plan_cost`, cheapest first): fewest PodDisruptionBudget violations; then the
non-interruptible victims' priorities, high to low; then every victim's priority, high to low; then
the fewest victims; then the least GPU-time lost. Priorities compare as tuples sorted high to low, so
the highest priority evicted counts most, and a plan whose priorities are the leading part of
another's (the same victims' priorities and more besides) is cheaper: the one with fewer victims.
Non-interruptible victims compare by their priorities, not their count: with no interruptible pod on
the node (the usual case) a count would put "fewest pods" before "lowest priorities". Pods of the
preemptor's priority or higher are never victims. Among plans of equal cost, the exact search takes
the placement the policy scores highest (for a GPU set, its NVLink rating).

Search: every eligible occupant released decides whether any plan exists (feasibility is monotone:
freeing more never hurts). Up to `EXACT_LIMIT` eligible occupants, best-first over subsets in cost
order (a subset's successors never cost less, so the first that fits is the cheapest and minimal),
skipping every subtree whose largest set does not free enough by count. Counting (`_Counts`) is a
necessary condition only: it spares the looks of sets that cannot fit, and every set chosen is looked
at. Above the limit, the shortest prefix in `victim_rank` order that fits, then a reprieve of the most
expensive victims whose return keeps the fit: feasible and minimal, not always the cheapest.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from gpupack.scoring.decider import Decider
from gpupack.scoring.facts import GpuSlot, MigMode, Placement
from gpupack.scoring.geometry import (
    MAX_FIT,
    SHAPE_COMPUTE,
    SHAPE_SIZE,
    MigFamily,
    canonical_profile,
    resolve_profile,
    slice_bits,
)
from gpupack.scoring.inventory import Inventory
from gpupack.scoring.request import MILLI_PER_GPU, Kind, PodRequest

# Exact search up to this many eligible occupants, greedy + reprieve above. Measured on the 2-core development
# box (CPU time, 20 random priority layouts each, one 8-GPU H100 node of a 100-node inventory): exact over 10
# eligible took 1.7-3.3 ms on average and at most 7.8 ms (2 x 500-milli shares per GPU and a 2-GPU pod;
# 2 x 3g per GPU and two 4g; 1g instances filling two GPUs and a 3g), over 12 at most 25 ms, over 16 at
# most 58 ms; greedy over 16 at most 3.4 ms. The verb answers up to ~100 candidate nodes in 4.5 s, 45 ms a
# node: 10 leaves that margin for worse layouts and a slower machine (the exact worst case doubles per pod).
EXACT_LIMIT = 10

Cost = tuple[int, tuple[int, ...], tuple[int, ...], int, float]


@dataclass(frozen=True)
class Occupant:
    """A pod on the node that preemption could evict."""

    uid: str
    key: str  # namespace/name
    placement: Placement  # what it holds in the Inventory now (committed there)
    priority: int  # spec.priority (0 when absent)
    interruptible: bool  # gpupack.io/interruptible: "true"
    breaks_budget: bool  # evicting it now would violate a PodDisruptionBudget
    # GPU-time lost if evicted: GPUs it holds (whole GPU = 1, share = milli/1000, MIG = slices/7 of its
    # GPU or the family's slice count) x seconds it has run
    gpu_seconds: float


@dataclass(frozen=True)
class VictimPlan:
    """The pods to evict on `node`, cheapest first by `victim_rank`, and where the preemptor goes then."""

    node: str
    victims: tuple[Occupant, ...]
    placement: Placement  # where the preemptor goes once the victims are gone (a legal placement)


def victim_rank(o: Occupant) -> tuple[bool, bool, int, float, str]:
    """One victim's cost, cheapest first: (breaks a budget, not interruptible, priority, GPU-seconds, key).

    Its order agrees with `plan_cost`'s: swapping a victim for one ranked after it never makes a plan
    cheaper (the exact search relies on it)."""
    return (o.breaks_budget, not o.interruptible, o.priority, o.gpu_seconds, o.key)


def plan_cost(victims: Iterable[Occupant]) -> Cost:
    """A set of victims' cost, compared as a tuple (cheapest first): (PDB violations, non-interruptible
    victims' priorities high to low, all priorities high to low, number of victims, GPU-seconds)."""
    chosen = list(victims)
    return (
        sum(v.breaks_budget for v in chosen),
        tuple(sorted((v.priority for v in chosen if not v.interruptible), reverse=True)),
        tuple(sorted((v.priority for v in chosen), reverse=True)),
        len(chosen),
        math.fsum(v.gpu_seconds for v in chosen),  # exact: the same whatever the victims' order
    )


def plan_victims(
    decider: Decider, request: PodRequest, node: str, preemptor_priority: int, occupants: Sequence[Occupant]
) -> VictimPlan | None:
    """The cheapest set of `occupants` whose eviction lets `request` be placed on `node`, by the rule of
    the module docstring; None when no set of pods below `preemptor_priority` does (or `node` is unknown).

    Works on `decider`'s live inventory (call it under the lock that guards it): occupants' placements
    are released and committed back while searching, and every one is back exactly as it was when this
    returns or raises. Raises ValueError for an occupant placed on another node, and the inventory's
    InventoryError for one whose placement is not committed there.
    """
    if node not in decider.inventory.index:
        return None
    stray = [o.key for o in occupants if o.placement.node != node]
    if stray:
        raise ValueError(f"plan_victims: occupants not on node {node}: {', '.join(stray)}")
    eligible = sorted((o for o in occupants if o.priority < preemptor_priority), key=victim_rank)
    trial = _Trial(decider, request, node, eligible)
    try:
        return trial.plan()
    finally:
        trial.restore()


class _Counts:
    """Counting, kept as what it is: a necessary condition, never a sufficient one (#28). A set of victims
    that does not free, by count, the CPU, memory and pod slot the request lacks, or whose GPUs could
    not hold it even counted generously (shares and whole GPUs by free milli per GPU; dynamic MIG by free
    compute and the instances each GPU's free slices could hold; static MIG by free instances of each
    profile), cannot fit: the search skips its look. A set that passes is looked at."""

    def __init__(self, inventory: Inventory, request: PodRequest, row: int, eligible: list[Occupant]) -> None:
        self.request = request
        free = (
            int(inventory.node_cpu_free[row]),
            int(inventory.node_mem_free[row]),
            int(inventory.node_pods_free[row]),
        )
        asked = (request.cpu_milli, request.memory_bytes, 1)
        self.lacking = [(k, a - f) for k, (a, f) in enumerate(zip(asked, free, strict=True)) if a > f]
        self.freed = [(o.placement.cpu_milli, o.placement.memory_bytes, o.placement.pod_slots) for o in eligible]
        self.gpus = _gpu_counts(inventory, request, row, [o.placement for o in eligible])

    def enough(self, subset: tuple[int, ...]) -> bool:
        """Whether releasing `subset` could let the request fit, by count."""
        for k, lacking in self.lacking:
            if sum(self.freed[i][k] for i in subset) < lacking:
                return False
        return self.gpus is None or self.gpus.enough(subset)


def _gpu_counts(
    inventory: Inventory, request: PodRequest, row: int, placements: list[Placement]
) -> _MilliCounts | _SliceCounts | _InstanceCounts | None:
    """The GPU side of `_Counts` for the request on node `row` (None: GPUs not counted)."""
    family = inventory.models[int(inventory.node_model[row])].mig_family
    mode = int(inventory.node_mig_mode[row])
    if request.kind in (Kind.WHOLE, Kind.SHARE):
        return _MilliCounts(inventory, request, row, placements)
    if request.kind != Kind.MIG or family is None:
        return None
    shapes = []
    for profile, count in request.mig:
        try:
            shapes += [resolve_profile(family, profile)[0]] * count
        except KeyError:
            return None  # the node's model has no such profile: the look says so
    if mode == MigMode.DYNAMIC:
        return _SliceCounts(inventory, family, shapes, row, placements)
    if mode == MigMode.STATIC:
        return _InstanceCounts(inventory, request, row, placements)
    return None


class _MilliCounts:
    """Whole GPUs and shares: free milli per GPU, each victim's added back (a MIG instance counted as its
    whole GPU freed); whole GPUs need that many GPUs at 1000, a share one GPU with enough."""

    def __init__(self, inventory: Inventory, request: PodRequest, row: int, placements: list[Placement]) -> None:
        self.request = request
        self.free = [int(m) for m in inventory.gpu_milli_free[inventory.gpu_rows(row)]]
        self.freed = [[(s.index, s.milli or MILLI_PER_GPU) for s in p.slots] for p in placements]

    def enough(self, subset: tuple[int, ...]) -> bool:
        free = list(self.free)
        for i in subset:
            for g, milli in self.freed[i]:
                free[g] += milli
        if self.request.kind == Kind.WHOLE:
            return sum(f >= MILLI_PER_GPU for f in free) >= self.request.gpus
        return max(free, default=0) >= self.request.milli


class _SliceCounts:
    """Dynamic MIG: per GPU the occupied memory slices and compute in use, each victim's taken away (a
    GPU held whole or by a share counted free once any victim holds part of it); every requested shape
    needs instances that fit the free slices (`MAX_FIT`, summed over GPUs), and the compute must add up."""

    def __init__(
        self, inventory: Inventory, family: MigFamily, shapes: list[int], row: int, placements: list[Placement]
    ) -> None:
        rows = inventory.gpu_rows(row)
        self.total = family.compute_total
        self.slices = [int(m) for m in inventory.gpu_slices[rows]]
        self.compute = [int(c) for c in inventory.gpu_compute[rows]]
        self.blocked = [
            bool(w) or int(m) != MILLI_PER_GPU
            for w, m in zip(inventory.gpu_whole[rows], inventory.gpu_milli_free[rows], strict=True)
        ]
        self.shapes = sorted(set(shapes))
        self.wanted = {shape: shapes.count(shape) for shape in self.shapes}
        self.need = sum(int(SHAPE_COMPUTE[shape]) for shape in shapes)
        self.largest = max(int(SHAPE_COMPUTE[shape]) for shape in shapes)
        self.freed = [[self._freed(family, slot) for slot in p.slots] for p in placements]

    @staticmethod
    def _freed(family: MigFamily, slot: GpuSlot) -> tuple[int, int, int, bool]:
        """(GPU, slices, compute, frees a whole GPU or share) one slot gives back."""
        if not slot.mig:
            return slot.index, 0, 0, True
        try:
            shape = resolve_profile(family, slot.mig)[0]
        except KeyError:
            return slot.index, 0, 0, True  # not a valid instance: release raises before anything is counted
        return slot.index, slice_bits(int(SHAPE_SIZE[shape]), slot.start), int(SHAPE_COMPUTE[shape]), False

    def enough(self, subset: tuple[int, ...]) -> bool:
        slices, compute, blocked = list(self.slices), list(self.compute), list(self.blocked)
        for i in subset:
            for g, bits, used, plain in self.freed[i]:
                slices[g] &= ~bits
                compute[g] -= used
                blocked[g] = blocked[g] and not plain
        room = [self.total - c if not b else 0 for c, b in zip(compute, blocked, strict=True)]
        if sum(room) < self.need or max(room, default=0) < self.largest:
            return False
        for shape in self.shapes:
            fit = sum(int(MAX_FIT[shape, s]) for s, b in zip(slices, blocked, strict=True) if not b)
            if fit < self.wanted[shape]:
                return False
        return True


class _InstanceCounts:
    """Static MIG: the free instances of each requested profile, each victim's instances added back."""

    def __init__(self, inventory: Inventory, request: PodRequest, row: int, placements: list[Placement]) -> None:
        name = inventory.names[row]
        assert name is not None
        self.wanted = {canonical_profile(profile): count for profile, count in request.mig}
        free = [canonical_profile(s.mig) for s in inventory.free_slots(name) if s.mig]
        self.free = {profile: free.count(profile) for profile in self.wanted}
        self.freed = [[canonical_profile(s.mig) for s in p.slots if s.mig] for p in placements]

    def enough(self, subset: tuple[int, ...]) -> bool:
        free = dict(self.free)
        for i in subset:
            for profile in self.freed[i]:
                if profile in free:
                    free[profile] += 1
        return all(free[profile] >= count for profile, count in self.wanted.items())


@dataclass(frozen=True)
class _Fit:
    placement: Placement
    score: float


class _Trial:
    """The eligible occupants of one node, released in any subset (indices into `eligible`, which is in
    `victim_rank` order), and whether the request fits on the node then."""

    def __init__(self, decider: Decider, request: PodRequest, node: str, eligible: list[Occupant]) -> None:
        self.decider = decider
        self.request = request
        self.node = node
        self.eligible = eligible
        self.row = decider.inventory.index[node]
        self.mask = np.zeros(decider.inventory.size, dtype=np.bool_)
        self.mask[self.row] = True
        self.released: list[int] = []  # in the order released; what `restore` commits back
        self.fits: dict[tuple[int, ...], _Fit | None] = {}
        self.counts = _Counts(decider.inventory, request, self.row, eligible)

    def plan(self) -> VictimPlan | None:
        """The plan by the module's rule, or None."""
        everyone = tuple(range(len(self.eligible)))
        if self.fit(everyone) is None:
            return None
        chosen = self.cheapest() if len(everyone) <= EXACT_LIMIT else self.greedy()
        fit = self.fit(chosen)
        assert fit is not None  # both searches return a set that fits
        return VictimPlan(self.node, tuple(self.eligible[i] for i in chosen), fit.placement)

    def fit(self, subset: tuple[int, ...]) -> _Fit | None:
        """Where the request goes on the node with exactly `subset` released (None: it does not fit)."""
        if subset in self.fits:
            return self.fits[subset]
        if not self.counts.enough(subset):
            return None
        self._release_exactly(subset)
        decision = self.decider.look(self.request, self.mask)
        found = None
        if decision.placement is not None:
            found = _Fit(decision.placement, float(decision.scores[self.row]))
        self.fits[subset] = found
        return found

    def _release_exactly(self, subset: tuple[int, ...]) -> None:
        inventory = self.decider.inventory
        wanted = set(subset)
        for i in [i for i in self.released if i not in wanted]:
            inventory.commit(self.eligible[i].placement)
            self.released.remove(i)
        for i in subset:
            if i not in self.released:
                inventory.release(self.eligible[i].placement)  # raises, changing nothing, if not committed
                self.released.append(i)

    def restore(self) -> None:
        """Commit back every placement released."""
        while self.released:
            self.decider.inventory.commit(self.eligible[self.released[-1]].placement)
            self.released.pop()

    def cheapest(self) -> tuple[int, ...]:
        """Best-first over subsets in cost order: each subset's successors add the next occupant or swap
        its last for the next, which never costs less (`victim_rank`), so every subset comes once and
        the first that fits is the cheapest; then the equally cheap ones, for the best placement score."""
        n = len(self.eligible)
        heap: list[tuple[Cost, tuple[int, ...]]] = [(plan_cost(()), ())]
        best: tuple[Cost, float, tuple[int, ...]] | None = None
        while heap:
            cost, subset = heapq.heappop(heap)
            if best is not None and cost > best[0]:
                break
            # every set in this subtree is within the subset's others and the occupants from its last on
            if subset and not self.counts.enough((*subset[:-1], *range(subset[-1], n))):
                continue
            fit = self.fit(subset)
            if fit is not None and (best is None or fit.score > best[1]):
                best = (cost, fit.score, subset)
            last = subset[-1] if subset else -1
            if last + 1 < n:
                if fit is None:  # a set that fits is never extended: more victims cost more
                    self._push(heap, (*subset, last + 1))
                if subset:
                    self._push(heap, (*subset[:-1], last + 1))
        assert best is not None  # everyone released fits, and that set is in the search
        return best[2]

    def _push(self, heap: list[tuple[Cost, tuple[int, ...]]], subset: tuple[int, ...]) -> None:
        heapq.heappush(heap, (plan_cost(self.eligible[i] for i in subset), subset))

    def greedy(self) -> tuple[int, ...]:
        """The shortest prefix in `victim_rank` order that fits (bisected: feasibility is monotone), then
        each victim from the most expensive down put back where the rest still fit."""
        low, high = 0, len(self.eligible)  # the prefix of `high` fits
        while low < high:
            middle = (low + high) // 2
            if self.fit(tuple(range(middle))) is None:
                low = middle + 1
            else:
                high = middle
        victims = list(range(high))
        for i in reversed(range(high)):
            rest = tuple(v for v in victims if v != i)
            if self.fit(rest) is not None:
                victims = list(rest)
        return tuple(victims)
