"""The soak benchmark at smoke size: real server, client processes, churn, and the end-of-run checks."""

from __future__ import annotations

import json
import time
from pathlib import Path

import orjson
import pytest

from gpupack.bench.soak import check_invariants, cluster_nodes, main, soak_source_class, split
from gpupack.extender.settings import Settings
from gpupack.extender.state import ClusterState
from gpupack.scoring.facts import GpuSlot, Placement
from tests.extender_helpers import pod


@pytest.mark.slow
def test_quick_soak_has_no_errors_and_no_violations(tmp_path: Path) -> None:
    started = time.perf_counter()
    out = tmp_path / "soak.md"
    scraping = ["--scrape-interval", "0"]
    assert main(["--calls", "2000", "--clients", "8", "--nodes", "200", *scraping, "--out", str(out)]) == 0
    assert time.perf_counter() - started < 30
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["errors"] == 0 and result["violations"] == 0 and result["ok"]
    assert result["calls"] >= 2000 and not result["stopped_early"]
    assert result["pods"]["bound"] > 500 and result["pods"]["bound_at_end"] == result["config"]["live"]
    assert set(result["latency_ms"]) == {"filter", "prioritize", "bind", "metrics"}  # scraped nonstop meanwhile
    assert result["latency_ms"]["metrics"]["count"] > 10
    assert result["rss_mib"]["after_warm_up"] > 0 and result["warmed_up_after_calls"] > 0
    text = out.read_text()
    assert text.startswith("## Soak") and "| filter |" in text and "```json" in text


def bound_whole_gpu_pod(name: str, node_name: str, gpu: int) -> dict:
    claim = {"node": node_name, "gpus": [{"index": gpu}]}
    return pod(name, gpus=1, node_name=node_name, namespace="soak", uid=f"uid-{name}", assignment=claim)


def test_the_invariant_check_sees_overlaps_and_leaks(tmp_path: Path) -> None:
    """A check that only ever passes proves nothing: forged overlaps and a leaked commit must show."""
    nodes = cluster_nodes(2)
    path = tmp_path / "cluster.json"
    path.write_bytes(orjson.dumps(nodes))
    state = ClusterState(Settings())
    source = soak_source_class()(path, state.apply)
    source.start()
    name = nodes[0]["metadata"]["name"]
    source.create_pod(bound_whole_gpu_pod("x", name, 0))
    assert check_invariants(state, source, nodes) == []
    state.inventory.commit(Placement(name, (GpuSlot(5),), 0, 0))  # capacity held by nobody: a leak
    assert any("differs from a rebuild" in p for p in check_invariants(state, source, nodes))
    source.create_pod(bound_whole_gpu_pod("y", name, 0))  # a second pod claiming GPU 0
    problems = check_invariants(state, source, nodes)
    assert any("overlaps" in p for p in problems) and any("but its assignment says" in p for p in problems)


def test_split_spreads_client_threads() -> None:
    assert split(32, 1) == [32]
    assert split(32, 3) == [11, 11, 10]
    assert split(2, 5) == [1, 1]
