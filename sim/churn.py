"""The `churn` protocol: pods with lifetimes, arriving and completing over time (#15 item 3).

Where the `fgd` protocol only ever adds pods, here every pod leaves again, so placement decides which
holes the departures leave and whether the next large request finds a whole GPU. It runs on the same
decider and inventory as the extender (`scoring.decider.Decider`, `Inventory.commit` / `release`).

Arrivals: a Poisson process of rate 1 (time is counted in mean inter-arrival gaps); each arrival is a pod
drawn uniformly, with replacement, from the trace's pods (seeded), so the trace's pods are the workload
mix. Lifetimes are exponential, with the mean set so that the offered load — mean GPU demand in service
over GPU capacity — equals `load`: mean lifetime = load x capacity / mean GPU demand per pod. A pod that
fits nowhere is rejected (no retry). The first `warmup` lifetimes fill the cluster and are not counted;
the next `measure` lifetimes are, sampled every `sample_every` time units:

- rejected pods by profile (cumulative, counted from the end of the warm-up);
- stranded GPUs: GPUs with free compute on which no profile still to come in the run fits (the profiles of
  the arrivals after the sample), so free capacity that a later pod can still use is not stranded;
- whether a 4g and a 7g instance of each MIG family in the mix could be placed on some GPU at that moment.
"""

from __future__ import annotations

import hashlib
import heapq
import statistics
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np

from gpupack.scoring.cost import placement_gpus
from gpupack.scoring.decider import Decider
from gpupack.scoring.facts import Placement
from gpupack.scoring.geometry import resource_profile
from gpupack.scoring.policies import PolicySpec
from gpupack.scoring.request import Kind, PodRequest
from gpupack.sim.packing_metrics import stranded_gpus
from gpupack.sim.simulate import build_inventory, kind_label, requested_gpus
from gpupack.sim.workload import Trace, TracePod, gpu_count


@dataclass(frozen=True)
class ChurnConfig:
    """How long and how loaded a churn run is (times in mean lifetimes, load as a share of GPU capacity)."""

    load: float = 0.9
    warmup: float = 2.0
    measure: float = 6.0
    samples: int = 200  # over the measured part


@dataclass(frozen=True)
class Arrival:
    """One pod of the run: when it arrives and when it would complete."""

    pod: TracePod
    time: float
    end: float


def mean_lifetime(pods: Sequence[TracePod], gpus: int, load: float) -> float:
    """Mean lifetime (in mean inter-arrival gaps) that makes the offered load `load` x `gpus`."""
    demand = statistics.fmean(requested_gpus(p.request) for p in pods)
    if demand <= 0:
        raise ValueError("churn: no pod of the trace asks for a GPU")
    return load * gpus / demand


def churn_arrivals(pods: Sequence[TracePod], gpus: int, seed: int, config: ChurnConfig) -> list[Arrival]:
    """The seeded arrivals of one run: Poisson arrivals, pods drawn with replacement, exponential lifetimes."""
    if not pods:
        raise ValueError("churn: the trace has no pods")
    if config.load <= 0 or config.warmup < 0 or config.measure <= 0:
        raise ValueError(f"churn: load and measure must be positive, warmup not negative: {config}")
    rng = np.random.default_rng(seed)
    originals = sorted(pods, key=lambda pod: pod.name)
    life = mean_lifetime(originals, gpus, config.load)
    count = round((config.warmup + config.measure) * life)
    picks = rng.integers(len(originals), size=count)
    times = np.cumsum(rng.exponential(1.0, size=count))
    ends = times + rng.exponential(life, size=count)
    return [
        Arrival(originals[p].clone(f"{originals[p].name}-churn-{i}"), float(t), float(e))
        for i, (p, t, e) in enumerate(zip(picks.tolist(), times.tolist(), ends.tolist(), strict=True))
    ]


class Sample(TypedDict):
    """The cluster at one point in time of a churn run."""

    time: float
    in_use_pct: float
    rejected: int  # so far
    stranded_gpus: int
    stranded_pct: float
    placeable: dict[str, bool]  # probe profile -> would a pod of it fit now


@dataclass
class ChurnResult:
    """One seed's churn run: pods placed and rejected, and the samples over time."""

    seed: int
    mean_lifetime: float
    pods_submitted: int = 0  # counted ones (after the warm-up)
    pods_scheduled: int = 0
    rejected_by_profile: Counter[str] = field(default_factory=Counter)
    samples: list[Sample] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def rejected(self) -> int:
        return sum(self.rejected_by_profile.values())

    def summary(self) -> dict[str, float]:
        """Means over the samples and the totals of the measured part."""
        out: dict[str, float] = {"rejected": self.rejected, "rejected_pct": _pct(self.rejected, self.pods_submitted)}
        if self.samples:
            out["mean_in_use_pct"] = _mean(s["in_use_pct"] for s in self.samples)
            out["mean_stranded_gpus"] = _mean(s["stranded_gpus"] for s in self.samples)
            out["mean_stranded_pct"] = _mean(s["stranded_pct"] for s in self.samples)
            for profile in self.samples[0]["placeable"]:
                hits = sum(s["placeable"][profile] for s in self.samples)
                out[f"placeable_{profile}_pct"] = _pct(hits, len(self.samples))
        return out

    def to_json(self) -> dict[str, object]:
        return {
            "seed": self.seed,
            "mean_lifetime": round(self.mean_lifetime, 1),
            "pods_submitted": self.pods_submitted,
            "pods_scheduled": self.pods_scheduled,
            "alloc_pct_at_100": None,  # the fgd protocol's figures do not apply to a churn run
            "alloc_pct_at_130": None,
            "rejected_by_profile": dict(sorted(self.rejected_by_profile.items())),
            "summary": self.summary(),
            "samples": self.samples,
            "seconds": round(self.seconds, 3),
        }


def _mean(values: Iterable[float]) -> float:
    return round(statistics.fmean(values), 2)


def _pct(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 2) if whole else 0.0


def profile_label(pod: TracePod) -> str:
    """What a pod asks for, as the report names it: its MIG profile, `N GPU`, a share or `cpu only`."""
    request = pod.request
    if request.kind == Kind.MIG:
        return "+".join(profile for profile, _ in request.mig)
    return kind_label(request)


def arrivals_digest(arrivals: Sequence[Arrival]) -> str:
    """A short hash of the arrivals: names, arrival and end times."""
    text = "\n".join(f"{a.pod.name} {a.time!r} {a.end!r}" for a in arrivals)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class ChurnCluster:
    """The inventory under churn: commits, departures in end-time order, and GPUs in use."""

    def __init__(self, trace: Trace) -> None:
        self.inventory = build_inventory(trace.nodes)
        self.capacity = float(self.inventory.gpus_total())
        self.in_use = 0.0
        self._leaving: list[tuple[float, int, Placement]] = []

    def commit(self, placement: Placement, end: float, order: int) -> None:
        self.inventory.commit(placement)
        self.in_use += placement_gpus(self.inventory, placement)
        heapq.heappush(self._leaving, (end, order, placement))

    def release_until(self, time: float) -> None:
        """Every pod that completes by `time` leaves."""
        while self._leaving and self._leaving[0][0] <= time:
            _, _, placement = heapq.heappop(self._leaving)
            self.in_use -= placement_gpus(self.inventory, placement)
            self.inventory.release(placement)


def large_profiles(pods: Sequence[TracePod]) -> dict[str, TracePod]:
    """One pod of each MIG profile of ≥ 4 compute slices in the mix (the requests probed for placeability)."""
    out: dict[str, TracePod] = {}
    for pod in sorted(pods, key=lambda p: p.name):
        if pod.request.kind == Kind.MIG and len(pod.request.mig) == 1 and _compute(pod.request.mig[0][0]) >= 4:
            out.setdefault(pod.request.mig[0][0], pod)
    return dict(sorted(out.items(), key=lambda item: (_compute(item[0]), item[0])))


def _compute(profile: str) -> int:
    head = profile.split("g.", 1)[0]
    return int(head) if head.isdigit() else 0


def run_churn(trace: Trace, policy: PolicySpec, seed: int, config: ChurnConfig = ChurnConfig()) -> ChurnResult:
    """One seed of the churn protocol (module docstring); the inventory is changed only by commits and
    departures, decisions come from the one `Decider`, as in the extender."""
    started = time.perf_counter()
    gpus = gpu_count(trace.nodes)
    arrivals = churn_arrivals(trace.pods, gpus, seed, config)
    life = mean_lifetime(trace.pods, gpus, config.load)
    counted_from, until = config.warmup * life, (config.warmup + config.measure) * life
    step = config.measure * life / config.samples
    cluster = ChurnCluster(trace)
    decider = Decider.seeded(cluster.inventory, policy, seed)
    probes = large_profiles(trace.pods)
    last_seen = {kind_label(a.pod.request): i for i, a in enumerate(arrivals)}
    result = ChurnResult(seed, life)
    next_sample = counted_from + step
    for i, arrival in enumerate(arrivals):
        while next_sample <= min(arrival.time, until):
            cluster.release_until(next_sample)
            to_come = {label: 1 for label, last in last_seen.items() if last >= i}
            result.samples.append(_sample(cluster, decider, probes, to_come, next_sample, result))
            next_sample += step
        cluster.release_until(arrival.time)
        decision = decider.decide(arrival.pod.request)
        if decision.placement is not None:
            cluster.commit(decision.placement, arrival.end, i)
        if arrival.time >= counted_from:
            result.pods_submitted += 1
            if decision.placement is not None:
                result.pods_scheduled += 1
            else:
                result.rejected_by_profile[profile_label(arrival.pod)] += 1
    result.seconds = time.perf_counter() - started
    return result


def _sample(
    cluster: ChurnCluster,
    decider: Decider,
    probes: dict[str, TracePod],
    to_come: dict[str, int],
    now: float,
    result: ChurnResult,
) -> Sample:
    stranding = stranded_gpus(cluster.inventory, to_come)
    return {
        "time": round(now, 1),
        "in_use_pct": _pct(cluster.in_use, cluster.capacity),
        "rejected": result.rejected,
        "stranded_gpus": stranding.stranded,
        "stranded_pct": _pct(stranding.stranded, stranding.gpus),
        "placeable": {profile: decider.look(pod.request).placement is not None for profile, pod in probes.items()},
    }


# ----------------------------------------------------------------------------- the inference-style mix
# share of pods per compute size: many small instances (1g/2g/3g), some 4g and 7g (model servers that
# need a whole or half GPU)
INFERENCE_SIZES = ((1, 0.35), (2, 0.25), (3, 0.20), (4, 0.12), (7, 0.08))
# the profile of each size per MIG family: the 80 GB one runs on A100-80GB and H100-80GB nodes
FAMILY_PROFILES = {
    "80gb": {1: "1g.10gb", 2: "2g.20gb", 3: "3g.40gb", 4: "4g.40gb", 7: "7g.80gb"},
    "h200": {1: "1g.18gb", 2: "2g.35gb", 3: "3g.71gb", 4: "4g.71gb", 7: "7g.141gb"},
}
FAMILY_SHARE = {"80gb": 2 / 3, "h200": 1 / 3}  # as the churn cluster's GPUs: 2/3 A100 + H100, 1/3 H200
POD_CPU_MILLI = 2000
POD_MEMORY = 16 << 30


def inference_pods(count: int = 1000) -> list[TracePod]:
    """`count` pods whose profiles follow INFERENCE_SIZES x FAMILY_SHARE (the churn protocol draws from them)."""
    pods: list[TracePod] = []
    for family, share in FAMILY_SHARE.items():
        for size, weight in INFERENCE_SIZES:
            profile = FAMILY_PROFILES[family][size]
            for i in range(round(count * share * weight)):
                request = PodRequest(POD_CPU_MILLI, POD_MEMORY, Kind.MIG, mig=((profile, 1),))
                pods.append(TracePod(f"infer-{profile}-{i:04d}", request, "LS"))
    return pods


def pod_objects(pods: Sequence[TracePod]) -> list[dict[str, object]]:
    """The mix as v1 Pods (`gpupack simulate --pods` reads them back into the same requests)."""
    from gpupack.kube.keys import RESOURCE_MIG_PREFIX
    from gpupack.kube.objects import make_pod

    objects = []
    for pod in pods:
        request = pod.request
        asks: dict[str, str | int] = {"cpu": f"{request.cpu_milli}m", "memory": str(request.memory_bytes)}
        asks |= {RESOURCE_MIG_PREFIX + resource_profile(profile): count for profile, count in request.mig}
        objects.append(make_pod(pod.name, requests=asks))
    return objects


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m gpupack.sim.churn nodes|pods`: the churn scenario's cluster or pod mix as YAML, for
    `gpupack simulate --protocol churn --nodes ... --pods ...`."""
    import sys

    import yaml

    from gpupack.sim.scenarios import churn_cluster, to_node_yaml

    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["nodes"]:
        sys.stdout.write(to_node_yaml(churn_cluster().build()))
    elif args == ["pods"]:
        items = pod_objects(inference_pods())
        sys.stdout.write(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}, sort_keys=False))
    else:
        print("usage: python -m gpupack.sim.churn {nodes|pods}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
