"""`gpupack report`: split cost allocation, pools, stranded MIG slices and drain plans, checked against
numbers worked out by hand; then the example cluster and a simulated end state through the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from gpupack.cli import main
from gpupack.extender.settings import Settings
from gpupack.report.build import build_report
from gpupack.report.render_text import render_text
from gpupack.report.snapshot import read_cluster_file, report_settings
from gpupack.scoring.cost import apportion, split_costs, to_cents
from gpupack.scoring.facts import GpuSlot, Placement
from gpupack.scoring.inventory import Inventory
from gpupack.scoring.pools import PoolKey, PoolTotals
from gpupack.sim.scenarios import cost_cluster, to_node_yaml
from tests.extender_helpers import EXAMPLE_CLUSTER, ROOT, node, pod, state_from, write_cluster

POLICY_CONFIG = ROOT / "manifests" / "policy-config.yaml"


def cents(amount: float) -> int:
    return round(amount * 100)


# ------------------------------------------------------------------ pure arithmetic
def test_apportion_is_largest_remainder_and_sums_exactly() -> None:
    assert apportion(1000, [1, 2]) == [333, 667]  # 333.33 / 666.67
    assert apportion(100, [1, 1, 1]) == [34, 33, 33]  # the tie goes to the first
    assert apportion(5, [0.5, 0.25, 0.25]) == [3, 1, 1]  # 2.5 / 1.25 / 1.25
    assert apportion(700, [0, 0]) == [0, 0]
    assert apportion(0, [1, 2]) == [0, 0]
    assert to_cents(98.325) == 9833 and to_cents(0.004) == 0


def test_split_costs_by_hand() -> None:
    """Node a ($10/h, pods of 1 and 2 GPUs): 3.33 and 6.67, its idle GPU spread over both;
    node b ($5/h) holds no GPU pod: unallocated; node c has no price."""
    shares = {"a": {"ns1/p1": 1.0, "ns2/p2": 2.0}, "b": {"ns1/cpu-only": 0.0}}
    bill = split_costs([("a", 10.0), ("b", 5.0), ("c", None)], shares)
    assert bill.pod_cents == {"ns1/p1": 333, "ns2/p2": 667, "ns1/cpu-only": 0}
    assert (bill.total_cents, bill.unallocated_cents, bill.unpriced_nodes) == (1500, 500, ["c"])
    assert bill.by_group({p: p.split("/")[0] for p in bill.pod_cents}) == {"ns1": 333, "ns2": 667}
    day = split_costs([("a", 10.0), ("b", 5.0)], shares, hours=24)
    assert day.pod_cents["ns1/p1"] == 8000 and day.pod_cents["ns2/p2"] == 16000
    assert day.unallocated_cents == 12000


# ------------------------------------------------------------------ a small cluster, by hand
def small_cluster() -> list[dict[str, Any]]:
    """od-a $10/h: 1-GPU pod (team-a, red) and 2-GPU pod (team-b, blue); od-b $6/h: a half-GPU share (team-a,
    red); spot-c $3/h empty; mig-d $7/h: one H100 in dynamic MIG holding seven 1g.10gb (team-b, no label)."""
    price = "gpupack.io/hourly-cost"
    objects = [
        node("od-a", gpus=4, annotations={price: "10"}),
        node("od-b", gpus=4, annotations={price: "6.00"}),
        node("spot-c", gpus=4, spot=True, annotations={price: "3"}),
        node("mig-d", gpus=1, mig="dynamic", annotations={price: "7"}),
        pod("p1", gpus=1, namespace="team-a", node_name="od-a", assignment={"node": "od-a", "gpus": [{"index": 0}]}),
        pod("p2", gpus=2, namespace="team-b", node_name="od-a",
            assignment={"node": "od-a", "gpus": [{"index": 1}, {"index": 2}]}),
        pod("p3", milli=500, namespace="team-a", node_name="od-b",
            assignment={"node": "od-b", "gpus": [{"index": 0, "milli": 500}]}),
        pod("p4", mig="1g.10gb", mig_count=7, namespace="team-b", node_name="mig-d",
            assignment={"node": "mig-d", "gpus": [{"index": 0, "mig": "1g.10gb", "start": s} for s in range(7)]}),
    ]  # fmt: skip
    for obj, team in zip(objects[4:7], ("red", "blue", "red"), strict=True):
        obj["metadata"]["labels"] = {"team": team}
    return objects


@pytest.fixture
def small_report(tmp_path: Path) -> dict[str, Any]:
    path = write_cluster(tmp_path / "cluster.yaml", small_cluster())
    return build_report(read_cluster_file(path, Settings()), Settings(), ["team"], hours=24)


def test_small_cluster_split_by_hand(small_report: dict[str, Any]) -> None:
    report = small_report
    assert report["total_hourly_cost"] == 26.00
    assert report["unallocated_hourly_cost"] == 3.00  # spot-c
    # team-a: 10 x 1/3 = 3.33 on od-a, plus all of od-b (its only pod) = 9.33; team-b: 6.67 + all of mig-d
    assert report["by_namespace"] == {"team-a": 9.33, "team-b": 13.67}
    assert report["by_label"]["team"] == {"(none)": 7.00, "blue": 6.67, "red": 9.33}
    window = report["window"]
    assert window["total_cost"] == 624.00 and window["unallocated_cost"] == 72.00
    assert window["by_namespace"]["team-a"] == {"gpu_hours": 36.0, "cost": 224.00}  # 1.5 GPUs x 24 h
    assert window["by_namespace"]["team-b"] == {"gpu_hours": 72.0, "cost": 328.00}  # 2 + 7/7 GPUs
    charged = sum(cents(v) for v in report["by_namespace"].values()) + cents(report["unallocated_hourly_cost"])
    assert charged == cents(report["total_hourly_cost"])


def test_small_cluster_pools_by_hand(small_report: dict[str, Any]) -> None:
    pools = {(p["product"], p["capacity_type"]): p for p in small_report["pools"]}
    on_demand = pools["NVIDIA-H100-80GB-HBM3", "on-demand"]
    assert on_demand["nodes"] == 3 and on_demand["gpus"] == 9
    assert on_demand["gpus_allocated"] == 4.5  # 1 + 2 + 0.5 + 7/7
    assert on_demand["idle_hourly_cost"] == 7.75  # 10 x 1/4 + 6 x 3.5/4 + 0
    assert on_demand["free_mig_slices"] == 1 and on_demand["stranded_mig_slices"] == 1  # slice 7 of mig-d
    spot = pools["NVIDIA-H100-80GB-HBM3", "spot"]
    assert (spot["gpus"], spot["idle_gpus"], spot["idle_hourly_cost"], spot["empty_nodes"]) == (4, 4.0, 3.0, 1)


def test_small_cluster_drain_plan(small_report: dict[str, Any]) -> None:
    """spot-c is empty; od-b's share moves to od-a (not to spot: p3 is not interruptible); od-a then took
    a pod and stays; mig-d's seven instances fit nowhere else."""
    plan = {d["node"]: d for d in small_report["drain_plan"]}
    assert list(plan) == ["spot-c", "od-b"]
    assert plan["spot-c"] == {"node": "spot-c", "saves_hourly": 3.0, "moves": []}
    assert plan["od-b"]["saves_hourly"] == 6.0
    [move] = plan["od-b"]["moves"]
    assert move["pod"] == "team-a/p3" and move["to"] == "od-a" and move["gpus"] == [{"index": 3, "milli": 500}]
    assert small_report["drain_saves_hourly"] == 9.0
    assert small_report["kept"] == {
        "mig-d": "pod team-b/p4 fits nowhere else",
        "od-a": "takes pods of the move for od-b: a pod moves once",
    }


def test_seven_1g_instances_strand_the_eighth_slice_and_one_strands_nothing() -> None:
    def pools_of(starts: range) -> dict[str, float]:
        assignment = {"node": "m", "gpus": [{"index": 0, "mig": "1g.10gb", "start": s} for s in starts]}
        objects = [pod("p", mig="1g.10gb", mig_count=len(starts), node_name="m", assignment=assignment)]
        state = state_from([node("m", gpus=1, mig="dynamic")], objects)
        return PoolTotals(state.inventory).pools()[PoolKey("NVIDIA-H100-80GB-HBM3", "on-demand")]

    seven, one = pools_of(range(7)), pools_of(range(1))
    assert (seven["free_mig_slices"], seven["stranded_mig_slices"]) == (1, 1)
    assert (one["free_mig_slices"], one["stranded_mig_slices"]) == (7, 0)  # 1g at 1..6, 1g.20gb at 6-7


def test_pool_totals_follow_changes_of_changed_nodes_only() -> None:
    state = state_from([node("a", gpus=2), node("b", gpus=2, spot=True)])
    totals = PoolTotals(state.inventory)
    key = PoolKey("NVIDIA-H100-80GB-HBM3", "on-demand")
    assert totals.pools()[key]["gpus_allocated"] == 0
    state.inventory.commit(Placement("a", (GpuSlot(0),)))
    assert totals.pools()[key]["gpus_allocated"] == 1
    state.inventory.remove_node("a")
    assert key not in totals.pools()
    assert totals.pools()[PoolKey("NVIDIA-H100-80GB-HBM3", "spot")]["gpus"] == 2


def test_pool_totals_recompute_only_changed_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    import gpupack.scoring.pools as pools

    state = state_from([node(f"n{i}", gpus=2) for i in range(50)])
    totals = PoolTotals(state.inventory)
    recomputed: list[int] = []
    real = pools.node_figures

    def counting(inv: Inventory, rows: np.ndarray) -> object:
        recomputed.append(rows.size)
        return real(inv, rows)

    monkeypatch.setattr(pools, "node_figures", counting)
    totals.pools()
    state.inventory.commit(Placement("n7", (GpuSlot(1),)))
    totals.pools()
    totals.pools()  # nothing changed since
    assert recomputed == [50, 1]
    assert totals.pools()[PoolKey("NVIDIA-H100-80GB-HBM3", "on-demand")]["gpus_allocated"] == 1


# ------------------------------------------------------------------ the CLI on real inputs
def report_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["report", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def assert_adds_up(report: dict[str, Any]) -> None:
    """Split allocation: namespaces plus the unallocated part equal the cluster's cost, to the cent."""
    charged = sum(cents(v) for v in report["by_namespace"].values()) + cents(report["unallocated_hourly_cost"])
    assert charged == cents(report["total_hourly_cost"])
    window = report["window"]
    in_window = sum(cents(v["cost"]) for v in window["by_namespace"].values()) + cents(window["unallocated_cost"])
    assert in_window == cents(window["total_cost"])
    assert sum(cents(p["hourly_cost"]) for p in report["pods"]) == sum(
        cents(v) for v in report["by_namespace"].values()
    )


def test_example_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    report = report_json(
        capsys, "--cluster-file", str(EXAMPLE_CLUSTER), "--config", str(POLICY_CONFIG), "--hours", "24"
    )
    assert_adds_up(report)
    objects = yaml.safe_load(EXAMPLE_CLUSTER.read_text())["items"]
    nodes = [o for o in objects if o["kind"] == "Node"]
    assert sum(p["nodes"] for p in report["pools"]) == len(nodes)
    assert sum(p["gpus"] for p in report["pools"]) == sum(
        int(n["metadata"]["labels"].get("nvidia.com/gpu.count", 0)) for n in nodes
    )
    pods = {p["pod"]: p for p in report["pods"]}
    # the only pod on h100-od-0 (p5.48xlarge on-demand, $98.32/h in the policy config) holds a 3g.40gb: 3/7 GPU
    sft = pods["ml-train/llm-sft-7b-0"]
    assert (sft["node"], sft["gpus"], sft["hourly_cost"]) == ("h100-od-0", round(3 / 7, 4), 98.32)
    assert report["unpriced_nodes"] == []
    for drain in report["drain_plan"]:
        assert all(move["to"] != drain["node"] for move in drain["moves"])


def test_report_text_and_config_map_prices(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--cluster-file", str(EXAMPLE_CLUSTER), "--config", str(POLICY_CONFIG), "--by", "team"]) == 0
    out = capsys.readouterr().out
    assert "GPU pools" in out and "cost by namespace" in out and "cost by label team" in out
    assert "nodes that could be released" in out
    assert report_settings(str(POLICY_CONFIG)).price_table()[("p5.48xlarge", "on-demand")] == 98.32


def test_bad_inputs_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--cluster-file", str(tmp_path / "missing.yaml")]) == 2
    assert main(["report", "--cluster-file", str(EXAMPLE_CLUSTER), "--hours", "0"]) == 2
    assert "gpupack report:" in capsys.readouterr().err


def simulation_pods(count: int) -> list[dict[str, Any]]:
    """Pods of three teams: whole GPUs, shares and CPU-only, some interruptible."""
    pods = []
    for i in range(count):
        kind = i % 4
        obj = pod(f"job-{i}", namespace=("ml-train", "inference", "notebooks")[i % 3], cpu="2", memory="8Gi",
                  gpus=(1, 2, 0, 0)[kind] * (1 + i % 2), milli=300 if kind == 2 else 0,
                  annotations={"gpupack.io/interruptible": "true"} if i % 5 == 0 else None)  # fmt: skip
        obj["metadata"]["labels"] = {"team": ("red", "blue", "green")[i % 3]}
        pods.append(obj)
    return pods


def test_simulated_end_state(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(to_node_yaml(cost_cluster().scaled(0.05).build()))
    pods = write_cluster(tmp_path / "pods.yaml", simulation_pods(60))
    saved = tmp_path / "end-state.yaml"
    report = report_json(capsys, "--from-simulation", str(nodes), str(pods), "--load", "0.6", "--seed", "42",
                         "--save-cluster", str(saved), "--by", "team")  # fmt: skip
    assert_adds_up(report)
    spec = cost_cluster().scaled(0.05)
    assert sum(p["gpus"] for p in report["pools"]) == spec.gpu_count
    assert sum(p["nodes"] for p in report["pools"]) == spec.node_count
    allocated = sum(p["gpus_allocated"] for p in report["pools"])
    assert allocated == pytest.approx(sum(p["gpus"] for p in report["pods"]), abs=1e-3)
    assert 0.4 * spec.gpu_count <= allocated <= 0.6 * spec.gpu_count + 2  # load 0.6, a few pods may not fit
    assert set(report["by_label"]["team"]) <= {"red", "blue", "green"}
    # the saved end state is a cluster file the extender reads back with every pod holding its placement
    state = read_cluster_file(saved, Settings()).state
    assert state.unplaced() == [] and len(state.placements()) == len(report["pods"])
    # drains never move a non-interruptible pod onto spot
    interruptible = {f"{o['metadata']['namespace']}/{o['metadata']['name']}" for o in simulation_pods(60)
                     if o["metadata"]["annotations"].get("gpupack.io/interruptible")}  # fmt: skip
    for drain in report["drain_plan"]:
        for move in drain["moves"]:
            if "spot" in move["to"]:
                assert move["pod"].split("-tuned-")[0] in interruptible


def test_the_text_report_shows_control_characters_instead_of_sending_them(small_report: dict[str, Any]) -> None:
    """#26 (low): a pod, node or Prometheus label value holding terminal escapes is printed visibly."""
    hostile = dict(small_report, unusable_nodes={"evil\x1b[2J": "bell\x07 and \x9b31m"})
    hostile["utilisation"] = {
        "idle_below_pct": 5.0, "window": "1h", "prometheus": "http://prom",
        "idle_gpus": [{"namespace": "ml\x1b]0;owned\x07", "pod": "p", "node": "n", "gpu": "0", "utilisation_pct": 0.0}],
        "idle_by_namespace": {"ml\x1b]0;owned\x07": 1},
    }  # fmt: skip
    text = render_text(hostile)
    assert not any((ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0 for c in text)
    assert "node evil\\x1b[2J not read: bell\\x07 and \\x9b31m" in text
    assert "ml\\x1b]0;owned\\x07" in text
