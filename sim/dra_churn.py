"""MIG churn on H100 nodes: gpupack against kube-scheduler with DRA first fit (#30 item 4).

The same seeded arrivals and departures (`sim.churn`'s machinery: `churn_arrivals`, `ChurnConfig`, its
inference-style mix, here only the H100-80GB profiles) are placed by two arms:

- `gpupack`: `scoring.decider.Decider` with the default policy picks node, GPU and MIG placement, as the
  extender decides it (`Decider.seeded`, as `sim.churn` makes it).
- `upstream-first-fit`: a model of kube-scheduler with Dynamic Resource Allocation. The node is the feasible
  node with the highest default score, NodeResourcesFit LeastAllocated plus NodeResourceBalancedAllocation
  over CPU and memory, both in kube-scheduler's integer arithmetic (every pod asks the same CPU and memory,
  so this is the node with the fewest pods, adjacent counts sometimes tying); ties are broken uniformly
  at random (seeded), as `selectHost` does. On that node the allocator takes the first allocatable device
  of the requested profile in the driver's published order. The clusters stay under 100 nodes, so every
  node is scored (percentageOfNodesToScore does not cut the search).

The modelled published order of NVIDIA's DRA driver in DynamicMIG mode: GPUs by minor 0..n-1; per GPU the
profiles 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb; per profile its placements by
increasing start (the H100 starts of `scoring.geometry`). Each device consumes its memory slices and its
multiprocessors (compute slices) from its GPU's counter set; it is allocatable when all its memory slices
are free and enough multiprocessors are left. (The driver also publishes each full GPU as a device; a MIG
request never matches it, so the model leaves it out.)

Both arms commit into their own `Inventory`, so they count with the same state code. A pod that fits
nowhere at arrival is rejected (no retry). The warm-up is not counted, as in `sim.churn`; at each sample
time of the measured part, each probe profile (7g.80gb, 4g.40gb, 3g.40gb) is placeable when some node has
an allocatable device of it and room for the pod (a property of the state alone, the same test for both
arms).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypedDict

import numpy as np

from gpupack.scoring.decider import Decider
from gpupack.scoring.facts import GpuSlot, MigMode, Placement
from gpupack.scoring.geometry import FAMILIES, SHAPES, Shape, resolve_profile, slice_bits
from gpupack.scoring.inventory import MAX_GPUS, Inventory
from gpupack.scoring.request import MILLI_PER_GPU, Kind, PodRequest
from gpupack.sim.churn import (
    FAMILY_PROFILES,
    INFERENCE_SIZES,
    POD_CPU_MILLI,
    POD_MEMORY,
    Arrival,
    ChurnCluster,
    ChurnConfig,
    arrivals_digest,
    churn_arrivals,
    mean_lifetime,
)
from gpupack.sim.scenarios import H100, TIB, ClusterSpec, NodeSpec
from gpupack.sim.simulate import make_policy
from gpupack.sim.workload import Trace, TracePod, gpu_count

H100_FAMILY = FAMILIES["H100-80GB"]
PUBLISHED_PROFILES = ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
PROBES = ("7g.80gb", "4g.40gb", "3g.40gb")  # the profiles whose placeability is sampled, largest first
MAX_NODE_SCORE = 100  # kube-scheduler's framework.MaxNodeScore
NODES = 32  # H100 nodes of the cluster
GPUS_PER_NODE = 8
# tuned on seeds 0-41 only (bench.dra_churn reports 42-51): the lowest load, in steps of 0.05, at which both
# arms rejected pods on every one of those seeds (at 0.9 gpupack rejected none on seeds 3, 5 and 8)
CONFIG = ChurnConfig(load=0.95, warmup=2.0, measure=6.0, samples=200)


class Arm(StrEnum):
    """Who places the pods."""

    GPUPACK = "gpupack"
    FIRST_FIT = "upstream-first-fit"


Device = tuple[int, str, int]  # (GPU minor, profile, start): one MIG device as the driver publishes it


def dra_cluster(nodes: int = NODES) -> ClusterSpec:
    """`nodes` nodes of 8 H100-80GB GPUs in dynamic MIG mode (the churn cluster's node size)."""
    return ClusterSpec("dra-churn", (NodeSpec(H100, nodes, GPUS_PER_NODE, 192_000, 2 * TIB, mig=MigMode.DYNAMIC),))


def h100_pods(count: int = 1000) -> list[TracePod]:
    """`count` pods whose H100 profiles follow `sim.churn.INFERENCE_SIZES`, each asking the same CPU and memory."""
    pods: list[TracePod] = []
    for size, weight in INFERENCE_SIZES:
        profile = FAMILY_PROFILES["80gb"][size]
        for i in range(round(count * weight)):
            request = PodRequest(POD_CPU_MILLI, POD_MEMORY, Kind.MIG, mig=((profile, 1),))
            pods.append(TracePod(f"infer-{profile}-{i:04d}", request, "LS"))
    return pods


def _shape(profile: str) -> tuple[Shape, bool]:
    shape, is_me = resolve_profile(H100_FAMILY, profile)
    return SHAPES[shape], is_me


def published_devices(gpus: int) -> tuple[Device, ...]:
    """Every MIG device of an H100 node of `gpus` GPUs, in the modelled published order (module docstring)."""
    return tuple(
        (minor, profile, start)
        for minor in range(gpus)
        for profile in PUBLISHED_PROFILES
        for start in _shape(profile)[0].starts
    )


# ----------------------------------------------------------------------------- DRA first fit
@functools.cache
def _profile_bits(profile: str) -> tuple[np.ndarray, np.ndarray]:
    """The profile's starts in published order and the memory-slice mask of each."""
    shape, _ = _shape(profile)
    starts = np.array(shape.starts, dtype=np.int64)
    return starts, np.array([slice_bits(shape.size, int(s)) for s in shape.starts], dtype=np.int64)


def _allocatable(inventory: Inventory, profile: str) -> np.ndarray:
    """[node row, GPU minor, start index]: whether that device of `profile` is allocatable now."""
    shape, is_me = _shape(profile)
    _, bits = _profile_bits(profile)
    n = inventory.size
    grid = n * MAX_GPUS

    def per_gpu(array: np.ndarray) -> np.ndarray:
        return array[:grid].reshape(n, MAX_GPUS)

    gpu_ok = (
        (np.arange(MAX_GPUS)[None, :] < inventory.node_gpu_count[:n, None])
        & ~per_gpu(inventory.gpu_whole)
        & (per_gpu(inventory.gpu_milli_free) == MILLI_PER_GPU)
        & (per_gpu(inventory.gpu_compute) + shape.compute <= shape.compute_total)
    )
    if is_me:
        gpu_ok &= per_gpu(inventory.gpu_me) == 0
    slices_free = (per_gpu(inventory.gpu_slices).astype(np.int64)[:, :, None] & bits[None, None, :]) == 0
    return gpu_ok[:, :, None] & slices_free


def _room(inventory: Inventory, request: PodRequest) -> np.ndarray:
    """Per node row: active, dynamic MIG, and room for the pod's CPU, memory and a pod slot."""
    n = inventory.size
    return (
        inventory.node_active[:n]
        & (inventory.node_mig_mode[:n] == MigMode.DYNAMIC)
        & (inventory.node_cpu_free[:n] >= request.cpu_milli)
        & (inventory.node_mem_free[:n] >= request.memory_bytes)
        & (inventory.node_pods_free[:n] >= 1)
    )


def first_fit_devices(inventory: Inventory, request: PodRequest) -> tuple[np.ndarray, list[GpuSlot | None]]:
    """Per node row: feasible (room for the pod and an allocatable device), and the device the allocator
    takes there: the first of the request's profile in published order (lowest minor, then lowest start)."""
    profile = _single_profile(request)
    free = _allocatable(inventory, profile)
    flat = free.reshape(inventory.size, -1)  # minor-major, then start: the published order of one profile
    feasible = _room(inventory, request) & flat.any(axis=1)
    starts, _ = _profile_bits(profile)
    first = flat.argmax(axis=1)
    slots = [
        GpuSlot(int(f) // len(starts), mig=profile, start=int(starts[int(f) % len(starts)])) if ok else None
        for f, ok in zip(first.tolist(), feasible.tolist(), strict=True)
    ]
    return feasible, slots


def _single_profile(request: PodRequest) -> str:
    if request.kind != Kind.MIG or len(request.mig) != 1 or request.mig[0][1] != 1:
        raise ValueError(f"dra_churn: the first-fit model places one MIG instance a pod, not {request}")
    return request.mig[0][0]


def node_scores(inventory: Inventory, request: PodRequest) -> np.ndarray:
    """Per node row: kube-scheduler's LeastAllocated + BalancedAllocation score (CPU and memory, weight 1
    each) with the pod on the node, in the plugins' integer arithmetic."""
    n = inventory.size
    scores = np.zeros(n, dtype=np.int64)
    fractions = []
    for cap, free, asks in (
        (inventory.node_cpu_cap[:n], inventory.node_cpu_free[:n], request.cpu_milli),
        (inventory.node_mem_cap[:n], inventory.node_mem_free[:n], request.memory_bytes),
    ):
        safe = np.maximum(cap, 1)
        requested = cap - free + asks
        scores += np.where(requested <= cap, (cap - requested) * MAX_NODE_SCORE // safe, 0)
        fractions.append(np.minimum(requested / safe, 1.0))
    least = scores // 2
    std = np.abs(fractions[0] - fractions[1]) / 2
    balanced = ((1 - std) * MAX_NODE_SCORE).astype(np.int64)  # truncation, as Go's int64(float)
    return least + balanced


class FirstFit:
    """kube-scheduler + DRA first fit over one inventory (module docstring); nothing is committed."""

    def __init__(self, inventory: Inventory, rng: np.random.Generator) -> None:
        self.inventory = inventory
        self.rng = rng

    def place(self, request: PodRequest) -> Placement | None:
        """Where the pod goes: the best-scored feasible node (seeded random among ties) and its first
        allocatable device; None when no node is feasible."""
        feasible, slots = first_fit_devices(self.inventory, request)
        if not feasible.any():
            return None
        scores = np.where(feasible, node_scores(self.inventory, request), -1)
        ties = np.flatnonzero(scores == scores.max())
        row = int(ties[self.rng.integers(len(ties))])
        slot = slots[row]
        assert slot is not None
        name = self.inventory.names[row]
        assert name is not None
        return Placement(name, (slot,), request.cpu_milli, request.memory_bytes)


def placeable(inventory: Inventory, profile: str) -> bool:
    """Whether a pod of `profile` (the mix's CPU and memory) fits on some node now."""
    request = PodRequest(POD_CPU_MILLI, POD_MEMORY, Kind.MIG, mig=((profile, 1),))
    feasible, _ = first_fit_devices(inventory, request)
    return bool(feasible.any())


# ----------------------------------------------------------------------------- one run
class Sample(TypedDict):
    """The cluster at one sample time."""

    time: float
    in_use_pct: float
    rejected: int  # so far
    placeable: dict[str, bool]  # probe profile -> does a pod of it fit somewhere now


@dataclass
class DraChurnResult:
    """One arm on one seed: pods submitted and rejected by profile (after the warm-up), and the samples."""

    arm: str
    seed: int
    nodes: int
    mean_lifetime: float
    arrivals_digest: str  # the same for both arms of a seed: they saw the same arrivals
    submitted_by_profile: Counter[str] = field(default_factory=Counter)
    rejected_by_profile: Counter[str] = field(default_factory=Counter)
    samples: list[Sample] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def submitted(self) -> int:
        return sum(self.submitted_by_profile.values())

    @property
    def rejected(self) -> int:
        return sum(self.rejected_by_profile.values())

    def placeable_pct(self, profile: str) -> float:
        """Share of the samples at which `profile` was placeable, in %."""
        if not self.samples:
            return 0.0
        return round(100.0 * sum(s["placeable"][profile] for s in self.samples) / len(self.samples), 2)

    def to_json(self) -> dict[str, object]:
        """The run as the bench saves it (samples summarised)."""
        in_use = statistics.fmean(s["in_use_pct"] for s in self.samples) if self.samples else 0.0
        return {
            "arm": self.arm,
            "seed": self.seed,
            "nodes": self.nodes,
            "gpus_total": self.nodes * GPUS_PER_NODE,
            "mean_lifetime": round(self.mean_lifetime, 1),
            "arrivals_digest": self.arrivals_digest,
            "submitted": self.submitted,
            "rejected": self.rejected,
            "submitted_by_profile": dict(sorted(self.submitted_by_profile.items())),
            "rejected_by_profile": dict(sorted(self.rejected_by_profile.items())),
            "placeable_pct": {profile: self.placeable_pct(profile) for profile in PROBES},
            "mean_in_use_pct": round(in_use, 2),
            "samples": len(self.samples),
            "seconds": round(self.seconds, 3),
        }


Placer = Callable[[PodRequest], Placement | None]


def dra_arrivals(seed: int, nodes: int = NODES, config: ChurnConfig = CONFIG) -> tuple[Trace, list[Arrival]]:
    """The cluster and mix of a run, and the seeded arrivals both arms place."""
    trace = Trace(dra_cluster(nodes).build(), h100_pods())
    return trace, churn_arrivals(trace.pods, gpu_count(trace.nodes), seed, config)


def make_placer(arm: Arm, inventory: Inventory, pods: Sequence[TracePod], seed: int) -> Placer:
    """The arm's decision over `inventory`, seeded with `seed`."""
    if arm == Arm.GPUPACK:
        decider = Decider.seeded(inventory, make_policy("gpupack", list(pods)), seed)
        return lambda request: decider.decide(request).placement
    return FirstFit(inventory, np.random.default_rng(seed)).place


def run_dra_churn(arm: Arm, seed: int, nodes: int = NODES, config: ChurnConfig = CONFIG) -> DraChurnResult:
    """One arm on one seed (module docstring)."""
    started = time.perf_counter()
    trace, arrivals = dra_arrivals(seed, nodes, config)
    life = mean_lifetime(trace.pods, gpu_count(trace.nodes), config.load)
    counted_from, until = config.warmup * life, (config.warmup + config.measure) * life
    step = config.measure * life / config.samples
    cluster = ChurnCluster(trace)
    place = make_placer(arm, cluster.inventory, trace.pods, seed)
    result = DraChurnResult(arm.value, seed, nodes, life, arrivals_digest(arrivals))
    next_sample = counted_from + step
    for i, arrival in enumerate(arrivals):
        while next_sample <= min(arrival.time, until):
            cluster.release_until(next_sample)
            result.samples.append(_sample(cluster, next_sample, result.rejected))
            next_sample += step
        cluster.release_until(arrival.time)
        placement = place(arrival.pod.request)
        if placement is not None:
            cluster.commit(placement, arrival.end, i)
        if arrival.time >= counted_from:
            profile = _single_profile(arrival.pod.request)
            result.submitted_by_profile[profile] += 1
            if placement is None:
                result.rejected_by_profile[profile] += 1
    result.seconds = time.perf_counter() - started
    return result


def _sample(cluster: ChurnCluster, now: float, rejected: int) -> Sample:
    return {
        "time": round(now, 1),
        "in_use_pct": round(100.0 * cluster.in_use / cluster.capacity, 2),
        "rejected": rejected,
        "placeable": {profile: placeable(cluster.inventory, profile) for profile in PROBES},
    }
