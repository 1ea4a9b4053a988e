"""Cost at equal risk (#16 items 1-2): gpupack against baselines run with the spot practice people use.

How clusters run spot today: spot nodes carry a taint that only interruptible pods tolerate, and those
pods prefer spot by a preferred node affinity. Here that is `SpotPractice.TAINT`: a non-interruptible
pod is offered the on-demand nodes only; an interruptible one the spot nodes first (a strong
preference: kube-scheduler's affinity term outweighs its spreading score), then every node. gpupack
runs under the same practice (default weights, and the cost profile below), with its own rule
`nonInterruptibleOnSpot: forbid` instead, and with its default `avoid`; the plain baselines, which
ignore capacity type, are kept beside for reference.

Per run (the cost cluster, openb `default` pods with `qos: BE` interruptible, FGD order to `load` x
GPU capacity): busy-node $/h (nodes holding a pod), allocation %, and the risk: GPUs of
non-interruptible pods on spot (GPU-hours per hour). Then a share of the pods departs at random and
the nodes left empty — releasable at once, scale-to-zero readiness — are counted with their $/h.

Every policy goes through the one `Decider` (scoring.decider, the extender's decision, seeded as the simulator
seeds it); the candidate masks are the taints.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from gpupack.scoring.cost import placement_gpus
from gpupack.scoring.decider import Decider
from gpupack.scoring.facts import Placement
from gpupack.scoring.inventory import Inventory
from gpupack.scoring.policies import GpupackArgs, GpupackWeights, PolicySpec, gpupack
from gpupack.sim.protocol import fgd_order
from gpupack.sim.simulate import build_inventory, make_policy
from gpupack.sim.workload import Trace, TracePod, gpu_milli_capacity

DEPARTING = 0.3  # share of the placed pods that leave before empty nodes are counted


class SpotPractice(StrEnum):
    """How spot capacity is kept from non-interruptible pods."""

    NONE = "none"  # capacity type ignored (today's baselines)
    TAINT = "taint"  # spot tainted; interruptible pods tolerate and prefer it
    POLICY = "policy"  # the policy's own rule (gpupack)


@dataclass(frozen=True)
class CostPolicy:
    """A policy and the spot practice it runs with, under a display name."""

    name: str
    policy: str  # a `make_policy` name
    practice: SpotPractice
    forbid_spot: bool = False  # gpupack: nonInterruptibleOnSpot forbid instead of avoid
    weights: tuple[tuple[str, float], ...] = ()  # gpupack: weights other than the defaults

    def spec(self, pods: Sequence[TracePod]) -> PolicySpec:
        if self.policy == "gpupack":
            weights = GpupackWeights(**dict(self.weights))
            return gpupack(GpupackArgs(weights=weights, forbid_spot_for_non_interruptible=self.forbid_spot))
        return make_policy(self.policy, list(pods))


# gpupack's weights for a cost-first cluster, chosen on seeds 0-7 (never on the reported 42-51) among nine
# sets by a rule fixed beforehand: most (load, seed) pairs at loads 0.6 and 1.0 cheaper than both taint
# baselines at allocation no lower than best-fit's; ties to the set never dearer than best-fit.
COST_PROFILE = (("price", 10.0), ("packing", 0.5), ("order", 1.0))
CONTENDER = "gpupack cost profile + taint"
COST_POLICIES: tuple[CostPolicy, ...] = (
    CostPolicy(CONTENDER, "gpupack", SpotPractice.TAINT, weights=COST_PROFILE),
    CostPolicy("gpupack + taint", "gpupack", SpotPractice.TAINT),
    CostPolicy("gpupack (forbid)", "gpupack", SpotPractice.POLICY, forbid_spot=True),
    CostPolicy("kube-default + taint", "kube-default", SpotPractice.TAINT),
    CostPolicy("best-fit + taint", "best-fit", SpotPractice.TAINT),
    CostPolicy("gpupack (avoid)", "gpupack", SpotPractice.POLICY),
    CostPolicy("kube-default", "kube-default", SpotPractice.NONE),
    CostPolicy("best-fit", "best-fit", SpotPractice.NONE),
)
ZERO_RISK = tuple(p.name for p in COST_POLICIES[:5])  # no non-interruptible pod can land on spot
BASELINES_AT_ZERO_RISK = ("kube-default + taint", "best-fit + taint")


def candidate_masks(inventory: Inventory, pod: TracePod, practice: SpotPractice) -> list[np.ndarray | None]:
    """The node sets a pod is offered, in order (None: every node)."""
    if practice != SpotPractice.TAINT:
        return [None]
    n = inventory.size
    active, spot = inventory.node_active[:n], inventory.node_spot[:n]
    if pod.request.interruptible:
        return [active & spot, active.copy()]
    return [active & ~spot]


@dataclass
class CostRun:
    """One policy, seed and load: what it costs, risks and leaves releasable."""

    policy: str
    seed: int
    load: float
    pods_placed: int = 0
    alloc_pct: float = 0.0
    busy_nodes: int = 0
    busy_cost_per_hour: float = 0.0
    cluster_cost_per_hour: float = 0.0
    firm_pods_on_spot_pct: float = 0.0
    firm_gpus_on_spot: float = 0.0  # non-interruptible GPU-hours on spot, per hour
    flexible_gpus_on_spot_pct: float = 0.0
    after_departures: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    def to_json(self) -> dict[str, object]:
        return dict(self.__dict__)


def fill(
    trace: Trace, order: Sequence[TracePod], policy: CostPolicy, seed: int
) -> tuple[Inventory, dict[str, tuple[TracePod, Placement]]]:
    """Place `order` one pod at a time with the policy's practice; failures are dropped."""
    inventory = build_inventory(trace.nodes)
    decider = Decider.seeded(inventory, policy.spec(trace.pods), seed)
    placed: dict[str, tuple[TracePod, Placement]] = {}
    for pod in order:
        placement = decider.decide(pod.request, candidate_masks(inventory, pod, policy.practice)).placement
        if placement is not None:
            inventory.commit(placement)
            placed[pod.name] = (pod, placement)
    return inventory, placed


def measure(inventory: Inventory, placed: dict[str, tuple[TracePod, Placement]]) -> dict[str, float]:
    """Busy nodes and their $/h, allocation, and where the pods sit by capacity type."""
    n = inventory.size
    busy = [row for row in range(n) if inventory.node_active[row] and not inventory.node_is_empty(row)]
    prices = np.nan_to_num(inventory.node_price[:n], nan=0.0)
    allocated = firm_on_spot = flexible = flexible_on_spot = 0.0
    firm_pods = firm_pods_on_spot = 0
    for pod, placement in placed.values():
        gpus = placement_gpus(inventory, placement)
        allocated += gpus
        on_spot = bool(inventory.node_spot[inventory.index[placement.node]])
        if pod.request.interruptible:
            flexible += gpus
            flexible_on_spot += gpus * on_spot
        else:
            firm_on_spot += gpus * on_spot
            firm_pods += 1
            firm_pods_on_spot += on_spot
    busy_rows = set(busy)
    empty = [r for r in range(n) if inventory.node_active[r] and inventory.node_gpu_count[r] and r not in busy_rows]
    return {
        "busy_nodes": len(busy),
        "busy_cost_per_hour": round(float(prices[busy].sum()), 2),
        "cluster_cost_per_hour": round(float(prices[inventory.node_active[:n]].sum()), 2),
        "firm_pods_on_spot_pct": round(100 * firm_pods_on_spot / firm_pods, 2) if firm_pods else 0.0,
        "alloc_pct": round(100 * allocated / max(inventory.gpus_total(), 1), 3),
        "firm_gpus_on_spot": round(firm_on_spot, 3),
        "flexible_gpus_on_spot_pct": round(100 * flexible_on_spot / flexible, 2) if flexible else 0.0,
        "empty_nodes": len(empty),
        "empty_cost_per_hour": round(float(prices[empty].sum()), 2),
    }


def depart(inventory: Inventory, placed: dict[str, tuple[TracePod, Placement]], share: float, seed: int) -> None:
    """Release a random `share` of the placed pods (seeded: the same draw for every policy of a seed)."""
    rng = np.random.default_rng(seed + 7919)
    names = sorted(placed)
    leaving = {names[i] for i in rng.permutation(len(names))[: int(share * len(names))]}
    for name in sorted(leaving):
        inventory.release(placed.pop(name)[1])


def policy_named(name: str) -> CostPolicy:
    """The COST_POLICIES entry called `name`; ValueError for another name."""
    for policy in COST_POLICIES:
        if policy.name == name:
            return policy
    raise ValueError(f"no cost policy {name!r}; choose from {', '.join(p.name for p in COST_POLICIES)}")


def run(trace: Trace, policy: CostPolicy, seed: int, load: float) -> CostRun:
    """One cost run: fill to `load`, measure, let DEPARTING of the pods go, count what is releasable."""
    started = time.perf_counter()
    order = fgd_order(trace.pods, gpu_milli_capacity(trace.nodes), seed, load)
    inventory, placed = fill(trace, order, policy, seed)
    now = measure(inventory, placed)
    result = CostRun(policy.name, seed, load, pods_placed=len(placed))
    for key in ("alloc_pct", "busy_nodes", "busy_cost_per_hour", "cluster_cost_per_hour", "firm_pods_on_spot_pct",
                "firm_gpus_on_spot", "flexible_gpus_on_spot_pct"):  # fmt: skip
        setattr(result, key, now[key])
    depart(inventory, placed, DEPARTING, seed)
    later = measure(inventory, placed)
    result.after_departures = {
        k: later[k] for k in ("busy_nodes", "busy_cost_per_hour", "empty_nodes", "empty_cost_per_hour")
    }
    result.seconds = round(time.perf_counter() - started, 3)
    return result


def sweep(
    trace: Trace,
    policies: Sequence[CostPolicy],
    seeds: Sequence[int],
    loads: Sequence[float],
    progress: Callable[[CostRun], None] | None = None,
) -> list[CostRun]:
    """Every policy x seed x load."""
    runs = []
    for load in loads:
        for seed in seeds:
            for policy in policies:
                runs.append(run(trace, policy, seed, load))
                if progress:
                    progress(runs[-1])
    return runs
