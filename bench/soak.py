"""Soak: many concurrent kube-scheduler-like clients against one extender, checked for leaks and overlaps.

    python -m bench.soak [--calls 100000] [--clients 32] [--nodes 5000] [--quick] [--out bench/results/soak.md]

The extender runs in this process exactly as `gpupack serve --cluster-file` does: a generated cluster
file (GPU nodes of mixed kinds) loaded by the cluster-file source, `ClusterState`, the FastAPI app under
uvicorn on 127.0.0.1 (an ephemeral port; nothing else is ever contacted). A "cluster" thread plays the
API server and the workload controllers: it creates pending pods of mixed kinds (whole GPUs, MIG
instances, shares), hands them to the clients, and deletes pods as they go — the oldest bound pod once
`--live` pods are bound, and every pod that could not be scheduled — so the cluster reaches a steady
state instead of filling up. The clients (threads in separate processes, so that their work does not
compete for this process's GIL) act as kube-scheduler does with `decideInFilter`: `POST /filter` with
`--candidates` node names (kube-scheduler sends the feasible nodes it found: for 5,000 nodes its
default `percentageOfNodesToScore` stops at 10 %, i.e. 500), then `POST /bind` to the node chosen;
one pod in ten is also sent to `/prioritize`.

Reported: errors (any non-200, filter `Error`, bind `Error`, client exception), invariant violations
(at the end, every bound pod's placement is recomputed from its `gpupack.io/assignment` and committed
into a fresh inventory — overlaps, negative capacity, missing or invalid assignments — and the live
state is compared with one rebuilt from the same objects), p50/p99/max latency per verb as the client
sees it, and RSS after warm-up (when `--live` bound pods are first reached) and at the end (growth
must stay within 10 %). Written as a markdown section with its JSON to `--out`, and as JSON beside it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import queue
import random
import socket
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

QUICK = {"calls": 2000, "clients": 8, "nodes": 200}
RSS_GROWTH_LIMIT = 0.10
H100, A100, L4 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "NVIDIA-L4"


@dataclass
class SoakConfig:
    """One soak run."""

    calls: int = 100_000
    clients: int = 32
    nodes: int = 5000
    candidates: int = 500
    live: int | None = None  # bound pods kept before the oldest are deleted (default: see live_target)
    client_processes: int = 1
    seed: int = 1
    max_seconds: float = 1200.0
    scrape_interval: float | None = None  # seconds between GET /metrics from a process of its own (0: nonstop)
    scrape_path: str = "metrics"  # `healthz`: the same scraper on an endpoint that does no work (a control)

    def live_target(self) -> int:
        """Bound pods at steady state: about half the GPUs in use, reached within the first ~40 % of calls."""
        return self.live or max(10, min(self.nodes * 4, self.calls // 5))


@dataclass
class SoakResult:
    """What a soak run measured."""

    config: dict[str, Any]
    calls: int
    seconds: float
    calls_per_second: float
    pods: dict[str, int]
    errors: int
    error_samples: list[str]
    violations: int
    violation_samples: list[str]
    latency_ms: dict[str, dict[str, float]]
    rss_mib: dict[str, float]
    rss_growth_pct: float
    warmed_up_after_calls: int
    stopped_early: bool
    ok: bool = field(default=False)


# ----------------------------------------------------------------------------- cluster objects


# node kind -> (GPU product, GPUs, node annotations, allocatable MIG instances besides whole GPUs)
NODE_KINDS: dict[str, tuple[str, int, dict[str, str], dict[str, int]]] = {
    "h100-mig": (H100, 8, {"gpupack.io/mig": "dynamic"}, {}),
    "a100-mig": (A100, 8, {}, {"1g.10gb": 14, "3g.40gb": 4}),  # static: 2 + 2 GPUs as MIG, 4 whole
    "l4": (L4, 4, {}, {}),
    "h100": (H100, 8, {}, {}),
}


def node_object(name: str, kind: str, spot: bool) -> dict[str, Any]:
    """A Node of one of the NODE_KINDS."""
    from gpupack.kube.objects import make_node

    product, gpus, annotations, mig = NODE_KINDS[kind]
    allocatable: dict[str, str | int | None] = {f"nvidia.com/mig-{profile}": count for profile, count in mig.items()}
    allocatable["nvidia.com/gpu"] = gpus - (2 + 2 if mig else 0)
    labels = {"node.kubernetes.io/instance-type": f"{kind}.soak"}
    return make_node(
        name, gpus=gpus, product=product, spot=spot, labels=labels, annotations=annotations, allocatable=allocatable
    )


def cluster_nodes(count: int) -> list[dict[str, Any]]:
    """`count` nodes: 35 % H100 dynamic MIG, 20 % A100 static MIG, 25 % L4, 20 % H100 whole; 1 in 5 spot."""
    kinds = ["h100-mig"] * 7 + ["a100-mig"] * 4 + ["l4"] * 5 + ["h100"] * 4
    return [node_object(f"soak-{i:05d}", kinds[i % len(kinds)], spot=i % 5 == 0) for i in range(count)]


def pod_object(i: int, rng: random.Random) -> dict[str, Any]:
    """A pending pod: 45 % whole GPUs, 30 % MIG instances, 25 % a share; a fifth are interruptible."""
    roll = rng.random()
    limits: dict[str, str] = {"cpu": "2", "memory": "8Gi"}
    if roll < 0.45:
        limits["nvidia.com/gpu"] = str(rng.choice([1, 1, 1, 1, 2, 2, 4, 8]))
    elif roll < 0.75:
        profile = rng.choice(["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"])
        limits[f"nvidia.com/mig-{profile}"] = "1"
    else:
        limits["gpupack.io/gpu-milli"] = str(rng.choice([100, 250, 500, 700]))
    annotations = {"gpupack.io/interruptible": "true"} if rng.random() < 0.2 else {}
    from gpupack.kube.objects import make_pod

    name, uid = f"soak-pod-{i}", f"soak-uid-{i}"
    return make_pod(name, namespace="soak", uid=uid, requests=limits, annotations=annotations, image="trainer:1")


# ----------------------------------------------------------------------------- clients (child processes)


def client_process(
    port: int,
    threads: int,
    names: list[str],
    candidates: int,
    work: Any,
    results: Any,
    seed: int,
) -> None:
    """Run `threads` kube-scheduler-like loops; each work item is one pod (filter, maybe prioritize, bind)."""
    latencies: dict[str, list[float]] = {"filter": [], "prioritize": [], "bind": []}
    lock = threading.Lock()

    def loop(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        connection = Connection(port)
        mine: dict[str, list[float]] = {verb: [] for verb in latencies}
        while (item := work.get()) is not None:
            key, name, uid, pod_json = item
            try:
                results.put(schedule(connection, mine, rng, names, candidates, key, name, uid, pod_json))
            except Exception as exc:  # a broken connection or answer counts as an error, never silently
                results.put(("error", key, 1, f"{type(exc).__name__}: {exc}"))
                connection = Connection(port)
        with lock:
            for verb, values in mine.items():
                latencies[verb].extend(values)

    pool = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    results.put(("latencies", "", 0, {verb: np.asarray(v, dtype=np.float32) for verb, v in latencies.items()}))


def scraper_process(port: int, interval: float, path: str, stop: Any, results: Any) -> None:
    """GET /`path` every `interval` seconds (0: back to back) until `stop` is set, from a process of its
    own so that its work slows neither the server's nor the clients' interpreter; then report latencies."""
    connection = Connection(port)
    latencies: list[float] = []
    while not stop.wait(interval):
        connection.get(path, latencies)
    results.put(("latencies", "", 0, {"metrics": np.asarray(latencies, dtype=np.float32)}))


class Connection:
    """One keep-alive HTTP/1.1 connection with TCP_NODELAY, as kube-scheduler's Go client keeps."""

    def __init__(self, port: int) -> None:
        self._http = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self._http.connect()
        self._http.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def get(self, path: str, latencies: list[float]) -> None:
        """GET /`path`, timed; RuntimeError unless it answers 200."""
        started = time.perf_counter()
        self._http.request("GET", f"/{path}")
        response = self._http.getresponse()
        response.read()
        latencies.append((time.perf_counter() - started) * 1000)
        if response.status != 200:
            raise RuntimeError(f"{path}: HTTP {response.status}")

    def post(self, verb: str, body: bytes, latencies: dict[str, list[float]]) -> Any:
        started = time.perf_counter()
        self._http.request("POST", f"/{verb}", body=body, headers={"Content-Type": "application/json"})
        response = self._http.getresponse()
        data = response.read()
        latencies[verb].append((time.perf_counter() - started) * 1000)
        if response.status != 200:
            raise RuntimeError(f"{verb}: HTTP {response.status} {data[:200]!r}")
        return orjson.loads(data)


def schedule(
    connection: Connection,
    latencies: dict[str, list[float]],
    rng: random.Random,
    names: list[str],
    candidates: int,
    key: str,
    name: str,
    uid: str,
    pod_json: bytes,
) -> tuple[str, str, int, str]:
    """One pod as kube-scheduler handles it; returns (outcome, key, calls made, detail)."""
    chosen_from = orjson.dumps(rng.sample(names, min(candidates, len(names))))
    body = b'{"Pod":' + pod_json + b',"Nodes":null,"NodeNames":' + chosen_from + b"}"
    calls = 0
    if rng.random() < 0.1:
        calls += 1
        scores = connection.post("prioritize", body, latencies)
        if len(scores) != min(candidates, len(names)):
            return "error", key, calls, f"prioritize answered {len(scores)} scores"
    answer = connection.post("filter", body, latencies)
    calls += 1
    if answer["Error"]:
        return "error", key, calls, f"filter Error: {answer['Error']}"
    if not answer["NodeNames"]:
        return "unschedulable", key, calls, ""
    bind = {"PodName": name, "PodNamespace": "soak", "PodUID": uid, "Node": answer["NodeNames"][0]}
    result = connection.post("bind", orjson.dumps(bind), latencies)
    calls += 1
    if result["Error"]:
        return "error", key, calls, f"bind Error: {result['Error']}"
    return "bound", key, calls, answer["NodeNames"][0]


# ----------------------------------------------------------------------------- the extender side


def rss_mib() -> float:
    """This process's resident set size in MiB (Linux /proc; 0 elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def soak_source_class() -> type:
    """The cluster-file source, plus what a real cluster has and a file does not: pods come and go."""
    from gpupack.kube.pods import pod_key
    from gpupack.kube.sources import ClusterFileSource, PodDeleted

    class SoakCluster(ClusterFileSource):
        """`ClusterFileSource` with pod creation and deletion, announced as a watch would."""

        def create_pod(self, pod: dict[str, Any]) -> None:
            """Add a pending pod (PodUpserted)."""
            with self._lock:
                self._pods[pod_key(pod)] = pod
                self._changed(pod)

        def delete_pod(self, key: str) -> None:
            """Delete a pod (PodDeleted)."""
            with self._lock:
                pod = self._pods.pop(key, None)
                if pod is not None:
                    self._emit(PodDeleted(key, pod["metadata"]["uid"]))

    return SoakCluster


def run(config: SoakConfig, log: Any = None) -> SoakResult:
    """Run one soak and check it; `log` (a callable) gets progress lines."""
    from gpupack.bench.speed import serving
    from gpupack.extender.app import create_app
    from gpupack.extender.settings import Settings
    from gpupack.extender.state import ClusterState
    from gpupack.extender.warm_up import warm_up

    say = log or (lambda _line: None)
    rng = random.Random(config.seed)
    nodes = cluster_nodes(config.nodes)
    with tempfile.TemporaryDirectory(prefix="gpupack-soak-") as folder:
        path = Path(folder) / "cluster.json"
        path.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List", "items": nodes}))
        settings = Settings()
        state = ClusterState(settings)
        source = soak_source_class()(path, state.apply)
        state.writer = source
    source.start()
    warm_up(state)
    app = create_app(state, settings)
    names = [n["metadata"]["name"] for n in nodes]
    context = multiprocessing.get_context("spawn")
    work, results = context.Queue(maxsize=config.clients * 4), context.Queue()
    with serving(app) as url:
        port = int(url.rsplit(":", 1)[1])
        per_process = split(config.clients, config.client_processes)
        children = [
            context.Process(
                target=client_process,
                args=(port, threads, names, config.candidates, work, results, config.seed + i),
                daemon=True,
            )
            for i, threads in enumerate(per_process)
        ]
        stop_scraping = context.Event()
        scraper = None
        if config.scrape_interval is not None:
            scraper = context.Process(
                target=scraper_process,
                args=(port, config.scrape_interval, config.scrape_path, stop_scraping, results),
                daemon=True,
            )
            scraper.start()
        for child in children:
            child.start()
        driver = Driver(config, source, work, results, rng, say)
        driver.run(children)
        stop_scraping.set()
        if scraper is not None:
            driver.drain_latencies(1)
            scraper.join(60)
        for child in children:
            child.join(60)
    violations = check_invariants(state, source, nodes)
    return driver.result(config, violations)


def split(total: int, parts: int) -> list[int]:
    """`total` threads over `parts` processes, as evenly as possible."""
    parts = max(1, min(parts, total))
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


class Driver:
    """The API server and the workload controllers: feeds pods, collects outcomes, deletes pods."""

    def __init__(self, config: SoakConfig, source: Any, work: Any, results: Any, rng: random.Random, say: Any):
        self.config = config
        self.source = source
        self.work = work
        self.results = results
        self.rng = rng
        self.say = say
        self.live: deque[str] = deque()
        self.outcomes: Counter[str] = Counter()
        self.errors: list[str] = []
        self.calls = 0
        self.issued = 0
        self.outstanding = 0
        self.latencies: dict[str, list[np.ndarray]] = {"filter": [], "prioritize": [], "bind": [], "metrics": []}
        self.rss: dict[str, float] = {"start": rss_mib()}
        self.warm_calls = 0
        self.started = time.perf_counter()
        self.seconds = 0.0
        self.stopped_early = False

    def run(self, children: Sequence[Any]) -> None:
        """Feed pods until the call budget (or the time limit) is used, then drain and stop the clients."""
        target = self.config.calls
        next_report = 0.0
        while True:
            elapsed = time.perf_counter() - self.started
            if elapsed > self.config.max_seconds and not self.stopped_early:
                self.stopped_early = True
                self.say(f"time limit of {self.config.max_seconds:.0f} s reached after {self.calls} calls")
            feeding = not self.stopped_early and self.calls + 2 * self.outstanding < target
            if feeding and self.offer():
                continue
            if not feeding and self.outstanding == 0:
                break
            self.collect(timeout=0.05)
            if elapsed >= next_report:
                self.say(f"{elapsed:6.0f} s  {self.calls:7d} calls  {len(self.live):6d} bound  {rss_mib():7.1f} MiB")
                next_report = elapsed + 10
            if not any(child.is_alive() for child in children):
                raise RuntimeError("every client process died")
        self.seconds = time.perf_counter() - self.started
        self.rss["end"] = rss_mib()
        for _ in range(self.config.clients):  # one stop sign per client thread
            self.work.put(None)
        self.drain_latencies(len(children))

    def drain_latencies(self, senders: int) -> None:
        """Wait for the latencies of `senders` finished processes and keep them."""
        while senders:
            outcome, _key, _calls, detail = self.results.get(timeout=120)
            if outcome == "latencies":
                for verb, values in detail.items():
                    self.latencies[verb].append(values)
                senders -= 1

    def offer(self) -> bool:
        """Create one pending pod and queue it for a client; False when the queue is full."""
        if self.work.full():  # only this thread puts, so a queue not full now has room below
            return False
        obj = pod_object(self.issued, self.rng)
        meta = obj["metadata"]
        self.source.create_pod(obj)  # the pod exists before any client can filter or bind it
        self.work.put((f"soak/{meta['name']}", meta["name"], meta["uid"], orjson.dumps(obj)))
        self.issued += 1
        self.outstanding += 1
        return True

    def collect(self, timeout: float) -> None:
        """Apply every outcome reported so far (waiting up to `timeout` for the first)."""
        try:
            item = self.results.get(timeout=timeout)
        except queue.Empty:
            return
        while True:
            self.apply(*item)
            try:
                item = self.results.get_nowait()
            except queue.Empty:
                return

    def apply(self, outcome: str, key: str, calls: int, detail: Any) -> None:
        if outcome == "latencies":  # a client finished early (should not happen before the drain)
            for verb, values in detail.items():
                self.latencies[verb].append(values)
            return
        self.outstanding -= 1
        self.calls += calls
        self.outcomes[outcome] += 1
        if outcome == "bound":
            self.live.append(key)
            while len(self.live) > self.config.live_target():
                self.source.delete_pod(self.live.popleft())
            if not self.warm_calls and len(self.live) >= self.config.live_target():
                self.warm_calls = self.calls
                self.rss["after_warm_up"] = rss_mib()
                self.say(f"steady state after {self.calls} calls: {self.rss['after_warm_up']:.1f} MiB")
            return
        if outcome == "error":
            self.errors.append(f"{key}: {detail}")
        self.source.delete_pod(key)  # unschedulable (or failed) pods give up, as a Job would

    def result(self, config: SoakConfig, violations: list[str]) -> SoakResult:
        """The measured numbers and the verdict."""
        warm = self.rss.get("after_warm_up") or self.rss["start"]
        growth = (self.rss["end"] - warm) / warm * 100 if warm else 0.0
        latency = {}
        for verb, chunks in self.latencies.items():
            values = np.concatenate(chunks) if chunks else np.zeros(0)
            if len(values):
                p50, p99 = np.percentile(values, [50, 99])
                latency[verb] = {
                    "count": len(values),
                    "p50": round(float(p50), 3),
                    "p99": round(float(p99), 3),
                    "max": round(float(values.max()), 3),
                }
        result = SoakResult(
            config={**asdict(config), "live": config.live_target()},
            calls=self.calls,
            seconds=round(self.seconds, 1),
            calls_per_second=round(self.calls / self.seconds, 1) if self.seconds else 0.0,
            pods=dict(self.outcomes, created=self.issued, bound_at_end=len(self.live)),
            errors=len(self.errors),
            error_samples=self.errors[:10],
            violations=len(violations),
            violation_samples=violations[:10],
            latency_ms=latency,
            rss_mib={k: round(v, 1) for k, v in self.rss.items()},
            rss_growth_pct=round(growth, 2),
            warmed_up_after_calls=self.warm_calls,
            stopped_early=self.stopped_early,
        )
        result.ok = not result.errors and not result.violations and growth <= RSS_GROWTH_LIMIT * 100
        return result


def check_invariants(state: Any, source: Any, nodes: list[dict[str, Any]]) -> list[str]:
    """Every way the end state can be wrong, as readable lines (empty: all good).

    From the objects alone: every bound pod has a valid assignment, and all of them together fit the
    nodes with no overlap and no negative capacity. Then the live state: no reservation left, every
    pod holds what its assignment says, and a state rebuilt from scratch from the same objects has the
    same free capacity on every node (nothing leaked, nothing counted twice).
    """
    from gpupack.extender.state import ClusterState
    from gpupack.kube.node_facts import facts_from_node
    from gpupack.kube.pod_request import AssignmentError, assignment_from_pod
    from gpupack.kube.pods import pod_key
    from gpupack.kube.sources import NodeUpserted, PodUpserted, Synced
    from gpupack.scoring.inventory import Inventory, InventoryError

    problems: list[str] = []
    inventory = Inventory()
    for obj in nodes:
        inventory.add_node(facts_from_node(obj))
    bound = [p for p in source.pods if (p.get("spec") or {}).get("nodeName")]
    recomputed = {}
    for obj in bound:
        try:
            placement = assignment_from_pod(obj)
        except (AssignmentError, ValueError) as exc:
            problems.append(f"{pod_key(obj)}: invalid assignment: {exc}")
            continue
        if placement is None:
            problems.append(f"{pod_key(obj)}: bound without an assignment")
            continue
        try:
            inventory.commit(placement)
        except InventoryError as exc:
            problems.append(f"{pod_key(obj)}: overlaps: {exc}")
        recomputed[obj["metadata"]["uid"]] = placement
    n = inventory.size
    for array, width in (("node_cpu_free", 1), ("node_mem_free", 1), ("node_pods_free", 1), ("gpu_milli_free", 16)):
        if (getattr(inventory, array)[: n * width] < 0).any():
            problems.append(f"negative {array}")
    live = state.book.live()
    if live:
        problems.append(f"{len(live)} reservations left: {[r.key for r in live[:5]]}")
    held = state.placements()
    for uid, placement in recomputed.items():
        if held.get(uid) != placement:
            problems.append(f"{uid}: holds {held.get(uid)} but its assignment says {placement}")
    extra = set(held) - set(recomputed)
    if extra:
        problems.append(f"{len(extra)} placements held for pods not bound: {sorted(extra)[:5]}")
    rebuilt = ClusterState(state.settings)
    for obj in nodes:
        rebuilt.apply(NodeUpserted(obj))
    for obj in source.pods:
        rebuilt.apply(PodUpserted(obj))
    rebuilt.apply(Synced())
    for name, row in state.inventory.index.items():
        other = rebuilt.inventory.index[name]
        mine, theirs = free_capacity(state.inventory, row), free_capacity(rebuilt.inventory, other)
        if mine != theirs:
            problems.append(f"node {name}: free capacity {mine} differs from a rebuild's {theirs}")
    return problems


def free_capacity(inventory: Any, row: int) -> tuple:
    """A node's free CPU, memory, pod slots and per-GPU state, comparable across inventories."""
    gpus = inventory.gpu_rows(row)
    per_gpu = ("gpu_milli_free", "gpu_whole", "gpu_slices", "gpu_compute", "gpu_static_used")
    return (
        int(inventory.node_cpu_free[row]),
        int(inventory.node_mem_free[row]),
        int(inventory.node_pods_free[row]),
        *(tuple(int(v) for v in getattr(inventory, array)[gpus]) for array in per_gpu),
    )


# ----------------------------------------------------------------------------- report


def markdown(result: SoakResult) -> str:
    """A short markdown section for the bench report, with the JSON below it."""
    c = result.config
    lines = [
        "## Soak",
        "",
        f"{result.calls:,} calls from {c['clients']} concurrent clients over {c['nodes']:,} nodes "
        f"({c['candidates']} candidates per filter, {c['live']:,} bound pods at steady state) in "
        f"{result.seconds:,.0f} s ({result.calls_per_second:,.0f} calls/s), 127.0.0.1 only."
        + (" **Stopped early at the time limit.**" if result.stopped_early else ""),
        "",
        f"- errors: **{result.errors}**, invariant violations: **{result.violations}**",
        f"- one decision lock serialises the verbs, so {c['clients']} closed-loop clients mostly measure "
        f"queueing: {result.seconds * 1000 / max(result.calls, 1):.2f} ms of wall time per call",
        f"- pods: {result.pods.get('created', 0):,} created, {result.pods.get('bound', 0):,} bound, "
        f"{result.pods.get('unschedulable', 0):,} unschedulable (deleted), {result.pods.get('bound_at_end', 0):,} "
        "bound at the end",
        f"- RSS: {result.rss_mib.get('after_warm_up', 0):.1f} MiB after warm-up "
        f"({result.warmed_up_after_calls:,} calls), {result.rss_mib.get('end', 0):.1f} MiB at the end: "
        f"{result.rss_growth_pct:+.1f} % (limit +{RSS_GROWTH_LIMIT * 100:.0f} %)",
        *scrape_line(c.get("scrape_interval")),
        f"- verdict: **{'pass' if result.ok else 'FAIL'}**",
        "",
        "| verb | calls | p50 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for verb, row in result.latency_ms.items():
        lines.append(f"| {verb} | {row['count']:,} | {row['p50']:.2f} | {row['p99']:.2f} | {row['max']:.1f} |")
    lines += ["", "```json", json.dumps(asdict(result), indent=2), "```", ""]
    return "\n".join(lines)


def scrape_line(interval: float | None) -> list[str]:
    """The report line saying how /metrics was scraped during the run (none when it was not)."""
    if interval is None:
        return []
    how = "back to back" if interval == 0 else f"every {interval:g} s"
    return [f"- `/metrics` scraped {how} from a process of its own during the whole run (the `metrics` row)"]


def parse_args(argv: Sequence[str] | None) -> tuple[SoakConfig, Path]:
    parser = argparse.ArgumentParser(prog="python -m gpupack.bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, help="filter/prioritize/bind calls in all (default 100000)")
    parser.add_argument("--clients", type=int, help="concurrent clients (default 32)")
    parser.add_argument("--nodes", type=int, help="nodes in the generated cluster (default 5000)")
    parser.add_argument("--candidates", type=int, default=500, help="node names per filter (default 500)")
    parser.add_argument("--live", type=int, help="bound pods kept before the oldest are deleted")
    parser.add_argument("--client-processes", type=int, default=1, help="processes the clients run in")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-seconds", type=float, default=1200.0, help="stop feeding pods after this")
    parser.add_argument("--scrape-interval", type=float, help="GET /metrics every S seconds meanwhile (0: nonstop)")
    parser.add_argument(
        "--scrape-path", default="metrics", help="what the scraper GETs (healthz: a control that does no work)"
    )
    parser.add_argument("--quick", action="store_true", help="2000 calls, 8 clients, 200 nodes (a smoke test)")
    parser.add_argument("--out", default="bench/results/soak.md", help="markdown report (JSON beside it)")
    args = parser.parse_args(argv)
    sizes = dict(QUICK) if args.quick else {"calls": 100_000, "clients": 32, "nodes": 5000}
    sizes.update({k: v for k, v in (("calls", args.calls), ("clients", args.clients), ("nodes", args.nodes)) if v})
    config = SoakConfig(
        **sizes,
        candidates=args.candidates,
        live=args.live,
        client_processes=args.client_processes,
        seed=args.seed,
        max_seconds=args.max_seconds,
        scrape_interval=args.scrape_interval,
        scrape_path=args.scrape_path,
    )
    return config, Path(args.out)


def write(result: SoakResult, out: Path) -> None:
    """The markdown section to `out` and the JSON to `out` with a .json suffix."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown(result))
    out.with_suffix(".json").write_text(json.dumps(asdict(result), indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    config, out = parse_args(argv)
    result = run(config, log=say)
    write(result, out)
    print(markdown(result).split("```json")[0])
    return 0 if result.ok else 1


def say(line: str) -> None:
    """Progress to standard error."""
    print(line, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
