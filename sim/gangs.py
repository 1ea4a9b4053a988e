"""The `gangs` protocol: jobs of k identical pods, placed whole (gang) or pod by pod (#29 item 4).

**Jobs.** Each job is one GPU pod of an openb trace, drawn uniformly with replacement from the name-sorted
pods that ask for a GPU (seeded, as `sim.churn` draws; CPU-only pods are left out: they hold no GPU). A pod
asking for whole GPUs becomes a job of k identical members, k in `K_SIZES` = 1, 2, 4, 8 with probabilities
`K_WEIGHTS` = 0.4, 0.3, 0.2, 0.1 (mean 2.6): a fixed, documented mix of single workers and data-parallel
jobs of 2 to 8 workers. A pod asking for a GPU share stays a job of one (a notebook or an inference server,
not a distributed job). On a cluster whose largest node holds fewer GPUs than a pod asks for (the NVL72
trays hold 4, openb has 8-GPU pods) the pod is split into members of the node's size, its CPU and memory
divided alike (an 8-GPU worker is two 4-GPU members), so k doubles.

**Time** is counted in mean job durations (call it hours). Arrivals are Poisson; durations exponential
with mean 1. The arrival rate makes the offered load — arriving GPU demand times duration — equal `load`
x the cluster's GPUs (`GangConfig.load` = 1.2: more demand than GPUs, so once the cluster has filled, jobs
always wait and it stays contended). A job runs once ALL its members are placed, for its duration, then
all members leave together.

**Placement.** Arm `gangs`: the whole job through `scoring.gang.plan_gang` (the smallest topology domain
that holds every member: NVLink clique, rack, zone, cluster), committed at once, or nothing. Arm
`pod-by-pod`: each member on its own (`Decider.decide`, the same decider and policy), as gpupack places pods
without gangs: a member that fits is placed and holds its GPUs, idle, while the job's other members wait.

**Queue.** A job that does not start at its arrival waits, first come first served. After every departure
the waiting jobs are tried again in arrival order (later jobs may start before an earlier one that still
does not fit: no head-of-line blocking, as kube-scheduler's queue). Within one such pass, once a job does
not fit, the later jobs of its class (same member request; for gangs also the same k) wait for the next
pass: they would meet the same or a fuller cluster. An arriving job of a class that has jobs waiting joins
the queue without a try, for the same reason (nothing has left since they last failed). A job asking more than
the cluster holds never starts; in the gang arm it holds nothing, pod by pod its placed members hold their
GPUs to the end.

**End and metrics.** Arrivals run to `horizon` (2.5 h: a run on the whole openb cluster, some 10,000
jobs, takes up to ~15 s on the bench machine); the run stops there (events after it are not simulated), so a pod-by-pod
deadlock — partial jobs each holding what the others wait for — ends with the run instead of making it
endless. The first `warmup` hours (1 h) fill the cluster and are not counted; counted are the jobs that
arrive in [warmup, horizon) and the time from warmup to horizon:

- jobs arrived and jobs started (of the counted ones, by the horizon);
- GPU-hours held idle by partial jobs: the GPUs of placed members of jobs not yet started, integrated over
  the counted time (all jobs' members, also those of jobs from the warm-up), and their time-average in GPUs;
- job wait, arrival to start, mean and p95; a job not started by the horizon counts `horizon - arrival`
  (a lower bound of its wait);
- unallocated GPU %: GPU capacity held by no member (shares count their fraction), time-averaged;
- jobs split: started counted jobs of more than one member spread over more than one NVLink domain
  (a node's `nvidia.com/gpu.clique`, else the node itself).
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

import numpy as np

from gpupack.scoring.cost import placement_gpus
from gpupack.scoring.decider import Decider
from gpupack.scoring.facts import NodeFacts, Placement
from gpupack.scoring.gang import (
    CLIQUE_LABEL,
    DEFAULT_RACK_LABEL,
    level_labels,
    node_labels_of,
    plan_gang,
    topology_domains,
)
from gpupack.scoring.inventory import MAX_GPUS
from gpupack.scoring.policies import PolicySpec
from gpupack.scoring.request import MILLI_PER_GPU, Kind, PodRequest
from gpupack.sim.scenarios import TIB, ClusterSpec, NodeSpec, nvswitch
from gpupack.sim.simulate import build_inventory, requested_gpus
from gpupack.sim.workload import TracePod, gpu_count

K_SIZES = (1, 2, 4, 8)
K_WEIGHTS = (0.4, 0.3, 0.2, 0.1)
GB200 = "NVIDIA-GB200"


class Arm(StrEnum):
    """How a job's members are placed."""

    GANGS = "gangs"  # all members or none, scoring.gang.plan_gang
    POD_BY_POD = "pod-by-pod"  # each member on its own, Decider.decide


@dataclass(frozen=True)
class GangConfig:
    """Offered load (a share of the GPUs) and the run's length, in mean job durations."""

    load: float = 1.2
    warmup: float = 1.0
    horizon: float = 2.5

    def __post_init__(self) -> None:
        if self.load <= 0 or not 0 <= self.warmup < self.horizon:
            raise ValueError(f"gangs: load must be positive and 0 <= warmup < horizon: {self}")


@dataclass(frozen=True)
class JobSpec:
    """One job of the run: `count` members of `request`, when it arrives and how long it runs."""

    index: int
    name: str
    request: PodRequest
    count: int
    arrival: float
    duration: float

    @property
    def key(self) -> tuple[PodRequest, int]:
        """The job's class for the gang arm (member request, k)."""
        return self.request, self.count


# ----------------------------------------------------------------------------- the jobs
def split_member(request: PodRequest, node_gpus: int) -> tuple[PodRequest, int]:
    """(the member request, members per pod): a whole-GPU pod larger than `node_gpus` in members of
    `node_gpus` GPUs, CPU and memory divided alike; any other pod as it is, one member."""
    if request.kind != Kind.WHOLE or request.gpus <= node_gpus:
        return request, 1
    parts = math.ceil(request.gpus / node_gpus)
    member = replace(
        request, gpus=node_gpus, cpu_milli=request.cpu_milli // parts, memory_bytes=request.memory_bytes // parts
    )
    return member, parts


def gpu_pods(pods: Sequence[TracePod]) -> list[TracePod]:
    """The name-sorted pods that ask for a GPU (the jobs are drawn from them)."""
    chosen = sorted((p for p in pods if requested_gpus(p.request) > 0), key=lambda p: p.name)
    if not chosen:
        raise ValueError("gangs: no pod of the trace asks for a GPU")
    return chosen


def mean_job_gpus(pods: Sequence[TracePod]) -> float:
    """Expected GPUs of one job drawn from `pods` (whole-GPU pods times the mean k)."""
    mean_k = sum(k * w for k, w in zip(K_SIZES, K_WEIGHTS, strict=True))
    return sum(requested_gpus(p.request) * (mean_k if p.request.kind == Kind.WHOLE else 1.0) for p in pods) / len(pods)


def gang_jobs(pods: Sequence[TracePod], nodes: Sequence[NodeFacts], seed: int, config: GangConfig) -> list[JobSpec]:
    """The seeded jobs of one run (module docstring): the same for both arms of a seed."""
    originals = gpu_pods(pods)
    rate = config.load * gpu_count(list(nodes)) / mean_job_gpus(originals)
    node_gpus = max((n.gpu_count for n in nodes), default=0)
    rng = np.random.default_rng(seed)
    count = max(1, round(rate * config.horizon))
    picks = rng.integers(len(originals), size=count).tolist()
    sizes = rng.choice(K_SIZES, size=count, p=K_WEIGHTS).tolist()
    times = np.cumsum(rng.exponential(1.0 / rate, size=count)).tolist()
    durations = rng.exponential(1.0, size=count).tolist()
    jobs = []
    for i, (pick, k, arrival, duration) in enumerate(zip(picks, sizes, times, durations, strict=True)):
        if arrival >= config.horizon:
            break
        pod = originals[pick]
        member, parts = split_member(pod.request, node_gpus)
        members = (k if pod.request.kind == Kind.WHOLE else 1) * parts
        jobs.append(JobSpec(i, f"{pod.name}-gang-{i}", member, members, arrival, duration))
    return jobs


def nvl72_nodes(racks: int = 8, trays: int = 18) -> list[NodeFacts]:
    """A synthetic GB200 NVL72 cluster: `racks` racks of `trays` compute trays (nodes) of 4 GPUs, NVLink
    (NVSwitch) inside a node; every node labelled with its rack as `nvidia.com/gpu.clique` (one NVLink domain
    per rack, as GPU feature discovery labels NVL72 racks) and as the rack label."""
    tray = NodeSpec(GB200, trays, 4, 144_000, TIB, nvlink=nvswitch(4))
    nodes = []
    for r in range(racks):
        rack = f"nvl72-rack{r}"
        for facts in ClusterSpec(rack, (replace(tray, prefix=rack),)).build():
            nodes.append(replace(facts, labels={**facts.labels, CLIQUE_LABEL: rack, DEFAULT_RACK_LABEL: rack}))
    return nodes


# ----------------------------------------------------------------------------- the run
@dataclass
class _Job:
    spec: JobSpec
    placements: list[Placement] = field(default_factory=list)
    gpus: float = 0.0  # held by its placed members
    start: float | None = None


@dataclass
class GangResult:
    """One seed, one arm: the counted jobs and the cluster over the counted time."""

    seed: int
    arm: str
    jobs_arrived: int = 0
    jobs_started: int = 0
    idle_gpu_hours: float = 0.0  # held by placed members of jobs not started
    mean_idle_gpus: float = 0.0
    wait_mean: float = 0.0
    wait_p95: float = 0.0
    unallocated_pct: float = 0.0
    jobs_split: int = 0
    partial_at_end: int = 0  # jobs (any) holding members but not started at the horizon
    members_placed: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, object]:
        """Every field, floats to 4 decimals."""
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in self.__dict__.items()}


class _Free:
    """What the nodes have free (whole GPUs, milli per GPU, CPU, memory), read from the inventory when it
    changed: a cheap necessary condition before a placement is tried."""

    def __init__(self, decider: Decider) -> None:
        self.inventory = decider.inventory
        self.stale = True
        self._shapes: dict[tuple[Kind, int], tuple[int, list[tuple[int, int, int]]]] = {}

    def _nodes_for(self, request: PodRequest) -> tuple[int, list[tuple[int, int, int]]]:
        """(members of the request's GPU shape the free GPUs hold, and per node that holds one: that
        count, its free CPU, its free memory); cached per shape until the inventory changes."""
        if self.stale:
            self._shapes.clear()
            self.stale = False
        shape = (request.kind, request.gpus if request.kind == Kind.WHOLE else request.milli)
        if shape not in self._shapes:
            inventory, n = self.inventory, self.inventory.size
            milli = inventory.gpu_milli_free[: n * MAX_GPUS].reshape(n, MAX_GPUS).astype(np.int64)
            if request.kind == Kind.WHOLE:
                untaken = ~inventory.gpu_whole[: n * MAX_GPUS].reshape(n, MAX_GPUS)
                per_node = ((milli == MILLI_PER_GPU) & untaken).sum(axis=1) // request.gpus
            else:
                per_node = (milli // request.milli).sum(axis=1)
            rows = np.flatnonzero(per_node)
            nodes = list(zip(per_node[rows].tolist(), inventory.node_cpu_free[rows].tolist(),
                             inventory.node_mem_free[rows].tolist(), strict=True))  # fmt: skip
            self._shapes[shape] = (int(per_node.sum()), nodes)
        return self._shapes[shape]

    def may_fit(self, request: PodRequest, count: int) -> bool:
        """False when no set of nodes has the GPUs, CPU and memory for `count` members of `request`."""
        if request.kind not in (Kind.WHOLE, Kind.SHARE):
            return True
        total, nodes = self._nodes_for(request)
        if total < count:
            return False
        cpu, memory, found = max(request.cpu_milli, 1), max(request.memory_bytes, 1), 0
        for members, cpu_free, memory_free in nodes:
            found += min(members, cpu_free // cpu, memory_free // memory)
            if found >= count:
                return True
        return False


class _Run:
    """One arm over one job list: the inventory, the queue by class, and the time integrals."""

    def __init__(self, nodes: Sequence[NodeFacts], policy: PolicySpec, arm: Arm, seed: int, config: GangConfig) -> None:
        self.inventory = build_inventory(list(nodes))
        self.decider = Decider.seeded(self.inventory, policy, seed)
        self.domains = topology_domains(node_labels_of(self.inventory), level_labels())
        self.arm, self.config = arm, config
        self.free = _Free(self.decider)
        self.waiting: dict[Hashable, deque[_Job]] = {}
        self.leaving: list[tuple[float, int, _Job]] = []
        self.allocated = self.idle = 0.0
        self.allocated_time = self.idle_time = 0.0
        self.clock = 0.0
        self.members = 0

    def key(self, job: _Job) -> Hashable:
        return job.spec.key if self.arm == Arm.GANGS else job.spec.request

    def advance(self, now: float) -> None:
        """Integrate allocated and idle-held GPUs over the counted part of (clock, now]."""
        span = min(now, self.config.horizon) - max(self.clock, self.config.warmup)
        if span > 0:
            self.allocated_time += self.allocated * span
            self.idle_time += self.idle * span
        self.clock = max(self.clock, now)

    def commit(self, job: _Job, placement: Placement) -> None:
        self.inventory.commit(placement)
        self.free.stale = True
        gpus = placement_gpus(self.inventory, placement)
        job.placements.append(placement)
        job.gpus += gpus
        self.allocated += gpus
        self.idle += gpus
        self.members += 1

    def start(self, job: _Job, now: float) -> None:
        job.start = now
        self.idle -= job.gpus
        heapq.heappush(self.leaving, (now + job.spec.duration, job.spec.index, job))

    def try_start(self, job: _Job, now: float) -> bool:
        """Place what the arm places of `job` now; True when the job started."""
        spec = job.spec
        if self.arm == Arm.GANGS:
            if not self.free.may_fit(spec.request, spec.count):
                return False
            for member in plan_gang(self.decider, spec.request, spec.count, self.domains).placements:
                self.commit(job, member)
        while self.arm == Arm.POD_BY_POD and len(job.placements) < spec.count and self.free.may_fit(spec.request, 1):
            placement = self.decider.decide(spec.request, observe=False).placement
            if placement is None:
                break
            self.commit(job, placement)
        if len(job.placements) < spec.count:
            return False
        self.start(job, now)
        return True

    def arrive(self, job: _Job, now: float) -> None:
        """Observe the request once per member, then try the job unless jobs of its class wait."""
        for _ in range(job.spec.count):
            self.decider.observe(job.spec.request)
        key = self.key(job)
        if key in self.waiting or not self.try_start(job, now):
            self.waiting.setdefault(key, deque()).append(job)

    def depart(self) -> float:
        """The next job to finish leaves; returns when."""
        end, _, job = heapq.heappop(self.leaving)
        self.advance(end)
        for placement in job.placements:
            self.inventory.release(placement)
        self.free.stale = True
        self.allocated -= job.gpus
        return end

    def retry(self, now: float) -> None:
        """One pass over the waiting jobs in arrival order; a class stops at its first job that does not start."""
        heads = [(queue[0].spec.index, key) for key, queue in self.waiting.items()]
        heapq.heapify(heads)
        while heads:
            _, key = heapq.heappop(heads)
            queue = self.waiting[key]
            if not self.try_start(queue[0], now):
                continue
            queue.popleft()
            if queue:
                heapq.heappush(heads, (queue[0].spec.index, key))
            else:
                del self.waiting[key]


def run_gangs(
    nodes: Sequence[NodeFacts],
    jobs: Sequence[JobSpec],
    policy: PolicySpec,
    arm: Arm,
    seed: int,
    config: GangConfig = GangConfig(),
) -> GangResult:
    """One seed, one arm of the protocol (module docstring) over `jobs` (`gang_jobs`)."""
    started = time.perf_counter()
    run = _Run(nodes, policy, arm, seed, config)
    states = [_Job(spec) for spec in jobs]
    for job in states:
        while run.leaving and run.leaving[0][0] <= job.spec.arrival:
            run.retry(run.depart())
        run.advance(job.spec.arrival)
        run.arrive(job, job.spec.arrival)
    while run.leaving and run.leaving[0][0] <= config.horizon:
        run.retry(run.depart())
    run.advance(config.horizon)
    result = _result(run, states, seed, arm, config, nodes)
    result.seconds = time.perf_counter() - started
    return result


def _result(
    run: _Run, jobs: Sequence[_Job], seed: int, arm: Arm, config: GangConfig, nodes: Sequence[NodeFacts]
) -> GangResult:
    counted = [j for j in jobs if j.spec.arrival >= config.warmup]
    waits = [(config.horizon if j.start is None else j.start) - j.spec.arrival for j in counted]
    span = config.horizon - config.warmup
    capacity = float(gpu_count(list(nodes)))
    domain = {n.name: n.labels.get(CLIQUE_LABEL) or n.name for n in nodes}
    return GangResult(
        seed,
        str(arm),
        jobs_arrived=len(counted),
        jobs_started=sum(j.start is not None for j in counted),
        idle_gpu_hours=run.idle_time,
        mean_idle_gpus=run.idle_time / span,
        wait_mean=float(np.mean(waits)) if waits else 0.0,
        wait_p95=float(np.percentile(waits, 95)) if waits else 0.0,
        unallocated_pct=100.0 * (1.0 - run.allocated_time / (capacity * span)) if capacity else 0.0,
        jobs_split=sum(j.start is not None and len({domain[p.node] for p in j.placements}) > 1 for j in counted),
        partial_at_end=sum(j.start is None and bool(j.placements) for j in jobs),
        members_placed=run.members,
    )
