"""Worst-case bodies against `gpupack serve`: peak memory and answer times under the deployed limits (#13 item 3).

`python -m bench.worst_case [--repo PATH] [--nodes 5000]` starts `python -m extender.cli serve
--cluster-file` from `--repo` (default: this checkout; another tree, e.g. an older commit's
`git worktree`, is run with its own code on PYTHONPATH) over generated H100 nodes, then sends:

1. `/filter` with 16 MiB of unknown NodeNames (the largest body `maxBodyBytes` lets in);
2. four concurrent `/prioritize` bodies of the same 16 MiB;
3. `/filter` for a pod whose `metadata.uid` is 4 MiB.

Per case: HTTP status, answer size, answer time, the server's peak RSS (VmHWM, reset before each
case through /proc/<pid>/clear_refs) and how long the server kept a CPU busy after the last answer
(work nobody waits for). The memory limit is the gpupack container's in manifests/deployment.yaml.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import yaml

from gpupack.bench.speed import free_port, h100_nodes, pod_object, server_child
from gpupack.sim.scenarios import node_objects

BODY_BYTES = (16 << 20) - 4096  # just under the default maxBodyBytes
UID_BYTES = 4 << 20
CLIENT_TIMEOUT = 120.0  # far past kube-scheduler's 5 s: the point is to see when gpupack answers
IDLE_CPU_SECONDS = 0.05  # the server counts as idle once it uses less CPU than this in a second
MANIFESTS = Path(__file__).resolve().parent.parent / "manifests"


@dataclass
class Outcome:
    """What one case did to the server."""

    case: str
    statuses: list[int]
    answer_bytes: int
    answer_seconds: float  # the slowest answer
    peak_rss_mib: float
    busy_after_seconds: float  # CPU still in use after the last answer


def memory_limit_mib() -> float:
    """The gpupack container's memory limit in manifests/deployment.yaml, in MiB."""
    for document in yaml.safe_load_all((MANIFESTS / "deployment.yaml").read_text()):
        for container in (document or {}).get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            if container["name"] == "gpupack":
                limit = container["resources"]["limits"]["memory"]
                units = {"Mi": 1, "Gi": 1024}
                return float(limit[:-2]) * units[limit[-2:]]
    raise RuntimeError("no gpupack container in manifests/deployment.yaml")


def unknown_names_body(pod_number: int, size: int = BODY_BYTES) -> bytes:
    """A filter/prioritize body of `size` bytes whose NodeNames are short names no node has."""
    head = b'{"Pod":' + orjson.dumps(pod_object(pod_number)) + b',"Nodes":null,"NodeNames":['
    count = (size - len(head) - 2) // 11  # `"u0000000",` is 11 bytes
    names = b",".join(b'"u%07d"' % i for i in range(count))
    return head + names + b"]}"


def long_uid_body(names: list[str]) -> bytes:
    """A filter body for a 1-GPU pod whose metadata.uid is UID_BYTES long."""
    pod = pod_object(10_000)
    pod["metadata"]["uid"] = "u" * UID_BYTES
    return orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})


def proc_status_kib(pid: int, key: str) -> int:
    """A `kB` field of /proc/<pid>/status (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def busy_seconds(pid: int, cap: float = 60.0) -> float:
    """Seconds until `pid` goes idle (under IDLE_CPU_SECONDS of CPU per second), at most `cap`."""
    started = time.monotonic()
    before = cpu_seconds(pid)
    while time.monotonic() - started < cap:
        time.sleep(1.0)
        now = cpu_seconds(pid)
        if now - before < IDLE_CPU_SECONDS:
            return max(time.monotonic() - started - 1.0, 0.0)
        before = now
    return cap


def reset_peak(pid: int) -> None:
    """Set VmHWM back to the current RSS (Linux: `5` to clear_refs)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def post(url: str, body: bytes) -> tuple[int, int, float]:
    """(status, answer bytes, seconds) of one POST on a fresh connection."""
    started = time.perf_counter()
    answer = httpx.post(url, content=body, headers={"Content-Type": "application/json"}, timeout=CLIENT_TIMEOUT)
    return answer.status_code, len(answer.content), time.perf_counter() - started


def run_case(pid: int, case: str, send: Callable[[], list[tuple[int, int, float]]]) -> Outcome:
    """Send one case's bodies; the server's peak RSS and CPU tail around it."""
    busy_seconds(pid, cap=30)  # start from an idle server
    reset_peak(pid)
    answers = send()
    busy_after = busy_seconds(pid)
    return Outcome(
        case,
        [status for status, _, _ in answers],
        max(size for _, size, _ in answers),
        max(seconds for _, _, seconds in answers),
        proc_status_kib(pid, "VmHWM") / 1024,
        busy_after,
    )


@contextmanager
def served(repo: Path, cluster_file: Path, timeout: float = 240) -> Iterator[tuple[str, int]]:
    """`python -m extender.cli serve --cluster-file` run from `repo` with its code; yields (URL, pid)."""
    port = free_port()
    command = [sys.executable, "-m", "gpupack.cli", "serve", "--cluster-file", str(cluster_file), "--port", str(port)]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    with server_child(command, port, "/readyz", timeout, cwd=repo, env=env) as child:
        yield f"http://127.0.0.1:{port}", child.pid


def worst_cases(repo: Path, nodes: int) -> tuple[float, list[Outcome]]:
    """(RSS in MiB once ready, the outcome of each case) for the server run from `repo`."""
    objects = node_objects(h100_nodes(nodes))
    names = [obj["metadata"]["name"] for obj in objects]
    unknown = unknown_names_body(1)
    concurrent = [unknown_names_body(2 + i) for i in range(4)]
    with tempfile.TemporaryDirectory() as folder:
        cluster_file = Path(folder) / "cluster.json"
        cluster_file.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "NodeList", "items": objects}))
        with served(repo, cluster_file) as (url, pid):
            ready_rss = proc_status_kib(pid, "VmRSS") / 1024

            def four_at_once() -> list[tuple[int, int, float]]:
                with ThreadPoolExecutor(4) as pool:
                    return list(pool.map(lambda body: post(url + "/prioritize", body), concurrent))

            outcomes = [
                run_case(pid, "/filter, 16 MiB of unknown NodeNames", lambda: [post(url + "/filter", unknown)]),
                run_case(pid, "4 x /prioritize at once, 16 MiB each", four_at_once),
                run_case(pid, "/filter, 4 MiB metadata.uid", lambda: [post(url + "/filter", long_uid_body(names))]),
            ]
    return ready_rss, outcomes


def report(repo: Path, nodes: int, ready_rss: float, outcomes: list[Outcome]) -> str:
    """The outcomes as a markdown table, against the deployed memory limit."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True)
    limit = memory_limit_mib()
    lines = [
        f"tree {repo} (commit {commit.stdout.strip() or '?'}), {nodes} nodes; RSS once ready {ready_rss:.0f} MiB; "
        f"memory limit {limit:.0f} MiB (manifests/deployment.yaml)",
        "",
        "| case | HTTP status | answer bytes | slowest answer (s) | peak RSS (MiB) | under the limit "
        "| CPU busy after the answer (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        under = "yes" if o.peak_rss_mib < limit else "**no**"
        statuses = ", ".join(map(str, o.statuses))
        lines.append(
            f"| {o.case} | {statuses} | {o.answer_bytes:,} | {o.answer_seconds:.2f} | {o.peak_rss_mib:.0f} | {under} "
            f"| {o.busy_after_seconds:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run the worst cases against the tree given by --repo and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--nodes", type=int, default=5000)
    args = parser.parse_args(argv)
    repo = args.repo.resolve()
    ready_rss, outcomes = worst_cases(repo, args.nodes)
    print(report(repo, args.nodes, ready_rss, outcomes))


if __name__ == "__main__":
    main()
