"""Defragmentation under churn (#31 item 3): the three arms, their invariants, the count rule and the bench."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gpupack.bench import defrag as bench
from gpupack.scoring.facts import GpuSlot, Placement
from gpupack.scoring.inventory import Inventory
from gpupack.scoring.request import Kind, PodRequest
from gpupack.sim.churn import ChurnConfig
from gpupack.sim.defrag_churn import (
    CONFIG,
    Arm,
    DefragChurnResult,
    DefragConfig,
    Job,
    Simulation,
    defrag_cluster,
    is_large,
    mixed_pods,
    simulate,
    stranded_slices,
)
from gpupack.sim.simulate import build_inventory
from gpupack.sim.workload import Trace

NODES = 4
SHORT = DefragConfig(ChurnConfig(load=1.0, warmup=0.5, measure=1.0, samples=20), 0.1, 4, 1.0)
INVENTORY_ARRAYS = (
    "gpu_milli_free",
    "gpu_whole",
    "gpu_slices",
    "gpu_compute",
    "gpu_me",
    "gpu_static_used",
    "node_cpu_free",
    "node_mem_free",
    "node_pods_free",
)


@pytest.fixture(scope="module")
def runs() -> dict[Arm, Simulation]:
    return {arm: simulate(arm, 3, NODES, SHORT) for arm in Arm}


def _rebuilt(sim: Simulation) -> Inventory:
    inventory = build_inventory(sim.trace.nodes)
    for run in sim.running.values():
        inventory.commit(run.placement)  # raises InventoryError if two pods hold the same capacity
    return inventory


def test_every_arm_sees_the_same_arrivals(runs: dict[Arm, Simulation]) -> None:
    digests = {sim.result.arrivals_digest for sim in runs.values()}
    assert len(digests) == 1
    assert len({sim.result.submitted for sim in runs.values()}) == 1
    assert all(sim.result.samples for sim in runs.values())


@pytest.mark.parametrize("arm", list(Arm))
def test_the_live_inventory_is_exactly_the_running_pods(runs: dict[Arm, Simulation], arm: Arm) -> None:
    sim = runs[arm]
    rebuilt = _rebuilt(sim)
    n = sim.inventory.size
    for name in INVENTORY_ARRAYS:
        live, fresh = getattr(sim.inventory, name), getattr(rebuilt, name)
        rows = n if name.startswith("node_") else len(live)
        assert np.array_equal(live[:rows], fresh[:rows]), name
    assert sim.in_use == pytest.approx(sum(run.gpus for run in sim.running.values()))
    assert not {job.key for job in sim.queue} & set(sim.running)  # a pod is queued or running, never both


def test_plain_gpupack_never_evicts_and_the_moving_arms_do(runs: dict[Arm, Simulation]) -> None:
    plain = runs[Arm.GPUPACK].result
    assert plain.evictions == 0 and plain.restarted_gpu_seconds == 0.0 and plain.moves == 0
    for arm in (Arm.DEFRAG, Arm.COUNT_RULE):
        result = runs[arm].result
        assert result.evictions > 0 and result.restarted_gpu_seconds > 0.0
        assert result.net_in_use_pct() < result.mean("in_use_pct")


def _mig(profile: str) -> PodRequest:
    return PodRequest(2000, 16 << 30, Kind.MIG, mig=((profile, 1),))


def _constructed(arm: Arm) -> Simulation:
    """Two nodes: node 0 holds a 7g and a 1g (8/7 GPUs), node 1 one 1g (1/7 GPU); a 8-GPU pod is pending."""
    trace = Trace(defrag_cluster(2).build(), mixed_pods(100))
    result = DefragChurnResult(arm.value, 0, 2, 100.0, "", 100.0)
    counted_at_once = replace(CONFIG, churn=replace(CONFIG.churn, warmup=0.0), max_evictions=4)
    sim = Simulation(arm, trace, 0, counted_at_once, result)
    first, second = (f.name for f in trace.nodes)
    for key, node, slot in (
        ("big", first, GpuSlot(0, mig="7g.80gb", start=0)),
        ("small-a", first, GpuSlot(1, mig="1g.10gb", start=0)),
        ("small-b", second, GpuSlot(0, mig="1g.10gb", start=0)),
    ):
        request = _mig(str(slot.mig))
        sim.start(Job(key, request, 50.0, 0.0, is_large(request)), Placement(node, (slot,), 2000, 16 << 30), 0.0)
    whole = PodRequest(64_000, 8 * (64 << 30), Kind.WHOLE, gpus=8)
    sim.queue.append(Job("gpu8", whole, 30.0, 1.0, True))
    return sim


def test_the_count_rule_evicts_every_pod_of_the_least_used_node_to_the_queue_front() -> None:
    sim = _constructed(Arm.COUNT_RULE)
    second = sim.trace.nodes[1].name
    sim.count_rule(10.0)
    assert [job.key for job in sim.queue] == ["small-b", "gpu8"]
    assert sim.queue[0].queued_at == 10.0
    assert set(sim.running) == {"big", "small-a"} and all(r.placement.node != second for r in sim.running.values())
    assert sim.result.evictions == 1 and sim.result.restarted_gpu_seconds == pytest.approx(10.0 / 7)
    sim.retry(10.0)  # small-b, first in the queue, goes back somewhere
    assert "small-b" in sim.running
    assert sim.running["small-b"].end == pytest.approx(60.0)  # restarted: its whole duration from now


def test_defrag_carries_a_pending_move_out_and_restarts_the_evicted_pods() -> None:
    sim = _constructed(Arm.DEFRAG)
    second = sim.trace.nodes[1].name
    sim.defrag(20.0)
    assert sim.running["gpu8"].placement.node == second  # the pending pod started on the emptied node
    assert sim.running["gpu8"].end == pytest.approx(50.0)
    assert sim.running["small-b"].placement.node != second and sim.running["small-b"].end == pytest.approx(70.0)
    assert sim.result.evictions == 1 and sim.result.restarted_gpu_seconds == pytest.approx(20.0 / 7)
    assert not sim.queue
    _rebuilt(sim)


def test_stranded_slices_count_free_compute_only_on_mig_gpus_in_use() -> None:
    inventory = build_inventory(defrag_cluster(1).build())
    node = defrag_cluster(1).build()[0].name
    assert stranded_slices(inventory) == 0
    inventory.commit(Placement(node, (GpuSlot(0, mig="3g.40gb", start=4),), 2000, 16 << 30))
    inventory.commit(Placement(node, (GpuSlot(1),), 8000, 64 << 30))
    assert stranded_slices(inventory) == 4  # GPU 0: 4 free compute slices, no 7g; GPU 1 whole, not MIG


def test_the_bench_report_gives_gain_per_eviction_and_the_sign_test(runs: dict[Arm, Simulation]) -> None:
    settings = {"load": 1.0, "measure": 1.0, "period": 0.1, "max_evictions": 4, "patience": 1.0}
    done = [settings | sim.result.to_json() for sim in runs.values()]
    info = {"cpu": "test", "cores": 2, "ram_gib": 1, "python": "3", "date": "today", "commit": "x", "seconds": 1}
    text, saved = bench.render(done, info, "python -m gpupack.bench.defrag --seeds 3")
    assert "gain per eviction" in text and "sign test" in text and "## Per seed" in text
    assert "same arrivals on every seed" in text
    assert {r["arm"] for r in saved["runs"]} == {a.value for a in Arm}  # type: ignore[attr-defined]
    plain, defrag = runs[Arm.GPUPACK].result, runs[Arm.DEFRAG].result
    expected = (defrag.mean("in_use_pct") - plain.mean("in_use_pct")) / defrag.evictions
    assert bench.gain_per_eviction(defrag.to_json(), plain.to_json()) == pytest.approx(expected)
