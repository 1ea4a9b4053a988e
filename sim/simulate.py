"""The packing simulator: submit pods one at a time to the same engine the extender runs.

Protocols (docs/contracts.md#cli): `fgd` — seeded shuffle, tune to 130 % of GPU capacity, one attempt per
pod, failures dropped, allocation read at arrived = 100 % and 130 %; `replay` — file order, once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpupack.scoring import policies
from gpupack.scoring.cost import placement_gpus
from gpupack.scoring.decider import Decider
from gpupack.scoring.engine import Decision
from gpupack.scoring.facts import MigMode, NodeFacts, Placement
from gpupack.scoring.geometry import resource_profile
from gpupack.scoring.inventory import Inventory
from gpupack.scoring.mix import typical_mix
from gpupack.scoring.policies import GpupackArgs, GpupackWeights, PolicySpec
from gpupack.scoring.request import MILLI_PER_GPU, Kind, PodRequest
from gpupack.sim.workload import Trace, TracePod

CURVE_STEP_PCT = 1.0


@dataclass
class RunResult:
    """One seed's run: what was submitted and placed, and the allocation curve."""

    seed: int | None
    pods_submitted: int = 0
    pods_scheduled: int = 0
    alloc_pct_at_100: float | None = None
    alloc_pct_at_130: float | None = None
    curve: list[tuple[float, float]] = field(default_factory=list)
    placements: dict[str, Placement] = field(default_factory=dict)
    failed_by_kind: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # of this process: on a busy machine the wall time above counts others' work too
    inventory: Inventory | None = field(default=None, repr=False)  # the final state (not in the JSON)

    def to_json(self, with_placements: bool) -> dict[str, object]:
        out: dict[str, object] = {
            "seed": self.seed,
            "pods_submitted": self.pods_submitted,
            "pods_scheduled": self.pods_scheduled,
            "alloc_pct_at_100": round_pct(self.alloc_pct_at_100),
            "alloc_pct_at_130": round_pct(self.alloc_pct_at_130),
            "curve": [[round(a, 3), round(u, 3)] for a, u in self.curve],
            "failed_by_kind": self.failed_by_kind,
            "seconds": round(self.seconds, 3),
            "cpu_seconds": round(self.cpu_seconds, 3),
        }
        if with_placements:
            out["scheduled"] = [_pod_key(name) for name in self.placements]
            out["placements"] = {_pod_key(name): p.to_assignment() for name, p in self.placements.items()}
        return out


def _pod_key(name: str) -> str:
    """`namespace/name` (docs/contracts.md#simulator-json); trace pods without a namespace are in `default`."""
    return name if "/" in name else f"default/{name}"


def round_pct(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def make_policy(name: str, workload: list[TracePod]) -> PolicySpec:
    """The named policy; `fgd` gets its oracle: the typical shapes of the whole `workload`.

    Pass the pods as submitted (after the protocol's inflation), as the ATC'23 simulator computes its
    typical pods from the workload it schedules: replaying its seed-42 order, the oracle of the submitted
    pods reproduces its published allocation (tests/sim/test_fidelity.py), the one of the trace file does not
    (0.1 point more).

    `gpupack[spot_avoid=0,pack=0.1]` is gpupack with those weights (scoring.policies.GpupackWeights).
    """
    if name == "gpupack":
        return policies.gpupack()
    if name.startswith("gpupack[") and name.endswith("]"):
        return policies.gpupack(GpupackArgs(weights=GpupackWeights(**_weights(name[len("gpupack[") : -1]))))
    if name == "fgd":
        return policies.fgd(typical_mix(p.request for p in workload))
    if name.endswith("+besteffort"):
        return policies.baseline(name.removesuffix("+besteffort"), topology_sets=True)
    return policies.baseline(name)


def _weights(text: str) -> dict[str, float]:
    try:
        return {key.strip(): float(value) for key, value in (item.split("=", 1) for item in text.split(","))}
    except ValueError:
        raise ValueError(f"policy weights must look like key=number,...: {text!r}") from None


def build_inventory(nodes: list[NodeFacts]) -> Inventory:
    """An inventory holding every node of the trace, nothing allocated."""
    inventory = Inventory(capacity=max(len(nodes), 1))
    for facts in nodes:
        inventory.add_node(facts)
    return inventory


def requested_gpus(request: PodRequest, mig_compute_total: int = 7) -> float:
    """GPUs a request asks for, in whole-GPU units (MIG by compute slices of an 80 GB-family GPU)."""
    if request.kind == Kind.MIG:
        return sum(_mig_compute(profile) * count for profile, count in request.mig) / mig_compute_total
    return request.gpu_demand


def _mig_compute(profile: str) -> int:
    head = profile.split("g.", 1)[0]
    return int(head) if head.isdigit() else 1


def run_once(
    trace: Trace,
    order: list[TracePod],
    policy: PolicySpec,
    seed: int | None,
    keep_placements: bool = False,
    progress: Callable[[int, int], None] | None = None,
    on_decision: Callable[[TracePod, Decision, Inventory], None] | None = None,
    ends_at_130: bool = False,
) -> RunResult:
    """Submit `order` one pod at a time; failures are dropped, never retried.

    `on_decision(pod, decision, inventory)` (for extra metrics) sees every decision before it is committed.
    `ends_at_130`: the order was inflated to 130 % (fgd protocol), so a run that ends just short of it
    (the protocol stops up to one pod early) reads its last allocation as the one at 130 %.
    """
    started, cpu_started = time.perf_counter(), time.process_time()
    inventory = build_inventory(trace.nodes)
    decider = Decider.seeded(inventory, policy, seed)
    capacity = float(inventory.gpus_total())
    result = RunResult(seed)
    arrived = allocated = 0.0
    next_point = 0.0
    for i, pod in enumerate(order):
        request = pod.request
        arrived += requested_gpus(request)
        decision = decider.decide(request)
        result.pods_submitted += 1
        if on_decision is not None:
            on_decision(pod, decision, inventory)
        if decision.placement is not None:
            inventory.commit(decision.placement)
            allocated += placement_gpus(inventory, decision.placement)
            result.pods_scheduled += 1
            if keep_placements:
                result.placements[pod.name] = decision.placement
        else:
            result.failed_by_kind[kind_label(request)] = result.failed_by_kind.get(kind_label(request), 0) + 1
        arrived_pct = 100.0 * arrived / capacity
        alloc_pct = 100.0 * allocated / capacity
        if result.alloc_pct_at_100 is None and arrived_pct >= 100.0:
            result.alloc_pct_at_100 = alloc_pct
        if result.alloc_pct_at_130 is None and arrived_pct >= 130.0:
            result.alloc_pct_at_130 = alloc_pct
        if arrived_pct >= next_point or i == len(order) - 1:
            result.curve.append((arrived_pct, alloc_pct))
            next_point = arrived_pct + CURVE_STEP_PCT
        if progress and i % 500 == 0:
            progress(i, len(order))
    if ends_at_130 and result.alloc_pct_at_130 is None and result.curve:
        result.alloc_pct_at_130 = result.curve[-1][1]  # the run ended just short of 130 %
    result.seconds = time.perf_counter() - started
    result.cpu_seconds = time.process_time() - cpu_started
    result.inventory = inventory
    return result


def kind_label(request: PodRequest) -> str:
    """How failures are counted: `mig-<profiles>`, `gpu-<N>`, `share`, `none`."""
    if request.kind == Kind.MIG:
        return "mig-" + "+".join(resource_profile(p) for p, _ in request.mig)
    if request.kind == Kind.WHOLE:
        return f"gpu-{request.gpus}"
    return request.kind.name.lower()


def with_dynamic_mig(trace: Trace) -> Trace:
    """`--mig dynamic`: MIG-capable nodes become dynamic; shares become the smallest 80 GB-family
    profile with at least ceil(milli x 7 / 1000) compute slices."""
    nodes = [_dynamic(node) for node in trace.nodes]
    pods = [TracePod(p.name, share_to_mig(p.request), p.qos) for p in trace.pods]
    return Trace(nodes, pods)


def _dynamic(node: NodeFacts) -> NodeFacts:
    from gpupack.scoring.gpu_models import lookup_model

    if node.gpu_count and lookup_model(node.gpu_product).mig_family is not None:
        return NodeFacts(**{**node.__dict__, "mig_mode": MigMode.DYNAMIC, "mig_layout": {}})
    return node


MIG_80GB_BY_SLICES = ((1, "1g.10gb"), (2, "2g.20gb"), (3, "3g.40gb"), (4, "4g.40gb"), (7, "7g.80gb"))


def share_to_mig(request: PodRequest) -> PodRequest:
    """A share request as the smallest 80 GB-family MIG profile with enough compute slices."""
    if request.kind != Kind.SHARE:
        return request
    need = -(-request.milli * 7 // MILLI_PER_GPU)
    profile = next(name for slices, name in MIG_80GB_BY_SLICES if slices >= need)
    return PodRequest(
        request.cpu_milli,
        request.memory_bytes,
        Kind.MIG,
        mig=((profile, 1),),
        allowed_products=request.allowed_products,
        interruptible=request.interruptible,
    )
