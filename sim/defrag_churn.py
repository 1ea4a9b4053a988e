"""Defragmentation under churn: placement alone, the defrag planner, or a count-based descheduler rule (#31 item 3).

The same seeded arrivals and departures (`sim.churn`'s machinery: `churn_arrivals`, `ChurnConfig`) run under
three arms, all placing with `scoring.decider.Decider` and the default gpupack policy (`Decider.seeded`, as
`sim.churn` makes it):

- `gpupack`: placement only, nothing ever moves.
- `gpupack+defrag`: every `period`, `scoring.defrag.plan_defrag` (all goals, at most `max_evictions`
  evictions, a fresh policy as `gpupack defrag` makes one per run) plans on the cluster, and its moves are
  carried out exactly as planned: each evicted pod's placement released, the move's pending pod started at the
  move's placement, each evicted pod restarted at its eviction's `to`.
- `gpupack+count-rule`: every `period`, every pod of the node with the lowest allocated GPU count among the
  nodes that hold pods (ties: the node's name) is evicted and put at the front of the pending queue, as
  descheduler rules of the LowNodeUtilization kind choose by counts.

Workload (one, mixed, to show fragmentation): `NODES` nodes of 8 H100-80GB GPUs in dynamic MIG mode (as
`sim.dra_churn`), where an untouched GPU takes a whole-GPU pod or MIG instances. Half the pods are MIG pods
of `sim.churn`'s inference mix on the 80 GB profiles (1g..7g), half are whole-GPU pods with the openb default
trace's GPU counts (`OPENB_WHOLE_GPU_PODS`: mostly 1 GPU, some 2, 4 and 8). Shares are left out: a GPU in MIG
mode takes none.

Queue: a pod that fits nowhere at arrival waits in a FIFO pending queue; the queue is retried in order (every
pod that fits then starts, a pod that does not blocks no later one) after every departure, after every
eviction and at every period. A pod that waited longer than `patience` mean lifetimes leaves and counts as
rejected. An evicted pod restarts: the work it did is lost (its end becomes now + its whole duration) and the
restarted GPU-time is GPUs held x time it had run. Time is counted in seconds of one arrival per second on
average (as `sim.churn`'s mean inter-arrival gaps), so GPU-time is in GPU-seconds of that clock.

Measured after the warm-up, as `sim.churn`: samples of GPUs in use (whole GPUs, MIG by compute slices / 7),
stranded MIG slices (free compute slices on MIG GPUs in use that cannot host the mix's largest profile), and
large pods pending (≥ 4 whole GPUs or a MIG profile ≥ 4g); counts of rejections, evictions, restarted
GPU-seconds, and the waits of large pods: from entering the queue (arrival, or a count-rule eviction) to
starting, to giving up (the patience), or to the end of the run for those still waiting (pods a defrag move
restarts at once never wait). Since a restarted pod holds GPUs again for work done once, GPUs in use are also
given net of the restarted GPU-seconds (`net_in_use_pct`).
"""

from __future__ import annotations

import heapq
import math
import statistics
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Literal, TypedDict

from gpupack.scoring.cost import placement_gpus
from gpupack.scoring.decider import Decider
from gpupack.scoring.defrag import Pending, Resident, plan_defrag
from gpupack.scoring.facts import MigMode, Placement
from gpupack.scoring.geometry import resolve_profile
from gpupack.scoring.inventory import Inventory
from gpupack.scoring.request import Kind, PodRequest
from gpupack.sim.churn import (
    FAMILY_PROFILES,
    INFERENCE_SIZES,
    Arrival,
    ChurnConfig,
    arrivals_digest,
    churn_arrivals,
    mean_lifetime,
)
from gpupack.sim.packing_metrics import gpu_states
from gpupack.sim.scenarios import H100, TIB, ClusterSpec, NodeSpec
from gpupack.sim.simulate import build_inventory, make_policy
from gpupack.sim.workload import Trace, TracePod, gpu_count

NODES = 16  # H100 x 8 nodes (128 GPUs): small enough for 42 tuning seeds x 3 arms on 2 cores
GPUS_PER_NODE = 8
# openb_pod_list_default.csv: pods asking whole GPUs, by GPU count (1: 3911, 2: 16, 4: 15, 8: 44 pods)
OPENB_WHOLE_GPU_PODS = ((1, 3911), (2, 16), (4, 15), (8, 44))
MIG_SHARE = 0.5  # of the pods: MIG instances; the rest ask whole GPUs
WHOLE_CPU_MILLI_PER_GPU = 8000
WHOLE_MEMORY_PER_GPU = 64 << 30
MIG_CPU_MILLI = 2000
MIG_MEMORY = 16 << 30
LARGE_GPUS = 4  # a pod of at least 4 whole GPUs or a MIG profile of at least 4 compute slices is large
LARGEST_PROFILE = "7g.80gb"  # the mix's largest MIG profile (stranded slices cannot host it)


@dataclass(frozen=True)
class DefragConfig:
    """A run: the churn settings, the period of the moving arms, their eviction bound and the queue's patience
    (period and patience in mean lifetimes)."""

    churn: ChurnConfig
    period: float
    max_evictions: int
    patience: float


# Chosen on seeds 0-41 only (bench.defrag reports 42-51; runs: python -m gpupack.bench.defrag --seeds 0-41 --arms ...
# with the options named). load: the lowest in steps of 0.05 from 0.9 at which plain gpupack had large pods pending
# on every one of those seeds (seeds without: 0.9: 5, 0.95: 1, 1.0: 0). period and max evictions: the pair with the
# highest median net utilisation gain of gpupack+defrag over gpupack (GPUs in use less restarted work, pp): period
# 0.1 / 4 evictions +0.37, 0.25 / 4 +0.21, 0.25 / 8 +0.14, 0.5 / 4 +0.08, 0.5 / 8 -0.06 (period 0.1 / 8 and 0.05
# not run: a 0.1 run took 36 s a seed on the shared 2 cores); the count rule runs at the same period. patience: 1
# mean lifetime, not tuned. warm-up and measured part as sim.churn's defaults.
CONFIG = DefragConfig(ChurnConfig(load=1.0, warmup=2.0, measure=6.0, samples=200), 0.1, 4, 1.0)


class Arm(StrEnum):
    """What runs beside placement."""

    GPUPACK = "gpupack"
    DEFRAG = "gpupack+defrag"
    COUNT_RULE = "gpupack+count-rule"


# ----------------------------------------------------------------------------- the workload
def defrag_cluster(nodes: int = NODES) -> ClusterSpec:
    """`nodes` nodes of 8 H100-80GB GPUs in dynamic MIG mode, 192 cores and 2 TiB each."""
    return ClusterSpec("defrag-churn", (NodeSpec(H100, nodes, GPUS_PER_NODE, 192_000, 2 * TIB, mig=MigMode.DYNAMIC),))


def mixed_pods(count: int = 1000) -> list[TracePod]:
    """`count` pods: `MIG_SHARE` MIG instances of the inference mix (80 GB profiles), the rest whole-GPU pods in
    the openb default trace's proportions of GPU counts (each of those at least one pod)."""
    pods: list[TracePod] = []
    for size, weight in INFERENCE_SIZES:
        profile = FAMILY_PROFILES["80gb"][size]
        request = PodRequest(MIG_CPU_MILLI, MIG_MEMORY, Kind.MIG, mig=((profile, 1),))
        pods += [TracePod(f"mig-{profile}-{i:04d}", request, "LS") for i in range(round(count * MIG_SHARE * weight))]
    total = sum(n for _, n in OPENB_WHOLE_GPU_PODS)
    for gpus, n in OPENB_WHOLE_GPU_PODS:
        request = PodRequest(gpus * WHOLE_CPU_MILLI_PER_GPU, gpus * WHOLE_MEMORY_PER_GPU, Kind.WHOLE, gpus=gpus)
        many = max(1, round(count * (1 - MIG_SHARE) * n / total))
        pods += [TracePod(f"gpu{gpus}-{i:04d}", request, "LS") for i in range(many)]
    return pods


def is_large(request: PodRequest) -> bool:
    """≥ `LARGE_GPUS` whole GPUs, or a MIG profile of ≥ 4 compute slices."""
    if request.kind == Kind.WHOLE:
        return request.gpus >= LARGE_GPUS
    return request.kind == Kind.MIG and any(int(p.split("g.", 1)[0]) >= LARGE_GPUS for p, _ in request.mig)


def defrag_arrivals(seed: int, nodes: int, config: ChurnConfig) -> tuple[Trace, list[Arrival]]:
    """The cluster and mix of a run, and the seeded arrivals every arm places."""
    trace = Trace(defrag_cluster(nodes).build(), mixed_pods())
    return trace, churn_arrivals(trace.pods, gpu_count(trace.nodes), seed, config)


# ----------------------------------------------------------------------------- state
@dataclass
class Job:
    """A pod in the system: its request, how long it runs, since when it waits (while queued)."""

    key: str
    request: PodRequest
    duration: float
    queued_at: float
    large: bool


@dataclass
class Running:
    """A running pod: where, since when, until when (a restart makes a new one)."""

    job: Job
    placement: Placement
    started: float
    end: float
    gpus: float


class Sample(TypedDict):
    """The cluster at one sample time."""

    time: float
    in_use_pct: float
    stranded_slices: int
    large_pending: int


SampleField = Literal["in_use_pct", "stranded_slices", "large_pending"]


@dataclass
class DefragChurnResult:
    """One arm on one seed, counted after the warm-up."""

    arm: str
    seed: int
    nodes: int
    mean_lifetime: float
    arrivals_digest: str  # the same for every arm of a seed
    measured_seconds: float  # the measured part's length
    submitted: int = 0
    rejected: int = 0  # patience ran out
    rejected_large: int = 0
    evictions: int = 0
    restarted_gpu_seconds: float = 0.0
    moves: int = 0  # defrag moves carried out / count-rule nodes emptied
    large_waits: list[float] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    seconds: float = 0.0

    def mean(self, key: SampleField) -> float:
        """Mean of a sample field over the samples."""
        return round(statistics.fmean(float(s[key]) for s in self.samples), 3) if self.samples else 0.0

    def net_in_use_pct(self) -> float:
        """GPUs in use less the work restarts threw away: mean in use minus the restarted GPU-seconds over the
        measured GPU-seconds (restarted pods hold GPUs again for work already done once)."""
        measured = self.measured_seconds * self.nodes * GPUS_PER_NODE
        lost = 100.0 * self.restarted_gpu_seconds / measured if measured else 0.0
        return round(self.mean("in_use_pct") - lost, 3)

    def to_json(self) -> dict[str, object]:
        """The run as the bench saves it (samples summarised)."""
        return {
            "arm": self.arm,
            "seed": self.seed,
            "nodes": self.nodes,
            "gpus_total": self.nodes * GPUS_PER_NODE,
            "mean_lifetime": round(self.mean_lifetime, 1),
            "arrivals_digest": self.arrivals_digest,
            "submitted": self.submitted,
            "rejected": self.rejected,
            "rejected_large": self.rejected_large,
            "evictions": self.evictions,
            "restarted_gpu_seconds": round(self.restarted_gpu_seconds, 1),
            "moves": self.moves,
            "mean_in_use_pct": self.mean("in_use_pct"),
            "net_in_use_pct": self.net_in_use_pct(),
            "mean_stranded_slices": self.mean("stranded_slices"),
            "mean_large_pending": self.mean("large_pending"),
            "large_waits": len(self.large_waits),
            "mean_large_wait": round(statistics.fmean(self.large_waits), 2) if self.large_waits else 0.0,
            "samples": len(self.samples),
            "seconds": round(self.seconds, 3),
        }


class Simulation:
    """One arm's cluster under churn: the inventory, the running pods, the pending queue and the counters."""

    def __init__(self, arm: Arm, trace: Trace, seed: int, config: DefragConfig, result: DefragChurnResult) -> None:
        self.arm = arm
        self.trace = trace
        self.config = config
        self.inventory = build_inventory(trace.nodes)
        self.capacity = float(self.inventory.gpus_total())
        self.decider = Decider.seeded(self.inventory, make_policy("gpupack", list(trace.pods)), seed)
        self.life = result.mean_lifetime
        self.counted_from = config.churn.warmup * self.life
        self.running: dict[str, Running] = {}
        self.queue: deque[Job] = deque()
        self.leaving: list[tuple[float, int, str]] = []  # (end, serial, key); stale when the pod restarted
        self.serial = 0
        self.in_use = 0.0
        self.result = result

    # ------------------------------------------------------------------ pods
    def counted(self, now: float) -> bool:
        return now >= self.counted_from

    def start(self, job: Job, placement: Placement, now: float, waited: bool = True) -> None:
        """Commit `placement` and run `job` there from `now` for its whole duration."""
        self.inventory.commit(placement)
        gpus = placement_gpus(self.inventory, placement)
        self.running[job.key] = Running(job, placement, now, now + job.duration, gpus)
        self.in_use += gpus
        self.serial += 1
        heapq.heappush(self.leaving, (now + job.duration, self.serial, job.key))
        if waited and job.large and self.counted(now):
            self.result.large_waits.append(now - job.queued_at)

    def stop(self, key: str) -> Running:
        """Release a running pod's placement."""
        run = self.running.pop(key)
        self.inventory.release(run.placement)
        self.in_use -= run.gpus
        return run

    def evict(self, key: str, now: float) -> Job:
        """Stop a pod for a restart: its work so far is lost (counted after the warm-up)."""
        run = self.stop(key)
        if self.counted(now):
            self.result.evictions += 1
            self.result.restarted_gpu_seconds += run.gpus * (now - run.started)
        return run.job

    def depart_until(self, now: float) -> bool:
        """Every pod that completes by `now` leaves; whether one did."""
        left = False
        while self.leaving and self.leaving[0][0] <= now:
            end, _, key = heapq.heappop(self.leaving)
            run = self.running.get(key)
            if run is not None and run.end == end:
                self.stop(key)
                left = True
        return left

    def arrive(self, arrival: Arrival, now: float) -> None:
        """Place the pod now, or queue it."""
        request = arrival.pod.request
        job = Job(arrival.pod.name, request, arrival.end - arrival.time, now, is_large(request))
        if self.counted(now):
            self.result.submitted += 1
        placement = self.decider.decide(request).placement
        if placement is None:
            self.queue.append(job)
        else:
            self.start(job, placement, now)

    # ------------------------------------------------------------------ the queue
    def expire(self, now: float) -> None:
        """Queued pods that waited past the patience leave (rejected when that happens after the warm-up)."""
        limit = self.config.patience * self.life
        kept: deque[Job] = deque()
        for job in self.queue:
            gone_at = job.queued_at + limit
            if gone_at < now:
                if self.counted(gone_at):
                    self.result.rejected += 1
                    self.result.rejected_large += job.large
                    if job.large:
                        self.result.large_waits.append(limit)
            else:
                kept.append(job)
        self.queue = kept

    def retry(self, now: float) -> None:
        """Every queued pod in order: it starts where it fits now, else it keeps its place."""
        self.expire(now)
        kept: deque[Job] = deque()
        for job in self.queue:
            placement = self.decider.decide(job.request, observe=False).placement
            if placement is None:
                kept.append(job)
            else:
                self.start(job, placement, now)
        self.queue = kept

    # ------------------------------------------------------------------ the moving arms
    def period(self, now: float) -> None:
        """The arm's work at a period, then the queue retried."""
        if self.arm == Arm.DEFRAG:
            self.defrag(now)
        elif self.arm == Arm.COUNT_RULE:
            self.count_rule(now)
        self.retry(now)

    def defrag(self, now: float) -> None:
        """Plan with `plan_defrag` and carry every move out as planned (module docstring)."""
        self.expire(now)
        residents = [
            Resident(key, run.placement, run.job.request, gpu_seconds=run.gpus * (now - run.started))
            for key, run in sorted(self.running.items())
        ]
        pending = [Pending(job.key, job.request) for job in self.queue]
        nodes = [facts.name for facts in self.trace.nodes]
        policy = make_policy("gpupack", list(self.trace.pods))  # fresh, as `gpupack defrag` makes one per run
        plan = plan_defrag(self.inventory, residents, pending, nodes, policy, max_evictions=self.config.max_evictions)
        for move in plan.moves:
            restarted = [self.evict(eviction.pod, now) for eviction in move.evictions]
            if move.placement is not None:
                job = next(j for j in self.queue if j.key == move.target)
                self.queue.remove(job)
                self.start(job, move.placement, now)
            for job, eviction in zip(restarted, move.evictions, strict=True):
                self.start(job, eviction.to, now, waited=False)
            self.result.moves += self.counted(now)

    def count_rule(self, now: float) -> None:
        """Evict every pod of the node with the fewest GPUs allocated (of those with pods), to the queue's front."""
        node = lowest_use_node(self.running.values())
        if node is None:
            return
        keys = [
            key for key, run in sorted(self.running.items(), key=lambda kv: kv[1].started) if run.placement.node == node
        ]
        evicted = [self.evict(key, now) for key in keys]
        for job in reversed(evicted):
            self.queue.appendleft(replace(job, queued_at=now))
        self.result.moves += self.counted(now)

    # ------------------------------------------------------------------ samples
    def sample(self, now: float) -> Sample:
        """The cluster now."""
        return {
            "time": round(now, 1),
            "in_use_pct": round(100.0 * self.in_use / self.capacity, 3),
            "stranded_slices": stranded_slices(self.inventory),
            "large_pending": sum(job.large for job in self.queue),
        }


def lowest_use_node(running: Iterable[Running]) -> str | None:
    """The node holding pods with the fewest GPUs allocated (MIG by compute slices / 7), ties by name."""
    held: dict[str, float] = {}
    for run in running:
        held[run.placement.node] = held.get(run.placement.node, 0.0) + run.gpus
    return min(held, key=lambda node: (round(held[node], 9), node)) if held else None


def stranded_slices(inventory: Inventory, profile: str = LARGEST_PROFILE) -> int:
    """Free compute slices on dynamic-MIG GPUs in use by MIG instances on which `profile` does not fit."""
    total = 0
    for row, _, state in gpu_states(inventory):
        family = inventory.models[int(inventory.node_model[row])].mig_family
        if family is None or state.mode != MigMode.DYNAMIC or not state.compute:
            continue
        if not state.fits_shape(resolve_profile(family, profile)[0]):
            total += state.free_compute()
    return total


# ----------------------------------------------------------------------------- one run
def run_defrag_churn(arm: Arm, seed: int, nodes: int = NODES, config: DefragConfig = CONFIG) -> DefragChurnResult:
    """One arm on one seed (module docstring)."""
    return simulate(arm, seed, nodes, config).result


def simulate(arm: Arm, seed: int, nodes: int = NODES, config: DefragConfig = CONFIG) -> Simulation:
    """One arm on one seed, the simulation as it ends: events in time order, departures first at a tie."""
    started = time.perf_counter()
    trace, arrivals = defrag_arrivals(seed, nodes, config.churn)
    life = mean_lifetime(trace.pods, gpu_count(trace.nodes), config.churn.load)
    measured = config.churn.measure * life
    result = DefragChurnResult(arm.value, seed, nodes, life, arrivals_digest(arrivals), measured)
    sim = Simulation(arm, trace, seed, config, result)
    until = (config.churn.warmup + config.churn.measure) * life
    step = measured / config.churn.samples
    period = config.period * life
    next_sample, next_period = sim.counted_from + step, period if arm != Arm.GPUPACK else math.inf
    for arrival in arrivals:
        if arrival.time > until:
            break
        while min(next_sample, next_period) <= arrival.time:
            now = min(next_sample, next_period)
            _departures(sim, now)
            if now == next_period:
                sim.period(now)
                next_period += period
            else:
                result.samples.append(sim.sample(now))
                next_sample += step
        _departures(sim, arrival.time)
        sim.arrive(arrival, arrival.time)
    sim.expire(until)
    result.large_waits += [until - job.queued_at for job in sim.queue if job.large]  # still waiting at the end
    result.seconds = time.perf_counter() - started
    return sim


def _departures(sim: Simulation, until: float) -> None:
    """Every departure up to `until` in time order, the queue retried after each."""
    while sim.leaving and sim.leaving[0][0] <= until:
        now = sim.leaving[0][0]
        if sim.depart_until(now):
            sim.retry(now)


def rebuilt_inventory(sim: Simulation) -> Inventory:
    """A fresh inventory holding exactly the running pods' placements (for checking the live one)."""
    inventory = build_inventory(sim.trace.nodes)
    for run in sim.running.values():
        inventory.commit(run.placement)
    return inventory
