"""A real uvicorn server on 127.0.0.1 hammered by 200 concurrent filter→bind sequences.

Proves: no two placements overlap and no capacity goes negative (recomputed from every assignment
written), an expired reservation or a bind naming another node is re-decided or refused with a
reason, the server keeps answering, and accepted connections have TCP_NODELAY set.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn

from gpupack.extender.service import extender_config
from gpupack.extender.settings import Settings
from gpupack.extender.state import ClusterState
from gpupack.extender.warm_up import warm_up
from gpupack.kube.pod_request import assignment_from_pod
from gpupack.kube.sources import ClusterFileSource
from gpupack.scoring.facts import Placement
from tests.extender_helpers import A100, L4, FakeClock, assert_no_overlap, file_state, node, pod, write_cluster

PODS = 200
TTL = 5.0


def cluster_nodes() -> list[dict[str, Any]]:
    nodes = [node(f"h100-{i}", mig="dynamic", spot=i % 4 == 0) for i in range(12)]
    for i in range(10):
        layout = {"1g.10gb": 14, "3g.40gb": 4} if i % 2 else {"2g.20gb": 6, "7g.80gb": 2}
        nodes.append(node(f"a100-{i}", A100, 8, static_mig=layout))
    nodes += [node(f"l4-{i}", L4, 4, cpu="48", memory="192Gi") for i in range(14)]
    return nodes


SPARES = [node(f"spare-{i}", L4, 1, cpu="8", memory="32Gi") for i in range(3)]


def pending_pods(rng: random.Random) -> list[dict[str, Any]]:
    pods = []
    for i in range(PODS):
        roll = rng.random()
        if roll < 0.3:
            obj = pod(f"whole-{i}", gpus=rng.choice([1, 1, 2, 4, 8]))
        elif roll < 0.65:
            obj = pod(f"mig-{i}", mig=rng.choice(["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]))
        else:
            obj = pod(f"share-{i}", milli=rng.choice([100, 250, 500, 700]))
        if rng.random() < 0.2:
            obj["metadata"]["annotations"]["gpupack.io/interruptible"] = "true"
        pods.append(obj)
    pods += [pod(f"extra-{i}", gpus=1) for i in range(4)]
    return pods



def placements_of(pods: list[dict[str, Any]]) -> list[Placement]:
    """The placement each pod's assignment annotation records; every pod must have one."""
    placements = [assignment_from_pod(p) for p in pods]
    assert all(placements)
    return [p for p in placements if p is not None]

@dataclass
class Served:
    url: str
    state: ClusterState
    source: ClusterFileSource
    clock: FakeClock
    server: uvicorn.Server
    thread: threading.Thread
    nodes: list[dict[str, Any]]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    nodes = [*cluster_nodes(), *SPARES]
    path = write_cluster(tmp_path_factory.mktemp("conc") / "c.yaml", [*nodes, *pending_pods(random.Random(7))])
    clock = FakeClock()
    settings = Settings(reservation_ttl_seconds=TTL, port=1)
    state, source = file_state(path, settings, clock=clock)
    warm_up(state)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(extender_config(state, settings))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    host, port = sock.getsockname()
    yield Served(f"http://{host}:{port}", state, source, clock, server, thread, nodes)
    server.should_exit = True
    thread.join(5)


def filter_(client: httpx.Client, obj: dict[str, Any], names: list[str]) -> str | None:
    response = client.post("/filter", json={"Pod": obj, "Nodes": None, "NodeNames": names})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["Error"] == ""
    assert len(body["NodeNames"]) <= 1
    return body["NodeNames"][0] if body["NodeNames"] else None


def bind(client: httpx.Client, obj: dict[str, Any], node_name: str) -> str:
    meta = obj["metadata"]
    body = {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node_name}
    response = client.post("/bind", json=body)
    assert response.status_code == 200, response.text
    return response.json()["Error"]


def test_concurrent_filter_and_bind_never_overlap(served: Served) -> None:
    main = [n["metadata"]["name"] for n in cluster_nodes()]
    pods = [p for p in served.source.pods if not p["metadata"]["name"].startswith("extra-")]
    rng = random.Random(11)
    plans = [(obj, rng.random() < 0.1, rng.random() < 0.1) for obj in pods]
    outcomes: dict[str, str] = {}

    def sequence(client: httpx.Client, obj: dict[str, Any], retry: bool, elsewhere: bool) -> None:
        names = rng.sample(main, len(main))
        chosen = filter_(client, obj, names)
        if chosen and retry:
            assert filter_(client, obj, names) == chosen  # kube-scheduler retry: same reservation
        if chosen is None:
            outcomes[obj["metadata"]["name"]] = "unschedulable"
            return
        target = next(n for n in names if n != chosen) if elsewhere else chosen
        error = bind(client, obj, target)
        outcomes[obj["metadata"]["name"]] = "bound" if error == "" else f"refused: {error}"
        if error:
            assert "no longer fits" in error, error

    with httpx.Client(base_url=served.url, timeout=30) as client, ThreadPoolExecutor(24) as pool:
        futures = [pool.submit(sequence, client, *plan) for plan in plans]
        for future in futures:
            future.result()

    kinds = Counter(v.split(":")[0] for v in outcomes.values())
    assert kinds["bound"] > PODS // 2 and kinds["refused"] > 0  # the node-changed path ran under load
    bound = [p for p in served.source.pods if p["spec"].get("nodeName")]
    assert sum(v == "bound" for v in outcomes.values()) == len(bound) > PODS // 2
    placements = placements_of(bound)
    assert_no_overlap(served.nodes, placements)  # raises on any overlap or negative capacity
    held = served.state.placements()
    assert sorted(map(repr, held.values())) == sorted(map(repr, placements))
    assert served.state.snapshot().reservations == {"assumed": 0, "binding": 0}
    assert served.state.unplaced() == []
    assert served.thread.is_alive()


def test_bind_after_expiry_is_re_decided_or_refused(served: Served) -> None:
    extras = {p["metadata"]["name"]: p for p in served.source.pods if p["metadata"]["name"].startswith("extra-")}
    with httpx.Client(base_url=served.url, timeout=30) as client:
        first, second = extras["extra-0"], extras["extra-1"]
        assert filter_(client, first, ["spare-0"]) == "spare-0"
        served.clock.advance(TTL + 1)  # the reservation expires unbound
        assert filter_(client, second, ["spare-0"]) == "spare-0"  # ...so the capacity is free again
        assert bind(client, second, "spare-0") == ""
        error = bind(client, first, "spare-0")
        assert "no longer fits on spare-0" in error
        third = extras["extra-2"]
        assert filter_(client, third, ["spare-1"]) == "spare-1"
        served.clock.advance(TTL + 1)
        assert bind(client, third, "spare-1") == ""  # expired but still fits: re-decided and bound
        # a bind naming another node than the reservation: re-decided there, the old hold released
        fourth = extras["extra-3"]
        assert filter_(client, fourth, ["spare-2", "spare-0"]) == "spare-2"
        assert "no longer fits" in bind(client, fourth, "spare-0")
        assert bind(client, fourth, "spare-2") == ""
        assert client.get("/healthz").status_code == 200
    bound = [p for p in served.source.pods if p["spec"].get("nodeName")]
    assert_no_overlap(served.nodes, placements_of(bound))
    assert served.thread.is_alive()


def test_accepted_connections_have_tcp_nodelay(served: Served) -> None:
    with httpx.Client(base_url=served.url, timeout=10) as client:
        assert client.get("/healthz").status_code == 200
        connections = list(served.server.server_state.connections)
        assert connections
        for protocol in connections:
            sock = protocol.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        started = time.perf_counter()
        for _ in range(20):
            client.get("/healthz")
        assert (time.perf_counter() - started) / 20 < 0.03  # no 40 ms Nagle/delayed-ACK stalls
