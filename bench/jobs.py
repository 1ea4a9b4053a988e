"""The bench's independent simulation runs: one (scenario, variant, policy, seed) each.

Jobs are small frozen dataclasses, so a process pool can ship them to workers; `run_job` runs one and
returns a JSON-ready dict (the run as `gpupack simulate --json` reports it, plus scenario metrics).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from gpupack.scoring.facts import MigMode, NodeFacts
from gpupack.sim import packing_metrics as metrics
from gpupack.sim.churn import ChurnConfig, inference_pods, run_churn
from gpupack.sim.load import load_nodes, load_pods
from gpupack.sim.protocol import fgd_order
from gpupack.sim.scenarios import (
    STATIC_BALANCED,
    ClusterSpec,
    churn_cluster,
    cost_cluster,
    mig_cluster,
    nvlink_cluster,
)
from gpupack.sim.simulate import RunResult, make_policy, requested_gpus, run_once, share_to_mig
from gpupack.sim.workload import Trace, TracePod, gpu_count, gpu_milli_capacity

NODE_LIST = "openb_node_list_gpu_node.csv"
GRID_SAMPLE = 32  # GPUs shown in the MIG occupancy picture


def pod_file(trace: str) -> str:
    """The openb pod list of a trace variant (`default`, `cpu050`, ...)."""
    return f"openb_pod_list_{trace}.csv"


@functools.cache
def _pods(path: str) -> tuple[TracePod, ...]:
    return tuple(load_pods(path))


@functools.cache
def _nodes(path: str) -> tuple[NodeFacts, ...]:
    return tuple(load_nodes(path))


def prefix_to_arrived(order: list[TracePod], nodes: list[NodeFacts], pct: float) -> list[TracePod]:
    """The shortest prefix of `order` whose arrived GPU demand reaches `pct` % of the cluster's GPUs.

    `run_once` reads the allocation at that pod, so a run cut there reports the same value at `pct`.
    """
    capacity = gpu_count(nodes)
    arrived = 0.0
    for i, pod in enumerate(order):
        arrived += requested_gpus(pod.request)
        if 100.0 * arrived / capacity >= pct:
            return order[: i + 1]
    return order


def openb_workload(
    traces_dir: str, trace: str, seed: int, node_limit: int | None
) -> tuple[list[NodeFacts], list[TracePod], list[TracePod]]:
    """The openb nodes (the first `node_limit`), the trace's pods, and the seed's FGD order of them."""
    nodes = list(_nodes(str(Path(traces_dir) / NODE_LIST)))[:node_limit]
    pods = list(_pods(str(Path(traces_dir) / pod_file(trace))))
    return nodes, pods, fgd_order(pods, gpu_milli_capacity(nodes), seed)


def _base(job: Job, result: RunResult, extra: dict[str, object]) -> dict[str, object]:
    """The job's fields (but its input folder), the run as `simulate --json` reports it, and `extra`."""
    fields = {k: v for k, v in asdict(job).items() if k != "traces_dir"}
    return {**fields, "run": result.to_json(with_placements=False), **extra}


@dataclass(frozen=True)
class OpenbJob:
    """One policy, one seed on an openb trace, fgd protocol; `stop_at_100` cuts the run at arrived 100 %."""

    traces_dir: str
    trace: str
    policy: str
    seed: int
    node_limit: int | None = None
    stop_at_100: bool = False
    scenario: str = "openb"

    def run(self) -> dict[str, object]:
        nodes, pods, workload = openb_workload(self.traces_dir, self.trace, self.seed, self.node_limit)
        order = prefix_to_arrived(workload, nodes, 100.0) if self.stop_at_100 else workload
        policy = make_policy(self.policy, workload)
        result = run_once(Trace(nodes, pods), order, policy, self.seed, ends_at_130=not self.stop_at_100)
        return _base(self, result, {"gpus_total": gpu_count(nodes)})


@dataclass(frozen=True)
class LimitJob:
    """The physical limit of one openb seed (bench.limit): the pods an OpenbJob of the seed has seen by
    arrived 100 %, the pattern-LP bound on unallocated GPU %, and with `packing` an offline packing."""

    traces_dir: str
    trace: str
    seed: int
    node_limit: int | None = None
    packing: bool = False
    scenario: str = "limit"
    policy: str = "limit"  # read by the pool's ordering; the limit is no policy

    def run(self) -> dict[str, object]:
        from gpupack.bench.limit.solve import limit_of  # SciPy: the bench extra only

        nodes, _, workload = openb_workload(self.traces_dir, self.trace, self.seed, self.node_limit)
        arrived = prefix_to_arrived(workload, nodes, 100.0)
        limit = limit_of([pod.request for pod in arrived], nodes, self.packing)
        fields = {k: v for k, v in asdict(self).items() if k != "traces_dir"}
        return {**fields, **limit.to_json()}


@dataclass(frozen=True)
class MigJob:
    """The openb default trace with shares as MIG profiles on the MIG cluster (dynamic or static-balanced)."""

    traces_dir: str
    label: str  # how the report names this run
    variant: str  # "dynamic" | "static-balanced"
    policy: str
    seed: int
    scale: float = 1.0
    grid: bool = False
    scenario: str = "mig"

    def cluster(self) -> ClusterSpec:
        spec = mig_cluster().scaled(self.scale)
        return spec.with_mig(MigMode.STATIC, STATIC_BALANCED) if self.variant == "static-balanced" else spec

    def run(self) -> dict[str, object]:
        nodes = self.cluster().build()
        pods = list(_pods(str(Path(self.traces_dir) / pod_file("default"))))
        # order by the shares' milli demand (as the protocol defines it), then turn shares into profiles
        order = [as_mig(p) for p in fgd_order(pods, gpu_milli_capacity(nodes), self.seed)]
        converted = [as_mig(p) for p in pods]
        result = run_once(
            Trace(nodes, converted),
            order,
            make_policy(self.policy, order),
            self.seed,
            keep_placements=self.grid,
            ends_at_130=True,
        )
        assert result.inventory is not None
        extra: dict[str, object] = {
            "gpus_total": len([0 for _ in metrics.gpu_states(result.inventory)]),
            "failed_by_profile": metrics.failed_profiles(result.failed_by_kind),
            "stranding": metrics.stranded_gpus(result.inventory, result.failed_by_kind).to_json(),
        }
        if self.grid:
            extra["occupancy"] = metrics.occupancy_grid(result.inventory, result.placements.values(), GRID_SAMPLE)
        return _base(self, result, extra)


def as_mig(pod: TracePod) -> TracePod:
    """The pod with its share turned into a MIG profile (`--mig dynamic`), CPU and memory kept."""
    return TracePod(pod.name, share_to_mig(pod.request), pod.qos)


@dataclass(frozen=True)
class NvlinkJob:
    """openb multigpu20 on the NVLink cluster; tracks the NVLink quality of multi-GPU sets."""

    traces_dir: str
    policy: str
    seed: int
    scale: float = 1.0
    scenario: str = "nvlink"

    def run(self) -> dict[str, object]:
        nodes = nvlink_cluster().scaled(self.scale).build()
        pods = list(_pods(str(Path(self.traces_dir) / pod_file("multigpu20"))))
        order = fgd_order(pods, gpu_milli_capacity(nodes), self.seed)
        tracker = metrics.LinkTracker()
        policy = make_policy(self.policy, order)
        result = run_once(Trace(nodes, pods), order, policy, self.seed, on_decision=tracker, ends_at_130=True)
        return _base(self, result, {"gpus_total": gpu_count(nodes), "links": tracker.to_json()})


@dataclass(frozen=True)
class CostJob:
    """openb default pods (BE = interruptible) on on-demand + spot nodes, one pass to `ratio` x capacity."""

    traces_dir: str
    policy: str
    seed: int
    ratio: float = 1.0
    scale: float = 1.0
    scenario: str = "cost"

    def run(self) -> dict[str, object]:
        nodes = cost_cluster().scaled(self.scale).build()
        pods = list(_pods(str(Path(self.traces_dir) / pod_file("default"))))
        order = fgd_order(pods, gpu_milli_capacity(nodes), self.seed, self.ratio)
        result = run_once(Trace(nodes, pods), order, make_policy(self.policy, pods), self.seed, keep_placements=True)
        assert result.inventory is not None
        by_name = {pod.name: pod for pod in order}
        costs = metrics.cost_metrics(result.inventory, result.placements, by_name)
        return _base(self, result, {"gpus_total": gpu_count(nodes), "cost": costs})


@dataclass(frozen=True)
class CostSpotJob:
    """The cost cluster with the spot practice of bench.equal_risk (taints, or gpupack's own rule), one `ratio` fill."""

    traces_dir: str
    policy: str  # a bench.equal_risk.COST_POLICIES name
    seed: int
    ratio: float = 1.0
    scale: float = 1.0
    scenario: str = "cost-spot"

    def run(self) -> dict[str, object]:
        from gpupack.bench.equal_risk import policy_named, run

        nodes = cost_cluster().scaled(self.scale).build()
        pods = list(_pods(str(Path(self.traces_dir) / pod_file("default"))))
        result = run(Trace(nodes, pods), policy_named(self.policy), self.seed, self.ratio)
        fields = {k: v for k, v in asdict(self).items() if k != "traces_dir"}
        return {**fields, "cost_spot": result.to_json()}


@dataclass(frozen=True)
class ChurnJob:
    """The churn protocol (sim.churn) on the churn cluster with the inference-style MIG mix."""

    traces_dir: str  # unused: the workload is generated; kept so every job has the same first field
    policy: str
    seed: int
    scale: float = 1.0
    load: float = ChurnConfig.load
    measure: float = ChurnConfig.measure
    scenario: str = "churn"

    def run(self) -> dict[str, object]:
        nodes = churn_cluster().scaled(self.scale).build()
        pods = inference_pods()
        config = ChurnConfig(load=self.load, measure=self.measure)
        result = run_churn(Trace(nodes, pods), make_policy(self.policy, pods), self.seed, config)
        fields = {k: v for k, v in asdict(self).items() if k != "traces_dir"}
        return {**fields, "run": result.to_json(), "gpus_total": gpu_count(nodes)}


Job = OpenbJob | LimitJob | MigJob | NvlinkJob | CostJob | CostSpotJob | ChurnJob


class Runnable(Protocol):
    """A job a process pool can ship and run: these above, and the preemption and gangs benches' own."""

    def run(self) -> dict[str, object]:
        """Run it; the result as JSON-ready values."""
        ...


def run_job(job: Runnable) -> dict[str, object]:
    """Run one job (the process pool's target)."""
    return job.run()
