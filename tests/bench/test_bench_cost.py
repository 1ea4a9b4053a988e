"""bench.equal_risk: the spot practice of the baselines (taint + toleration + preference) and the measures."""

from __future__ import annotations

from gpupack.bench.equal_risk import COST_POLICIES, CostPolicy, SpotPractice, depart, fill, measure, run
from gpupack.scoring.facts import NodeFacts
from gpupack.scoring.request import Kind, PodRequest
from gpupack.sim.workload import Trace, TracePod

H100 = "NVIDIA-H100-80GB-HBM3"


def nodes() -> list[NodeFacts]:
    return [
        NodeFacts(f"{kind}-{i}", 64_000, 1 << 40, gpu_product=H100, gpu_count=4, spot=kind == "spot",
                  hourly_cost=12.0 if kind == "spot" else 40.0)
        for kind in ("od", "spot") for i in range(2)
    ]  # fmt: skip


def pods(count: int) -> list[TracePod]:
    return [
        TracePod(f"p{i}", PodRequest(1000, 1 << 30, Kind.WHOLE, gpus=1, interruptible=i % 2 == 0)) for i in range(count)
    ]


def policy(name: str) -> CostPolicy:
    (found,) = [p for p in COST_POLICIES if p.name == name]
    return found


def test_taint_keeps_firm_pods_off_spot_and_sends_interruptible_ones_there_first() -> None:
    trace = Trace(nodes(), pods(8))
    inventory, placed = fill(trace, trace.pods, policy("kube-default + taint"), seed=42)
    assert len(placed) == 8
    for pod, placement in placed.values():
        assert placement.node.startswith("spot" if pod.request.interruptible else "od")
    figures = measure(inventory, placed)
    assert figures["firm_gpus_on_spot"] == 0 and figures["flexible_gpus_on_spot_pct"] == 100.0


def test_interruptible_pods_overflow_to_on_demand_when_spot_is_full() -> None:
    flexible = [TracePod(f"i{i}", PodRequest(1000, 1 << 30, Kind.WHOLE, gpus=1, interruptible=True)) for i in range(10)]
    trace = Trace(nodes(), flexible)  # 10 interruptible GPUs, 8 on spot
    _, placed = fill(trace, trace.pods, policy("best-fit + taint"), seed=42)
    flexible_nodes = [p.node for _, p in placed.values()]
    assert sum(n.startswith("spot") for n in flexible_nodes) == 8 and len(flexible_nodes) == 10


def test_without_practice_capacity_type_is_ignored() -> None:
    trace = Trace(nodes(), [TracePod(f"p{i}", PodRequest(1000, 1 << 30, Kind.WHOLE, gpus=1)) for i in range(16)])
    inventory, placed = fill(trace, trace.pods, CostPolicy("kd", "kube-default", SpotPractice.NONE), seed=42)
    assert measure(inventory, placed)["firm_gpus_on_spot"] == 8  # all 16 GPUs taken, 8 of them spot


def test_busy_cost_and_departures() -> None:
    trace = Trace(nodes(), pods(4))
    inventory, placed = fill(trace, trace.pods, policy("gpupack (forbid)"), seed=42)
    figures = measure(inventory, placed)
    assert figures["firm_gpus_on_spot"] == 0
    # two firm pods packed on one on-demand node ($40), two interruptible ones on one spot node ($12)
    assert (figures["busy_nodes"], figures["busy_cost_per_hour"]) == (2, 52.0)
    depart(inventory, placed, 1.0, seed=42)
    after = measure(inventory, placed)
    assert after["busy_nodes"] == 0 and after["empty_nodes"] == 4 and after["empty_cost_per_hour"] == 104.0
    result = run(trace, policy("gpupack (forbid)"), seed=42, load=0.5)
    assert result.pods_placed > 0 and result.firm_gpus_on_spot == 0
