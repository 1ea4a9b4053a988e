"""Two trees of gpupack side by side, for changes that must not change behaviour (bench/results/tree-*-ab.md).

    python -m gpupack.bench.tree_ab OLD_TREE NEW_TREE [--shared DIR] [--traces a,b,c] [--seeds 42-44] [--rounds 3]

A TREE is a checkout (e.g. `git archive COMMIT | tar -x -C DIR`), imported through the links of
`kernel_ab.package_view`, each run in a fresh interpreter; this program itself is the installed gpupack.
Three measures, in one run:

1. openb: `gpupack simulate` (fgd protocol) of gpupack, fgd and best-fit on the traces and seeds; every
   number of every run except timings must be equal, not only the medians;
2. kernel: kernel_ab's µs per decision, the trees alternating;
3. HTTP: each tree's `gpupack serve --cluster-file` on the same 1,000-node cluster, `/filter` p50/p99
   from one client process in alternating rounds, so a slow spell of the machine falls on both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import orjson

from gpupack.bench import kernel_ab, speed
from gpupack.sim.scenarios import node_objects

POLICIES = ("gpupack", "fgd", "best-fit")
TIMING_KEYS = {"seconds", "pods_per_second", "cpu_seconds", "wall_seconds"}
HTTP_NODES = 1000
HTTP_REQUESTS = 300  # per tree and round


def simulate(view: Path, nodes: Path, pods: Path, policy: str, seeds: str) -> dict[str, Any]:
    """The simulator JSON of one tree, policy and trace."""
    code = (
        f"import sys; sys.path.insert(0, {str(view)!r}); from gpupack.cli import main; "
        f"sys.exit(main(['simulate', '--nodes', {str(nodes)!r}, '--pods', {str(pods)!r}, "
        f"'--policy', {policy!r}, '--seeds', {seeds!r}, '--json']))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    answer: dict[str, Any] = json.loads(out)
    return answer


def without_timings(value: Any) -> Any:
    """`value` with every timing field dropped, at any depth."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def openb_table(views: Sequence[Path], shared: Path, traces: Sequence[str], seeds: str) -> list[str]:
    """Markdown rows: median unallocated % at 130 % per tree, and whether every run is identical."""
    nodes = shared / "traces" / "openb" / "openb_node_list_gpu_node.csv"
    lines = ["| trace | policy | old median | new median | every run identical |", "|---|---|---:|---:|---|"]
    for trace in traces:
        pods = shared / "traces" / "openb" / f"openb_pod_list_{trace}.csv"
        for policy in POLICIES:
            old, new = (simulate(view, nodes, pods, policy, seeds) for view in views)
            same = without_timings(old) == without_timings(new)
            medians = [answer["median"]["unallocated_pct_at_130"] for answer in (old, new)]
            lines.append(f"| {trace} | {policy} | {medians[0]} | {medians[1]} | {'yes' if same else '**NO**'} |")
    return lines


def http_table(views: Sequence[Path], rounds: int) -> list[str]:
    """Markdown rows: `/filter` p50 and p99 ms per tree (NodeNames mode), per round and over all rounds."""
    with tempfile.TemporaryDirectory() as folder:
        objects = node_objects(speed.h100_nodes(HTTP_NODES))
        cluster_file = Path(folder) / "cluster.json"
        cluster_file.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "NodeList", "items": objects}))
        names = tuple(orjson.dumps(o["metadata"]["name"]) for o in objects)
        candidates = speed.Candidates(b',"Nodes":null,"NodeNames":', names, b"}")
        times: list[list[list[float]]] = [[], []]
        with serving_both(views, cluster_file) as urls:
            offset = 0
            for _ in range(rounds):
                for side, url in enumerate(urls):
                    measured = speed.client_latencies(url, candidates, offset, HTTP_REQUESTS, speed.HTTP_WARMUP)
                    times[side].append(measured)
                    offset += HTTP_REQUESTS + speed.HTTP_WARMUP
    lines = ["| tree | p50 ms per round | p99 ms per round | p50 all | p99 all |", "|---|---|---|---:|---:|"]
    for side, name in enumerate(("old", "new")):
        per_round = times[side]
        every = [t for run in per_round for t in run]
        p50s = ", ".join(f"{statistics.median(run):.2f}" for run in per_round)
        p99s = ", ".join(f"{speed.percentile(run, 99):.2f}" for run in per_round)
        lines.append(
            f"| {name} | {p50s} | {p99s} | {statistics.median(every):.2f} | {speed.percentile(every, 99):.2f} |"
        )
    return lines


@contextmanager
def serving_both(views: Sequence[Path], cluster_file: Path) -> Iterator[list[str]]:
    """Both trees' `gpupack serve --cluster-file` at once, each through its own package view; their URLs."""
    with ExitStack() as stack:
        urls = []
        for view in views:
            port = speed.free_port()
            command = [sys.executable, "-m", "gpupack.cli", "serve", "--cluster-file", str(cluster_file),
                       "--port", str(port)]  # fmt: skip
            # PYTHONPATH comes before the editable install's finder: the server imports the view's gpupack
            env = {**os.environ, "PYTHONPATH": str(view)}
            stack.enter_context(speed.server_child(command, port, "/readyz", env=env))
            urls.append(f"http://127.0.0.1:{port}")
        yield urls


def main(argv: Sequence[str] | None = None) -> None:
    """Print the three tables as Markdown."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared"))
    parser.add_argument("--traces", default="default,gpushare40,multigpu20")
    parser.add_argument("--seeds", default="42-44")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        views = [kernel_ab.package_view(tree, Path(tmp, side)) for side, tree in (("old", args.old), ("new", args.new))]
        print(f"## openb, fgd protocol, seeds {args.seeds}: unallocated % at 130 %\n")
        print("\n".join(openb_table(views, Path(args.shared), args.traces.split(","), args.seeds)))
        print(f"\n## kernel: µs per decision, median of {args.rounds} alternating rounds, old → new (new / old)\n")
        print(kernel_ab.compare(args.old, args.new, args.rounds))
        print(f"\n## HTTP: `/filter` on {HTTP_NODES} nodes, NodeNames mode, {HTTP_REQUESTS} requests per round\n")
        print("\n".join(http_table(views, args.rounds)))


if __name__ == "__main__":
    main()
