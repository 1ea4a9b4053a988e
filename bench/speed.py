"""Speed: kernel time per pod (numba engine vs plain-Python reference) and extender HTTP filter latency.

Kernel: N nodes x 8 H100-like GPUs with random allocations; one 1-GPU pod decided repeatedly (nothing
is committed, so every call sees the same inventory).
HTTP: `gpupack serve --cluster-file` runs as a child process on 127.0.0.1 (a free port); a keep-alive
`httpx.Client` in another process posts `/filter` bodies of a 1-GPU pod in NodeNames mode
(nodeCacheCapable: true) and in Nodes mode (the Node objects in the body). Each request is a new
pod, so filter reserves one GPU per request; the cluster holds 8 GPUs per node, far more than the
requests, so it never fills up. Each request lists the candidates in a fresh random order, as
kube-scheduler does: its filter runs nodes in parallel and sends them in the order they finished.
A bare FastAPI handler that reads the same body and answers a constant is measured alongside, in its own
process under the same uvicorn config.
"""

from __future__ import annotations

import multiprocessing
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from gpupack.scoring import policies
from gpupack.scoring.engine import Engine
from gpupack.scoring.facts import GpuSlot, NodeFacts, Placement
from gpupack.scoring.inventory import Inventory
from gpupack.scoring.reference import reference_decide
from gpupack.scoring.request import Kind, PodRequest
from gpupack.sim.scenarios import H100, TIB, NodeSpec
from gpupack.sim.simulate import build_inventory

POD_REQUEST = PodRequest(4000, 16 << 30, Kind.WHOLE, gpus=1)
OTHER_REQUEST = PodRequest(4001, 16 << 30, Kind.WHOLE, gpus=1)  # another shape: the memo does not apply
COLD_CALLS = 5  # decisions on a fresh engine, whose per-node caches are empty
SPEED_POLICIES = ("gpupack", "best-fit")


def h100_nodes(count: int) -> list[NodeFacts]:
    """`count` nodes of 8 H100-like GPUs, 192 cores, 2 TiB."""
    spec = NodeSpec(H100, count, 8, 192_000, 2 * TIB, prefix="node")
    return [spec.facts(i) for i in range(count)]


def busy_inventory(count: int, seed: int = 7) -> Inventory:
    """`h100_nodes(count)` with random allocations: 0-7 whole GPUs per node and a share on some others."""
    inventory = build_inventory(h100_nodes(count))
    rng = np.random.default_rng(seed)
    for row in range(count):
        name = inventory.names[row]
        assert name is not None
        whole = int(rng.integers(0, 8))
        if whole:
            inventory.commit(Placement(name, tuple(GpuSlot(j) for j in range(whole)), 4000 * whole, (16 << 30) * whole))
        if whole < 7 and rng.random() < 0.5:
            inventory.commit(Placement(name, (GpuSlot(whole, milli=int(rng.integers(1, 10)) * 100),), 2000, 8 << 30))
    return inventory


def _mean_ms(call: Callable[[], object], calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - started) * 1000.0 / calls


def kernel_times(node_counts: Sequence[int], numba_calls: int, reference_calls: int) -> list[dict[str, object]]:
    """Mean ms per decision of the numba engine and the reference, per node count and policy.

    numba: warm, the engine's per-node memo holds every node's verdict and score, as in the extender,
    where kube-scheduler sends the same candidates and a decision changes one node; shape changed:
    every call asks for another shape than the one before, so every node is scored again (from its
    cached sums); cold: a fresh engine, which reads every node in full.
    The reference gets `reference_calls` calls at 1,000 nodes and proportionally fewer (at least one)
    on larger clusters.
    """
    rows: list[dict[str, object]] = []
    for count in node_counts:
        inventory = busy_inventory(count)
        for name in SPEED_POLICIES:
            rows.append(_kernel_row(inventory, count, name, numba_calls, reference_calls))
    return rows


def _kernel_row(
    inventory: Inventory, count: int, name: str, numba_calls: int, reference_calls: int
) -> dict[str, object]:
    """One row of `kernel_times`: policy `name` on `inventory` (`count` nodes)."""
    spec = policies.gpupack() if name == "gpupack" else policies.baseline(name)
    engine = Engine(inventory, spec)
    first = engine.decide(POD_REQUEST)  # compiles or loads the kernel; fills the caches
    cold_ms = _mean_ms(lambda: Engine(inventory, spec).decide(POD_REQUEST), COLD_CALLS)
    numba_ms = _mean_ms(lambda: engine.decide(POD_REQUEST), numba_calls)
    shapes = iter([OTHER_REQUEST, POD_REQUEST] * numba_calls)
    changed_ms = _mean_ms(lambda: engine.decide(next(shapes)), numba_calls)
    ref_n = max(1, min(reference_calls, round(reference_calls * 1000 / count)))
    ref_ms = _mean_ms(lambda: reference_decide(inventory, spec, POD_REQUEST), ref_n)
    same = reference_decide(inventory, spec, POD_REQUEST).node == first.node
    return {
        "nodes": count,
        "policy": name,
        "numba_ms": round(numba_ms, 3),
        "numba_shape_changed_ms": round(changed_ms, 3),
        "numba_cold_ms": round(cold_ms, 3),
        "numba_calls": numba_calls,
        "reference_ms": round(ref_ms, 1),
        "reference_calls": ref_n,
        "ratio": round(ref_ms / changed_ms, 1),  # both score every node
        "same_choice": same,
    }


# ----------------------------------------------------------------------------- HTTP
def bare_app() -> FastAPI:
    """A FastAPI app whose `/filter` reads the body and answers a constant."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    answer = b'{"NodeNames":[],"FailedNodes":{},"FailedAndUnresolvableNodes":{},"Error":""}'

    @app.post("/filter")
    async def filter_(request: Request) -> Response:
        await request.body()
        return Response(content=answer, media_type="application/json")

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response(content=b"{}", media_type="application/json")

    return app


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """Run `app` under uvicorn (gpupack's config) in a thread on 127.0.0.1:<ephemeral>; yields its URL."""
    import uvicorn

    from gpupack.extender.service import uvicorn_config
    from gpupack.extender.settings import Settings

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    host, port = sock.getsockname()
    server = uvicorn.Server(uvicorn_config(app, Settings(host=host, port=port)))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def server_process(command: Sequence[str], port: int, ready_path: str, timeout: float = 180) -> Iterator[str]:
    """Run the server `command` (listening on 127.0.0.1:`port`) as a child process; yields its URL once
    `ready_path` answers 200, stops it afterwards."""
    with server_child(command, port, ready_path, timeout):
        yield f"http://127.0.0.1:{port}"


@contextmanager
def server_child(
    command: Sequence[str],
    port: int,
    ready_path: str,
    timeout: float = 180,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[subprocess.Popen]:
    """`server_process`, yielding the child process (run in `cwd` with `env` when given)."""
    import httpx

    url = f"http://127.0.0.1:{port}"
    child = subprocess.Popen(
        list(command), cwd=cwd, env=None if env is None else dict(env), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + timeout
        while True:
            if child.poll() is not None:
                raise RuntimeError(f"{command[2:4]} exited with {child.returncode} before it was ready")
            try:
                if httpx.get(url + ready_path, timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{command[2:4]} not ready within {timeout:g} s")
            time.sleep(0.2)
        yield child
    finally:
        stop_process(child)


def stop_process(child: subprocess.Popen, grace: float = 15) -> None:
    """SIGTERM, then SIGKILL if `child` has not exited after `grace` seconds."""
    child.terminate()
    try:
        child.wait(grace)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait(5)


def gpupack_server(cluster_file: Path, config: Path | None = None) -> tuple[list[str], int, str]:
    """(command, port, ready path) of `gpupack serve --cluster-file [--config]`, exactly as a user runs it."""
    port = free_port()
    command = [sys.executable, "-m", "gpupack.cli", "serve", "--cluster-file", str(cluster_file)]
    if config is not None:
        command += ["--config", str(config)]
    return [*command, "--port", str(port)], port, "/readyz"


def bare_server() -> tuple[list[str], int, str]:
    """(command, port, ready path) of `bare_app` under uvicorn with gpupack's config (`python -m bench.speed`)."""
    port = free_port()
    return [sys.executable, "-m", "gpupack.bench.speed", "--bare-port", str(port)], port, "/healthz"


def serve_bare(port: int) -> None:
    """Serve `bare_app` on 127.0.0.1:`port` until interrupted."""
    import uvicorn

    from gpupack.extender.service import uvicorn_config
    from gpupack.extender.settings import Settings

    uvicorn.Server(uvicorn_config(bare_app(), Settings(port=port))).run()


def pod_object(i: int) -> dict[str, Any]:
    """A 1-GPU pod, new name and uid per `i`."""
    resources = {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}
    return {
        "metadata": {"name": f"bench-{i}", "namespace": "bench", "uid": f"bench-uid-{i}"},
        "spec": {"containers": [{"name": "main", "resources": {"requests": resources, "limits": resources}}]},
    }


def filter_body(pod_number: int, tail: bytes) -> bytes:
    """`{"Pod": <pod_object(pod_number)>` followed by `tail` (the candidates and the closing brace)."""
    return b'{"Pod":' + orjson.dumps(pod_object(pod_number)) + tail


@dataclass(frozen=True)
class Candidates:
    """The candidates part of a filter body: `head` + a JSON array of `elements` + `end`."""

    head: bytes
    elements: tuple[bytes, ...]
    end: bytes

    def tail(self, order: random.Random | None = None) -> bytes:
        """The bytes after the Pod, elements in a random order drawn from `order` (else as given)."""
        elements = list(self.elements)
        if order is not None:
            order.shuffle(elements)
        return self.head + b"[" + b",".join(elements) + b"]" + self.end


def client_latencies(url: str, candidates: Candidates, first_pod: int, requests: int, warmup: int) -> list[float]:
    """ms of each `POST /filter` after `warmup` unmeasured ones, one new pod and candidate order per request.

    Runs in its own process (see `http_latency`), as kube-scheduler does.
    """
    import httpx

    times: list[float] = []
    order = random.Random(first_pod)
    with httpx.Client(base_url=url, timeout=120, headers={"content-type": "application/json"}) as client:
        for i in range(warmup + requests):
            body = filter_body(first_pod + i, candidates.tail(order))
            started = time.perf_counter()
            response = client.post("/filter", content=body)
            elapsed = time.perf_counter() - started
            if response.status_code != 200 or orjson.loads(response.content).get("Error"):
                raise RuntimeError(f"filter failed: {response.status_code} {response.text[:200]}")
            if i >= warmup:
                times.append(elapsed * 1000.0)
    return times


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation."""
    return float(np.percentile(np.asarray(values), q))


HTTP_ROUNDS = 3  # per server and form, alternating between the servers
HTTP_WARMUP = 20  # unmeasured requests before each round
FULL_MAP = "gpupack, reportNotChosen"  # FailedNodes also names every feasible candidate not chosen


def http_latency(node_counts: Sequence[int], requests: int, warmup: int = HTTP_WARMUP) -> list[dict[str, object]]:
    """p50/p99 ms of `/filter` for gpupack and a bare handler, NodeNames and Nodes mode, per node count.

    Each server is a process of its own: `gpupack serve --cluster-file` as users run it (its logs, its
    GC settings, its default config), and the bare app under the same uvicorn config; in NodeNames
    mode also gpupack with `reportNotChosen: true`. The client is another process. The servers run
    at once and are measured in HTTP_ROUNDS alternating rounds (`warmup` unmeasured requests each),
    so a slow spell of this shared machine falls on all; the percentiles are over all `requests` of
    a server. Each row has its ratio to the bare handler's p50 and p99.
    """
    from gpupack.sim.scenarios import node_objects

    rows: list[dict[str, object]] = []
    offset = 0
    per_round = -(-requests // HTTP_ROUNDS)
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as client, tempfile.TemporaryDirectory() as folder:
        full_map = Path(folder) / "report-not-chosen.yaml"
        full_map.write_text("reportNotChosen: true\n")
        for count in node_counts:
            objects = node_objects(h100_nodes(count))
            cluster_file = Path(folder) / f"cluster-{count}.json"
            cluster_file.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "NodeList", "items": objects}))
            forms = {
                "NodeNames": Candidates(
                    b',"Nodes":null,"NodeNames":', tuple(orjson.dumps(o["metadata"]["name"]) for o in objects), b"}"
                ),
                "Nodes": Candidates(
                    b',"NodeNames":null,"Nodes":{"metadata":{},"items":', tuple(map(orjson.dumps, objects)), b"}}"
                ),
            }
            with (
                server_process(*gpupack_server(cluster_file)) as gpupack,
                server_process(*gpupack_server(cluster_file, full_map)) as gpupack_full,
                server_process(*bare_server()) as bare,
            ):
                for form, candidates in forms.items():
                    servers = {"gpupack": gpupack, "bare FastAPI": bare}
                    if form == "NodeNames":
                        servers[FULL_MAP] = gpupack_full
                    times: dict[str, list[float]] = {server: [] for server in servers}
                    for _ in range(HTTP_ROUNDS):
                        for server, url in servers.items():
                            measured = client.submit(client_latencies, url, candidates, offset, per_round, warmup)
                            times[server] += measured.result()
                            offset += per_round + warmup
                    bare_p50, bare_p99 = statistics.median(times["bare FastAPI"]), percentile(times["bare FastAPI"], 99)
                    for server, values in times.items():
                        p50, p99 = statistics.median(values), percentile(values, 99)
                        rows.append(
                            {
                                "nodes": count,
                                "server": server,
                                "mode": form,
                                "requests": len(values),
                                "body_kib": round(len(filter_body(0, candidates.tail())) / 1024, 1),
                                "p50_ms": round(p50, 2),
                                "p99_ms": round(p99, 2),
                                "p50_vs_bare": round(p50 / bare_p50, 2),
                                "p99_vs_bare": round(p99 / bare_p99, 2),
                            }
                        )
    return rows


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="the bare handler of the HTTP benchmark")
    parser.add_argument("--bare-port", type=int, required=True)
    serve_bare(parser.parse_args().bare_port)
