"""Shared helpers of the extender tests: Node/Pod builders, a fake clock and writer, overlap checks."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
import yaml

from gpupack.extender.settings import Settings
from gpupack.extender.state import ClusterState
from gpupack.kube.node_facts import facts_from_node
from gpupack.kube.objects import H100, make_node, make_pod
from gpupack.kube.sources import ClusterFileSource, NodeUpserted, PodUpserted, Synced
from gpupack.scoring.facts import Placement
from gpupack.scoring.inventory import Inventory

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_CLUSTER = ROOT / "manifests" / "examples" / "cluster.yaml"

A100 = "NVIDIA-A100-SXM4-80GB"
L4 = "NVIDIA-L4"


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


def node(
    name: str,
    product: str = H100,
    gpus: int = 8,
    *,
    mig: str | None = None,
    static_mig: dict[str, int] | None = None,
    spot: bool = False,
    cpu: str = "192",
    memory: str = "2Ti",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """`make_node` of a test.xlarge node: `mig="dynamic"` for dynamic MIG, `static_mig` for allocatable MIG
    instances (profile -> count; the GPUs they fill are not counted as whole)."""
    notes = dict(annotations or {})
    if mig:
        notes["gpupack.io/mig"] = mig
    allocatable: dict[str, str | int | None] = {}
    if static_mig:
        allocatable = {f"nvidia.com/mig-{profile}": count for profile, count in static_mig.items()}
        allocatable["nvidia.com/gpu"] = gpus - len(_static_gpus(static_mig))
    return make_node(
        name,
        gpus=gpus,
        product=product,
        cpu=cpu,
        memory=memory,
        spot=spot,
        labels={"node.kubernetes.io/instance-type": "test.xlarge"},
        annotations=notes,
        allocatable=allocatable,
    )


def _static_gpus(static_mig: dict[str, int]) -> set[int]:
    # test layouts use one profile per GPU and 7 1g or 2 3g instances per GPU; synthesize_layout decides
    per_gpu = {"1g.10gb": 7, "2g.20gb": 3, "3g.40gb": 2, "7g.80gb": 1}
    gpus = 0
    for profile, count in static_mig.items():
        gpus += -(-count // per_gpu[profile])
    return set(range(gpus))


def pod(
    name: str,
    *,
    gpus: int = 0,
    milli: int = 0,
    mig: str | None = None,
    mig_count: int = 1,
    node_name: str | None = None,
    assignment: dict[str, Any] | str | None = None,
    namespace: str = "default",
    cpu: str = "1",
    memory: str = "1Gi",
    uid: str | None = None,
    scheduler: str = "gpupack",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """`make_pod` asking for whole GPUs, a share or MIG instances (or nothing but CPU); `assignment` is
    written as the gpupack.io/assignment annotation (a dict is JSON-encoded)."""
    limits: dict[str, str | int] = {"cpu": cpu, "memory": memory}
    if gpus:
        limits["nvidia.com/gpu"] = gpus
    if milli:
        limits["gpupack.io/gpu-milli"] = milli
    if mig:
        limits[f"nvidia.com/mig-{mig}"] = mig_count
    notes = dict(annotations or {})
    if assignment is not None:
        notes["gpupack.io/assignment"] = assignment if isinstance(assignment, str) else json.dumps(assignment)
    return make_pod(
        name,
        namespace=namespace,
        uid=uid,
        requests=limits,
        node=node_name or None,
        annotations=notes,
        scheduler=scheduler,
    )


def mixed_kinds_pod(name: str, node_name: str | None = None) -> dict[str, Any]:
    """A pod of another scheduler whose request gpupack cannot read: 4 GPUs plus 7 MIG instances."""
    obj = pod(name, gpus=4, node_name=node_name, scheduler="default-scheduler", cpu="8", memory="64Gi")
    obj["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"] = "7"
    return obj


def state_from(
    nodes: Iterable[dict], pods: Iterable[dict] = (), settings: Settings | None = None, **kw
) -> ClusterState:
    """A synced ClusterState fed the objects as events (no warm-up)."""
    state = ClusterState(settings or Settings(), **kw)
    for obj in nodes:
        state.apply(NodeUpserted(obj))
    for obj in pods:
        state.apply(PodUpserted(obj))
    state.apply(Synced())
    return state


def write_cluster(path: Path, objects: list[dict[str, Any]]) -> Path:
    """A cluster file (`kind: List`)."""
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": objects}))
    return path


def file_state(path: Path, settings: Settings | None = None, **kw) -> tuple[ClusterState, ClusterFileSource]:
    """A ClusterState served from a cluster file, wired to it as writer, synced."""
    state = ClusterState(settings or Settings(), **kw)
    source = ClusterFileSource(path, state.apply)
    state.writer = source
    source.start()
    return state, source


def assert_no_overlap(nodes: Iterable[dict], placements: Iterable[Placement]) -> Inventory:
    """Commit every placement into a fresh inventory: any overlap or negative capacity raises."""
    inventory = Inventory()
    for obj in nodes:
        inventory.add_node(facts_from_node(obj))
    for placement in placements:
        inventory.commit(placement)
    n = inventory.size
    for array in ("node_cpu_free", "node_mem_free", "node_pods_free", "gpu_milli_free"):
        assert (getattr(inventory, array)[: n * (16 if array.startswith("gpu") else 1)] >= 0).all(), array
    return inventory


def assignments_of(pods: Iterable[dict]) -> dict[str, dict[str, Any]]:
    """`namespace/name` -> decoded gpupack.io/assignment of every annotated pod."""
    out = {}
    for obj in pods:
        text = (obj["metadata"].get("annotations") or {}).get("gpupack.io/assignment")
        if text is not None:
            out[f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"] = json.loads(text)
    return out


GPU_ARRAYS = ("gpu_milli_free", "gpu_whole", "gpu_slices", "gpu_compute", "gpu_me", "gpu_static", "gpu_static_used")
NODE_ARRAYS = ("node_cpu_free", "node_mem_free", "node_pods_free")


def inventory_by_node(inventory: Inventory) -> dict[str, tuple]:
    """Each node's free capacity (CPU, memory, pod slots and every per-GPU array), by node name."""
    out = {}
    for name, row in inventory.index.items():
        gpus = inventory.gpu_rows(row)
        node_part = tuple(int(getattr(inventory, a)[row]) for a in NODE_ARRAYS)
        gpu_part = tuple(tuple(int(v) for v in getattr(inventory, a)[gpus]) for a in GPU_ARRAYS)
        out[name] = (node_part, gpu_part)
    return out


def live_pods(pods: Iterable[dict]) -> list[dict]:
    """Pods that hold resources (not Succeeded/Failed)."""
    return [p for p in pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]


def assert_matches_rebuild(
    state: ClusterState, nodes: Iterable[dict], pods: Iterable[dict], settings: Settings | None = None
) -> ClusterState:
    """`state` equals a ClusterState rebuilt from scratch from the same objects (annotations included).

    Checks: no reservation is left (they are not part of the objects), every pod holds the same
    placement in both, every node has the same free capacity in both (nothing leaked or counted
    twice), the same nodes are unusable, and no placement overlaps another or drives capacity negative.
    """
    nodes, pods = list(nodes), live_pods(pods)
    rebuilt = state_from(nodes, pods, settings or state.settings)
    with state.lock:
        assert state.book.live() == [], [r.key for r in state.book.live()]
        assert state.placements() == rebuilt.placements()
        assert inventory_by_node(state.inventory) == inventory_by_node(rebuilt.inventory)
        assert state.bad_nodes() == rebuilt.bad_nodes()
        assert state.unplaced() == rebuilt.unplaced()
    usable = [n for n in nodes if n["metadata"]["name"] in rebuilt.inventory.index]
    assert_no_overlap(usable, rebuilt.placements().values())
    return rebuilt


@contextmanager
def live_server(state: ClusterState, settings: Settings, args: Any = None) -> Iterator[tuple[str, int]]:
    """The extender app served by uvicorn on 127.0.0.1 (a free port) in a thread; yields (host, port)."""
    from gpupack.extender.service import extender_config

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(extender_config(state, settings, args))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield sock.getsockname()
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
