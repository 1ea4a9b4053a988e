"""`gpupack report --kubeconfig` against the real control plane: pods kube-scheduler bound through gpupack
are charged by split allocation, and the nodes left empty are offered for release."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from gpupack.cli import main
from tests.e2e.catalogue import H100, L4, pods_of, share, whole, whole_gpu_node
from tests.e2e.cluster import E2ECluster

PRICES = {"h100-od-0": 40.00, "h100-od-1": 40.00, "l4-spot-0": 0.80}


def test_report_of_a_live_cluster(cluster: E2ECluster, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = {f"{cluster.prefix}-{name}": price for name, price in PRICES.items()}
    cluster.add_nodes(
        whole_gpu_node(name, L4 if "l4" in name else H100, 2 if "l4" in name else 4,
                       "spot" if "spot" in name else "on-demand", price)
        for name, price in nodes.items()
    )  # fmt: skip
    names = cluster.create_pods(pods_of([whole(3, 1, H100), share(2, 250, H100)]))
    bound = cluster.wait_all_bound(names)

    assert main(["report", "--kubeconfig", str(cluster.plane.kubeconfig), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)

    mine = {p["pod"].split("/", 1)[1]: p for p in report["pods"] if p["pod"].startswith(cluster.namespace + "/")}
    assert {name: p["node"] for name, p in mine.items()} == bound
    assert {name: p["gpus"] for name, p in mine.items()} == {n: 1.0 if n.startswith("gpu1") else 0.25 for n in names}
    # every pod on these nodes is this test's: the namespace pays each node it uses in full
    used = set(bound.values())
    assert report["by_namespace"][cluster.namespace] == pytest.approx(sum(nodes[n] for n in used), abs=0.005)
    per_pod: Counter[str] = Counter()
    for p in mine.values():
        per_pod[p["node"]] += round(p["hourly_cost"] * 100)
    assert per_pod == {node: round(nodes[node] * 100) for node in used}  # each node's cents, split exactly
    charged = sum(round(v * 100) for v in report["by_namespace"].values()) + round(
        report["unallocated_hourly_cost"] * 100
    )
    assert charged == round(report["total_hourly_cost"] * 100)
    # nodes this test left empty can be released as they are
    plan = {d["node"]: d for d in report["drain_plan"]}
    for node in set(nodes) - used:
        assert plan[node] == {"node": node, "saves_hourly": nodes[node], "moves": []}
    pools = {(p["product"], p["capacity_type"]): p for p in report["pools"]}
    assert pools[H100, "on-demand"]["gpus_allocated"] >= 3.5  # this test's pods, at least
