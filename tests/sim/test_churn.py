"""The churn protocol (#15 item 3): arrivals and completions over time on dynamic-MIG nodes."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpupack.cli import main
from gpupack.scoring.facts import GpuSlot, MigMode, NodeFacts, Placement
from gpupack.scoring.request import Kind, PodRequest
from gpupack.sim import churn
from gpupack.sim.churn import ChurnConfig, churn_arrivals, inference_pods, mean_lifetime, run_churn
from gpupack.sim.scenarios import H100, churn_cluster, to_node_yaml
from gpupack.sim.simulate import build_inventory, make_policy
from gpupack.sim.workload import Trace, TracePod

SMALL = ChurnConfig(load=0.9, warmup=1.0, measure=2.0, samples=20)


def _pod(name: str, profile: str) -> TracePod:
    return TracePod(name, PodRequest(1000, 1 << 30, Kind.MIG, mig=((profile, 1),)))


def _small_trace() -> Trace:
    return Trace(churn_cluster().scaled(0.1).build(), inference_pods(200))


def test_inference_mix_is_mostly_small_profiles_on_both_families() -> None:
    pods = inference_pods(1000)
    sizes = [int(p.request.mig[0][0].split("g.")[0]) for p in pods]
    assert sum(s <= 3 for s in sizes) / len(sizes) == pytest.approx(0.8, abs=0.01)
    assert {4, 7} <= set(sizes)
    profiles = {p.request.mig[0][0] for p in pods}
    assert {"1g.10gb", "7g.80gb", "1g.18gb", "7g.141gb"} <= profiles
    groups = churn_cluster().groups
    assert {g.mig for g in groups} == {MigMode.DYNAMIC} and len({g.product for g in groups}) == 3


def test_arrivals_are_seeded_poisson_with_lifetimes_that_give_the_load() -> None:
    pods = [_pod("a", "1g.10gb"), _pod("b", "7g.80gb")]
    config = ChurnConfig(load=0.8, warmup=1.0, measure=40.0)
    life = mean_lifetime(pods, 16, 0.8)
    assert life == pytest.approx(0.8 * 16 / ((1 / 7 + 1) / 2))
    first, again, other = (churn_arrivals(pods, 16, seed, config) for seed in (1, 1, 2))
    assert [a.pod.name for a in first] == [a.pod.name for a in again]
    assert [a.time for a in first] != [a.time for a in other]
    assert len(first) == round(41 * life)
    assert all(b.time > a.time for a, b in itertools.pairwise(first))
    assert all(a.end > a.time for a in first)
    assert statistics.fmean(a.end - a.time for a in first) == pytest.approx(life, rel=0.1)
    assert statistics.fmean(b.time - a.time for a, b in itertools.pairwise(first)) == pytest.approx(1, rel=0.1)
    assert len({a.pod.name for a in first}) == len(first)  # every arrival is a pod of its own


def test_bad_churn_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        churn_arrivals([_pod("a", "1g.10gb")], 8, 1, ChurnConfig(load=0))
    with pytest.raises(ValueError, match="no pod"):
        churn_arrivals([TracePod("cpu", PodRequest(1000))], 8, 1, ChurnConfig())


def test_departures_release_what_the_pods_held() -> None:
    node = NodeFacts("m", 64_000, 1 << 40, 110, H100, 1, mig_mode=MigMode.DYNAMIC)
    cluster = churn.ChurnCluster(Trace([node], []))
    seven = Placement("m", (GpuSlot(0, mig="7g.80gb", start=0),))
    cluster.commit(seven, end=5.0, order=0)
    assert cluster.in_use == pytest.approx(1.0)
    cluster.release_until(4.9)
    assert cluster.in_use == pytest.approx(1.0)
    cluster.release_until(5.0)
    assert cluster.in_use == pytest.approx(0.0)
    assert cluster.inventory.node_is_empty(0)
    cluster.commit(seven, end=9.0, order=1)  # the GPU is whole again: the same 7g fits
    assert cluster.in_use == pytest.approx(1.0)


def test_stranding_is_judged_against_the_profiles_still_to_come() -> None:
    """Two 3g instances leave one compute slice but no memory slice: stranded whatever comes. A 4g at 0
    leaves room for a 3g: stranded only once no 3g (nor smaller) is still to come."""
    from gpupack.sim.packing_metrics import stranded_gpus

    node = NodeFacts("m", 64_000, 1 << 40, 110, H100, 2, mig_mode=MigMode.DYNAMIC)
    inventory = build_inventory([node])
    inventory.commit(Placement("m", (GpuSlot(0, mig="3g.40gb", start=0), GpuSlot(0, mig="3g.40gb", start=4))))
    inventory.commit(Placement("m", (GpuSlot(1, mig="4g.40gb", start=0),)))
    assert stranded_gpus(inventory, {"mig-1g.10gb": 1, "mig-3g.40gb": 1}).stranded == 1
    assert stranded_gpus(inventory, {"mig-4g.40gb": 1, "mig-7g.80gb": 1}).stranded == 2


def test_a_churn_run_counts_rejections_after_the_warmup_and_samples_over_time() -> None:
    trace = _small_trace()
    result = run_churn(trace, make_policy("first-fit", trace.pods), 42, SMALL)
    assert result.pods_submitted == result.pods_scheduled + result.rejected
    assert result.pods_submitted > 0
    assert 15 <= len(result.samples) <= 20
    times = [s["time"] for s in result.samples]
    assert times == sorted(times)
    rejected = [s["rejected"] for s in result.samples]
    assert rejected == sorted(rejected) and rejected[-1] <= result.rejected
    assert set(result.samples[0]["placeable"]) == {"4g.40gb", "7g.80gb", "4g.71gb", "7g.141gb"}
    summary = result.summary()
    in_use = summary["mean_in_use_pct"]
    assert isinstance(in_use, float) and 0 <= in_use <= 100
    again = run_churn(trace, make_policy("first-fit", trace.pods), 42, SMALL)
    assert again.to_json()["samples"] == result.to_json()["samples"]  # seeded: the same run


def test_simulate_protocol_churn_from_node_and_pod_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = tmp_path / "nodes.yaml", tmp_path / "pods.yaml"
    nodes.write_text(to_node_yaml(churn_cluster().scaled(0.1).build()))
    assert churn.main(["pods"]) == 0
    pods.write_text(capsys.readouterr().out)
    args = ["simulate", "--protocol", "churn", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1-2"]
    assert main([*args, "--policy", "best-fit", "--load", "0.8", "--json"]) == 0
    result = orjson.loads(capsys.readouterr().out)
    assert result["protocol"] == "churn" and [r["seed"] for r in result["runs"]] == [1, 2]
    assert result["churn"]["load"] == 0.8
    assert all(r["alloc_pct_at_100"] is None and "rejected_by_profile" in r for r in result["runs"])
    assert main([*args, "--policy", "gpupack", "--plot", str(tmp_path / "churn.png")]) == 0
    assert (tmp_path / "churn.png").stat().st_size > 1000  # every seed over time
    text = capsys.readouterr().out
    assert "seed 1:" in text and "rejected" in text and "None" not in text and "130" not in text


def test_the_per_seed_table_counts_the_baselines_not_the_fgd_reference() -> None:
    from gpupack.bench.churn_report import _per_seed_table

    def result(policy: str, seed: int, rejected: int) -> Mapping[str, Any]:
        return {"policy": policy, "seed": seed, "run": {"summary": {"rejected": rejected}}}

    rows = {"gpupack": (5, 9), "first-fit": (7, 9), "fgd": (3, 3)}
    by: dict[tuple[object, ...], list[Mapping[str, Any]]] = {
        (p,): [result(p, 42 + i, n) for i, n in enumerate(values)] for p, values in rows.items()
    }
    table = _per_seed_table(by, list(rows))
    assert table.columns[-1] == "gpupack fewer than first-fit (strictly)"
    assert [row[-1] for row in table.rows] == [True, False]  # seed 43 is a tie with first-fit: not fewer
