"""The `priority` protocol: high-priority pods arriving into a full cluster, and who gets evicted (#28 item 3).

A run fills the cluster with low-priority pods, then keeps submitting; a share of the later pods
(`PriorityConfig.high_fraction`) are high priority. A high-priority pod that fits nowhere preempts: a
victim chooser picks one node and the lower-priority pods to evict there; they are evicted at once (no
grace period), then the preemptor is placed on that node by gpupack's own rules (`Decider.decide` on that
node alone) or not at all. Evicted pods are lost (not resubmitted); a pod that is not placed is dropped
(one attempt per pod, as in the `fgd` protocol), so a high-priority pod is either placed or left pending.

Two victim choosers, run on the same seed (same submission order, same high-priority pods):

- `gpupack`: `scoring.preemption.plan_victims` on each node of the walk; the cheapest plan over the
  nodes by `plan_cost` (ties: the earlier node of the walk).
- `count`: kube-scheduler's DefaultPreemption today (`SelectVictimsOnNode`): remove every lower-priority
  pod, check the pod fits *by counts* (`count_fits`), then reprieve pods in importance order (priority high
  to low, then the earliest started first) while the count fit holds; among nodes, `pickOneNodeForPreemption`:
  fewest PDB violations (none here), lowest highest-victim priority, lowest priority sum, fewest victims,
  latest start of the highest-priority victims, then the earlier node of the walk.

The walk is kube-scheduler's `DryRunPreemption`: the nodes where preemption might help (the pod's product
and GPU kind, `eligible`), from a seeded random offset, until `max(10 % of them, 100)` candidates with at
least one victim are found. Both choosers first skip nodes where even evicting every lower-priority pod
does not make the count fit: counts are necessary for any placement, so this only saves time.

Counts (what `count_fits` checks, as a counting scheduler sees a node): CPU, memory and pod slots, and GPU
capacity pooled over the node in integer units: 1000 per GPU (a whole GPU takes 1000, a share its milli)
on nodes without MIG; compute slices on MIG nodes (a 3g instance takes 3 of a GPU's 7), whatever GPU or
start they sit on. That is the view in which seven 1g slices on two GPUs make room for a 3g.

Metrics per run (`PriorityResult`): high-priority pods placed at once, placed after preemption, pending;
evictions; wasted evictions (victims evicted while the preemptor still did not fit on their node) and
the preemptions that wasted them; evictions per placed high-priority pod.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from gpupack.scoring.cost import placement_gpus
from gpupack.scoring.decider import Decider
from gpupack.scoring.facts import MigMode, NodeFacts, Placement
from gpupack.scoring.geometry import SHAPE_COMPUTE, MigFamily, resolve_profile
from gpupack.scoring.gpu_models import lookup_model
from gpupack.scoring.policies import PolicySpec
from gpupack.scoring.preemption import Occupant, plan_cost, plan_victims
from gpupack.scoring.request import MILLI_PER_GPU, Kind, PodRequest
from gpupack.sim.simulate import build_inventory, requested_gpus
from gpupack.sim.workload import Trace, TracePod, gpu_count

PRIORITY_OFFSET = 2**31  # kube-scheduler sums priority + MaxInt32 + 1 per victim, so every term is positive


class Chooser(StrEnum):
    """Who picks the victims of a preemption."""

    GPUPACK = "gpupack"  # scoring.preemption.plan_victims, cheapest plan by plan_cost
    COUNT = "count"  # kube-scheduler's DefaultPreemption, counting resources


@dataclass(frozen=True)
class PriorityConfig:
    """The protocol's settings: how much fills the cluster, how much arrives after, and how much of it is
    high priority. Demands are arrived GPUs over the cluster's GPUs (`requested_gpus`)."""

    high_fraction: float = 0.1  # of the pods arriving after the fill
    fill: float = 1.0  # arrived demand submitted as low priority first
    low_priority: int = 0
    high_priority: int = 1000
    candidates_pct: int = 10  # kube-scheduler's minCandidateNodesPercentage
    candidates_min: int = 100  # and minCandidateNodesAbsolute

    def __post_init__(self) -> None:
        if not 0.0 <= self.high_fraction <= 1.0:
            raise ValueError(f"priority: high_fraction must be in 0..1, got {self.high_fraction}")
        if self.fill < 0 or self.high_priority <= self.low_priority:
            raise ValueError(f"priority: fill must not be negative, high above low priority: {self}")


@dataclass(frozen=True)
class Arrival:
    """One pod of the run, with its priority."""

    pod: TracePod
    priority: int


def priority_arrivals(
    order: Sequence[TracePod], gpus: int, seed: int, config: PriorityConfig = PriorityConfig()
) -> list[Arrival]:
    """`order` with priorities: low until the arrived demand reaches `config.fill` x `gpus`, then each pod
    high with probability `config.high_fraction` (drawn from a generator of its own, seeded by `seed`)."""
    rng = np.random.default_rng((seed, 28))
    draws = rng.random(len(order))
    arrived = 0.0
    out: list[Arrival] = []
    for pod, draw in zip(order, draws.tolist(), strict=True):
        high = arrived >= config.fill * gpus and draw < config.high_fraction
        out.append(Arrival(pod, config.high_priority if high else config.low_priority))
        arrived += requested_gpus(pod.request)
    return out


def drawn_order(pods: Sequence[TracePod], gpus: int, seed: int, ratio: float) -> list[TracePod]:
    """Pods drawn uniformly with replacement from the name-sorted `pods` (seeded), each under a name of its
    own, until the arrived demand reaches `ratio` x `gpus` (for a mix without milli demand, e.g. MIG pods,
    which `protocol.fgd_order` cannot tune)."""
    originals = sorted(pods, key=lambda p: p.name)
    if not any(requested_gpus(p.request) > 0 for p in originals):
        raise ValueError("priority: no pod of the mix asks for a GPU")
    rng = np.random.default_rng(seed)
    order: list[TracePod] = []
    arrived = 0.0
    while arrived < ratio * gpus:
        pod = originals[int(rng.integers(len(originals)))]
        order.append(pod.clone(f"{pod.name}-prio-{len(order)}"))
        arrived += requested_gpus(pod.request)
    return order


# ----------------------------------------------------------------------------- counts
def _family(node: NodeFacts) -> MigFamily | None:
    """The node's MIG family when its GPUs are partitioned, else None."""
    if node.mig_mode == MigMode.NONE:
        return None
    return lookup_model(node.gpu_product, node.gpu_memory_mib or None).mig_family


def gpu_units_capacity(node: NodeFacts) -> int:
    """The node's pooled GPU capacity in count units: compute slices on MIG nodes, else 1000 per GPU."""
    family = _family(node)
    return node.gpu_count * (family.compute_total if family else MILLI_PER_GPU)


def gpu_units_of_placement(node: NodeFacts, placement: Placement) -> int:
    """Count units a placement holds: compute slices of its MIG instances, milli of its share, 1000 per GPU."""
    family = _family(node)
    total = 0
    for slot in placement.slots:
        if slot.mig:
            if family is None:
                raise ValueError(f"node {node.name} has no MIG geometry for {slot.mig}")
            total += int(SHAPE_COMPUTE[resolve_profile(family, slot.mig)[0]])
        else:
            total += slot.milli or MILLI_PER_GPU
    return total


def gpu_units_of_request(node: NodeFacts, request: PodRequest) -> int | None:
    """Count units `request` needs on `node`; None when the node cannot serve its kind at all (see `eligible`)."""
    family = _family(node)
    if request.kind == Kind.NONE:
        return 0
    if request.kind == Kind.MIG:
        if family is None:
            return None
        try:
            return sum(int(SHAPE_COMPUTE[resolve_profile(family, p)[0]]) * n for p, n in request.mig)
        except KeyError:
            return None
    if family is not None or node.gpu_count == 0:
        return None
    if request.kind == Kind.WHOLE:
        return request.gpus * MILLI_PER_GPU if request.gpus <= node.gpu_count else None
    return request.milli


def eligible(node: NodeFacts, request: PodRequest) -> bool:
    """Whether preemption might help on `node` at all: the pod's product constraint, its GPU kind (MIG
    profiles of the node's family, or whole GPUs and shares on a node without MIG), and the node's size.
    kube-scheduler leaves out such nodes (UnschedulableAndUnresolvable) before any dry run."""
    allowed = request.allowed_products
    if request.kind != Kind.NONE and allowed is not None and node.gpu_product not in allowed:
        return False
    return (
        gpu_units_of_request(node, request) is not None
        and request.cpu_milli <= node.cpu_milli
        and request.memory_bytes <= node.memory_bytes
    )


# ----------------------------------------------------------------------------- the cluster
@dataclass(frozen=True)
class Running:
    """A pod bound in the run: what it asked for, where it sits, when it started (its arrival index)."""

    name: str
    request: PodRequest
    placement: Placement
    priority: int
    start: int
    gpu_units: int  # count units it holds on its node


@dataclass
class NodeState:
    """One node's pods and what is free on it by counts."""

    facts: NodeFacts
    cpu_free: int
    memory_free: int
    pods_free: int
    gpu_units_free: int
    pods: dict[str, Running] = field(default_factory=dict)

    def count_fits(self, request: PodRequest, freed: Sequence[Running] = ()) -> bool:
        """Whether `request` fits by counts once `freed` (pods of this node) are gone."""
        need = gpu_units_of_request(self.facts, request)
        return (
            need is not None
            and request.cpu_milli <= self.cpu_free + sum(p.request.cpu_milli for p in freed)
            and request.memory_bytes <= self.memory_free + sum(p.request.memory_bytes for p in freed)
            and self.pods_free + len(freed) >= 1
            and need <= self.gpu_units_free + sum(p.gpu_units for p in freed)
        )


class Cluster:
    """The inventory and the pods bound in it, by node; binds and evicts keep both in step."""

    def __init__(self, nodes: Sequence[NodeFacts]) -> None:
        self.inventory = build_inventory(list(nodes))
        self.nodes = {n.name: NodeState(n, n.cpu_milli, n.memory_bytes, n.pods, gpu_units_capacity(n)) for n in nodes}
        self.order = [n.name for n in nodes]

    def bind(self, name: str, request: PodRequest, placement: Placement, priority: int, start: int) -> None:
        node = self.nodes[placement.node]
        self.inventory.commit(placement)
        running = Running(name, request, placement, priority, start, gpu_units_of_placement(node.facts, placement))
        node.pods[name] = running
        node.cpu_free -= placement.cpu_milli
        node.memory_free -= placement.memory_bytes
        node.pods_free -= placement.pod_slots
        node.gpu_units_free -= running.gpu_units

    def evict(self, running: Running) -> None:
        node = self.nodes[running.placement.node]
        self.inventory.release(running.placement)
        del node.pods[running.name]
        node.cpu_free += running.placement.cpu_milli
        node.memory_free += running.placement.memory_bytes
        node.pods_free += running.placement.pod_slots
        node.gpu_units_free += running.gpu_units

    def occupants(self, node: str, now: int) -> list[Occupant]:
        """The node's pods as `scoring.preemption` sees them (no PodDisruptionBudgets in the simulator;
        interruptible from the request, e.g. openb's BE pods; GPU-time lost = GPUs held x time run)."""
        return [
            Occupant(
                uid=p.name,
                key=f"default/{p.name}",
                placement=p.placement,
                priority=p.priority,
                interruptible=p.request.interruptible,
                breaks_budget=False,
                gpu_seconds=placement_gpus(self.inventory, p.placement) * float(now - p.start),
            )
            for p in self.nodes[node].pods.values()
        ]


# ----------------------------------------------------------------------------- victim choice
@dataclass(frozen=True)
class Choice:
    """The node a chooser picked and the pods it evicts there."""

    node: str
    victims: tuple[Running, ...]


def count_victims(node: NodeState, request: PodRequest, priority: int) -> tuple[Running, ...] | None:
    """kube-scheduler's SelectVictimsOnNode by counts: every lower-priority pod out, the count fit checked,
    then pods reprieved most important first (priority high to low, earlier start first) while it holds.
    None when the count fit fails even with all of them gone, or holds with none of them gone."""
    lower = [p for p in node.pods.values() if p.priority < priority]
    if not lower or not node.count_fits(request, lower):
        return None
    victims = list(lower)
    for pod in sorted(lower, key=lambda p: (-p.priority, p.start)):
        rest = [v for v in victims if v is not pod]
        if node.count_fits(request, rest):
            victims = rest
    return tuple(victims) or None


def _count_node_key(victims: tuple[Running, ...], walk_index: int) -> tuple[int, int, int, int, int]:
    """pickOneNodeForPreemption's order (no PDBs): lowest highest-victim priority, lowest priority sum,
    fewest victims, latest start of the highest-priority victims, then the earlier node of the walk."""
    top = max(v.priority for v in victims)
    earliest_top = min(v.start for v in victims if v.priority == top)
    total = sum(v.priority + PRIORITY_OFFSET for v in victims)
    return (top, total, len(victims), -earliest_top, walk_index)


def walk(cluster: Cluster, request: PodRequest, rng: np.random.Generator) -> Iterator[NodeState]:
    """DryRunPreemption's order: the nodes where preemption might help, from a random offset, wrapping."""
    nodes = [cluster.nodes[name] for name in cluster.order if eligible(cluster.nodes[name].facts, request)]
    if not nodes:
        return
    offset = int(rng.integers(len(nodes)))
    for i in range(len(nodes)):
        yield nodes[(offset + i) % len(nodes)]


def candidate_limit(eligible_nodes: int, config: PriorityConfig) -> int:
    """How many candidates the dry run collects: max(pct % of the nodes, min), at most every node."""
    return min(eligible_nodes, max(eligible_nodes * config.candidates_pct // 100, config.candidates_min))


def choose(
    chooser: Chooser,
    cluster: Cluster,
    decider: Decider,
    request: PodRequest,
    priority: int,
    now: int,
    rng: np.random.Generator,
    config: PriorityConfig,
) -> Choice | None:
    """The node and victims `chooser` picks for a preemptor that fits nowhere; None: no node helps."""
    nodes = list(walk(cluster, request, rng))
    limit = candidate_limit(len(nodes), config)
    found: list[tuple[tuple, Choice]] = []
    for i, node in enumerate(nodes):
        if len(found) >= limit:
            break
        lower = [p for p in node.pods.values() if p.priority < priority]
        if not lower or not node.count_fits(request, lower):
            continue  # not even evicting everything would do, by counts (and so by placement)
        if chooser == Chooser.COUNT:
            victims = count_victims(node, request, priority)
            if victims:
                found.append((_count_node_key(victims, i), Choice(node.facts.name, victims)))
            continue
        name = node.facts.name
        plan = plan_victims(decider, request, name, priority, cluster.occupants(name, now))
        if plan is not None and plan.victims:
            chosen = tuple(node.pods[o.uid] for o in plan.victims)
            found.append(((plan_cost(plan.victims), i), Choice(name, chosen)))
    if not found:
        return None
    return min(found, key=lambda item: item[0])[1]


# ----------------------------------------------------------------------------- the run
@dataclass
class PriorityResult:
    """One seed, one chooser: what the high-priority pods got and what it cost the others."""

    seed: int
    chooser: str
    pods_submitted: int = 0
    high_submitted: int = 0
    high_placed_at_once: int = 0  # fitted without preemption
    high_placed_by_preemption: int = 0
    high_pending: int = 0  # not placed, with or without victims
    preemptions: int = 0  # victims evicted for a preemptor
    evictions: int = 0
    wasted_preemptions: int = 0  # victims evicted and the preemptor still did not fit
    wasted_evictions: int = 0
    no_node: int = 0  # no node where evicting would help
    seconds: float = 0.0
    cluster: Cluster | None = field(default=None, repr=False)  # the final state (not in the JSON)

    @property
    def high_placed(self) -> int:
        return self.high_placed_at_once + self.high_placed_by_preemption

    @property
    def evictions_per_placed_high(self) -> float:
        """Evictions over the high-priority pods placed (0 when none was placed)."""
        return self.evictions / self.high_placed if self.high_placed else 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "seed": self.seed,
            "chooser": self.chooser,
            "pods_submitted": self.pods_submitted,
            "high_submitted": self.high_submitted,
            "high_placed": self.high_placed,
            "high_placed_at_once": self.high_placed_at_once,
            "high_placed_by_preemption": self.high_placed_by_preemption,
            "high_pending": self.high_pending,
            "preemptions": self.preemptions,
            "evictions": self.evictions,
            "evictions_per_placed_high": round(self.evictions_per_placed_high, 4),
            "wasted_preemptions": self.wasted_preemptions,
            "wasted_evictions": self.wasted_evictions,
            "no_node": self.no_node,
            "seconds": round(self.seconds, 3),
        }


def preempt(
    cluster: Cluster, decider: Decider, choice: Choice, request: PodRequest, result: PriorityResult
) -> Placement | None:
    """Evict `choice`'s victims, then place the preemptor on its node by gpupack's rules or not at all;
    the accounting: evictions always, wasted evictions exactly when the victims went and it did not fit."""
    for victim in choice.victims:
        cluster.evict(victim)
    result.preemptions += 1
    result.evictions += len(choice.victims)
    decision = decider.decide(request, ([choice.node],), observe=False)
    if decision.placement is None:
        result.wasted_preemptions += 1
        result.wasted_evictions += len(choice.victims)
    return decision.placement


def run_priority(
    trace: Trace,
    order: Sequence[TracePod],
    policy: PolicySpec,
    chooser: Chooser,
    seed: int,
    config: PriorityConfig = PriorityConfig(),
) -> PriorityResult:
    """One seed of the protocol (module docstring): `order` submitted one pod at a time, priorities from
    `priority_arrivals`, preemption for high-priority pods that fit nowhere."""
    started = time.perf_counter()
    cluster = Cluster(trace.nodes)
    decider = Decider.seeded(cluster.inventory, policy, seed)
    walk_rng = np.random.default_rng((seed, 29))
    result = PriorityResult(seed, str(chooser))
    for now, arrival in enumerate(priority_arrivals(order, gpu_count(trace.nodes), seed, config)):
        pod, high = arrival.pod, arrival.priority > config.low_priority
        result.pods_submitted += 1
        result.high_submitted += high
        placement = decider.decide(pod.request).placement
        if placement is None and high:
            choice = choose(chooser, cluster, decider, pod.request, arrival.priority, now, walk_rng, config)
            if choice is None:
                result.no_node += 1
            else:
                placement = preempt(cluster, decider, choice, pod.request, result)
                result.high_placed_by_preemption += placement is not None
        elif placement is not None and high:
            result.high_placed_at_once += 1
        if placement is not None:
            cluster.bind(pod.name, pod.request, placement, arrival.priority, now)
        elif high:
            result.high_pending += 1
    result.seconds = time.perf_counter() - started
    result.cluster = cluster
    return result
