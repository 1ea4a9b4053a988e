"""DRA first fit against gpupack under MIG churn (#30 item 4): the first-fit model, the runs and the bench."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupack.bench import dra_churn as bench
from gpupack.scoring.facts import GpuSlot, Placement
from gpupack.scoring.geometry import SHAPES, resolve_profile, slice_bits
from gpupack.scoring.inventory import MAX_GPUS, Inventory
from gpupack.scoring.request import Kind, PodRequest
from gpupack.sim.dra_churn import (
    CONFIG,
    H100_FAMILY,
    PUBLISHED_PROFILES,
    Arm,
    FirstFit,
    dra_cluster,
    node_scores,
    placeable,
    published_devices,
    run_dra_churn,
)
from gpupack.sim.simulate import build_inventory

TINY = replace(CONFIG, warmup=0.5, measure=1.0, samples=20)
PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")


def _inventory(nodes: int) -> tuple[Inventory, list[str]]:
    facts = dra_cluster(nodes).build()
    return build_inventory(facts), [f.name for f in facts]


def _request(profile: str) -> PodRequest:
    return PodRequest(2000, 16 << 30, Kind.MIG, mig=((profile, 1),))


def _hold(inventory: Inventory, node: str, gpu: int, profile: str, start: int) -> None:
    inventory.commit(Placement(node, (GpuSlot(gpu, mig=profile, start=start),), 2000, 16 << 30))


def _shape(profile: str) -> tuple[int, int]:
    shape = SHAPES[resolve_profile(H100_FAMILY, profile)[0]]
    return shape.size, shape.compute


def test_published_order_is_minor_then_profile_then_increasing_start_from_the_geometry() -> None:
    devices = published_devices(2)
    assert devices[0] == (0, "1g.10gb", 0)
    assert [d[0] for d in devices] == sorted(d[0] for d in devices)
    gpu0 = [(profile, start) for minor, profile, start in devices if minor == 0]
    assert [p for p, _ in gpu0] == sorted((p for p, _ in gpu0), key=PUBLISHED_PROFILES.index)
    starts = {p: [s for q, s in gpu0 if q == p] for p in PUBLISHED_PROFILES}
    assert starts["3g.40gb"] == [0, 4] and starts["4g.40gb"] == [0] and starts["7g.80gb"] == [0]
    assert starts["1g.20gb"] == [0, 2, 4, 6] and starts["1g.10gb"] == list(range(7)) == starts["1g.10gb+me"]


def test_first_fit_takes_the_lowest_free_start_on_the_lowest_minor_gpu_of_the_least_loaded_node() -> None:
    inventory, (a, b, c) = _inventory(3)
    for node in (a, c):  # three pods each, all on GPU 7: GPUs 0-6 untouched
        for start in (0, 1, 2):
            _hold(inventory, node, 7, "1g.10gb", start)
    _hold(inventory, b, 0, "7g.80gb", 0)  # two pods: GPU 0 full, GPU 1's slice 0 taken
    _hold(inventory, b, 1, "1g.10gb", 0)
    placement = FirstFit(inventory, np.random.default_rng(0)).place(_request("3g.40gb"))
    assert placement == Placement(b, (GpuSlot(1, mig="3g.40gb", start=4),), 2000, 16 << 30)
    one = FirstFit(inventory, np.random.default_rng(0)).place(_request("1g.10gb"))
    assert one is not None and one.node == b and one.slots == (GpuSlot(1, mig="1g.10gb", start=1),)


def test_a_full_least_loaded_node_is_skipped_and_ties_are_broken_at_random_by_the_seed() -> None:
    inventory, (a, b, c) = _inventory(3)
    for gpu in range(8):
        _hold(inventory, a, gpu, "4g.40gb", 0)  # 8 pods: no 4g left on a
    chosen = {seed: FirstFit(inventory, np.random.default_rng(seed)).place(_request("4g.40gb")) for seed in range(20)}
    assert {p.node for p in chosen.values() if p is not None} == {b, c}
    assert all(p is not None and p.slots == (GpuSlot(0, mig="4g.40gb", start=0),) for p in chosen.values())
    again = FirstFit(inventory, np.random.default_rng(3)).place(_request("4g.40gb"))
    assert again == chosen[3]
    scores = node_scores(inventory, _request("4g.40gb"))
    assert scores[0] < scores[1] == scores[2]


def test_nothing_fits_then_the_pod_is_rejected_and_no_probe_finds_room() -> None:
    inventory, (node,) = _inventory(1)
    for gpu in range(8):
        _hold(inventory, node, gpu, "3g.40gb", 0)
    assert FirstFit(inventory, np.random.default_rng(0)).place(_request("4g.40gb")) is None
    assert not placeable(inventory, "4g.40gb") and not placeable(inventory, "7g.80gb")
    assert placeable(inventory, "3g.40gb")  # start 4 is still free on every GPU


def _check_state(inventory: Inventory, held: list[Placement]) -> None:
    """No two held instances of a GPU share a memory slice; the inventory's arrays hold exactly them."""
    for row, node in enumerate(inventory.names):
        mine = [p for p in held if p.node == node]
        assert inventory.node_pods_cap[row] - inventory.node_pods_free[row] == len(mine)
        for gpu in range(8):
            slots = [s for p in mine for s in p.slots if s.index == gpu]
            masks = [slice_bits(_shape(s.mig)[0], s.start) for s in slots]
            union = 0
            for mask in masks:
                assert union & mask == 0, f"{node} GPU {gpu}: overlapping instances {slots}"
                union |= mask
            assert int(inventory.gpu_slices[row * MAX_GPUS + gpu]) == union
            assert int(inventory.gpu_compute[row * MAX_GPUS + gpu]) == sum(_shape(s.mig)[1] for s in slots)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    steps=st.lists(st.tuples(st.booleans(), st.sampled_from(PROFILES), st.integers(0, 1000)), max_size=60),
)
def test_first_fit_never_overlaps_memory_slices_and_the_inventory_holds_what_is_held(
    seed: int, steps: list[tuple[bool, str, int]]
) -> None:
    inventory, _ = _inventory(2)
    first_fit = FirstFit(inventory, np.random.default_rng(seed))
    held: list[Placement] = []
    for arrive, profile, pick in steps:
        if arrive or not held:
            fits = placeable(inventory, profile)
            placement = first_fit.place(_request(profile))
            assert (placement is not None) == fits
            if placement is not None:
                inventory.commit(placement)
                held.append(placement)
        else:
            inventory.release(held.pop(pick % len(held)))
        _check_state(inventory, held)


def test_both_arms_see_the_same_arrivals_and_count_the_same_submissions() -> None:
    mine, theirs, other = (run_dra_churn(arm, seed, 2, TINY) for arm, seed in
                           ((Arm.GPUPACK, 5), (Arm.FIRST_FIT, 5), (Arm.FIRST_FIT, 6)))  # fmt: skip
    assert mine.arrivals_digest == theirs.arrivals_digest != other.arrivals_digest
    assert mine.submitted_by_profile == theirs.submitted_by_profile and mine.submitted > 0
    assert set(mine.submitted_by_profile) == set(PROFILES)
    assert len(mine.samples) == len(theirs.samples) > 0


def test_the_bench_runs_end_to_end_and_writes_its_report(tmp_path: Path) -> None:
    argv = ["--seeds", "1,2", "--nodes", "2", "--measure", "1", "--workers", "1", "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    text = (tmp_path / "dra-churn.md").read_text()
    assert text.startswith("# DRA first fit against gpupack")
    assert "--seeds 1,2" in text and "seeds 0–41 only" in text
    assert "\n| 1 | " in text and "\n| 2 | " in text and "\n| total | " in text
    assert "## Paired over the seeds" in text and "| pods rejected |" in text
    assert "arrival digests equal on all 2" in text
    saved = orjson.loads((tmp_path / "dra-churn.json").read_bytes())
    assert sorted((r["arm"], r["seed"]) for r in saved["runs"]) == [
        ("gpupack", 1), ("gpupack", 2), ("upstream-first-fit", 1), ("upstream-first-fit", 2)
    ]  # fmt: skip


def _run(arm: Arm, seed: int, rejected: dict[str, int], placeable_7g: float) -> dict[str, object]:
    return {
        "arm": arm.value, "seed": seed, "submitted": 100, "rejected": sum(rejected.values()),
        "submitted_by_profile": {"1g.10gb": 60, "7g.80gb": 40}, "rejected_by_profile": rejected,
        "placeable_pct": {"7g.80gb": placeable_7g, "4g.40gb": 100.0, "3g.40gb": 100.0}, "mean_in_use_pct": 90.0,
        "arrivals_digest": f"d{seed}",
    }  # fmt: skip


def test_the_report_says_plainly_where_gpupack_is_not_better() -> None:
    runs = [
        _run(Arm.GPUPACK, 1, {"1g.10gb": 3, "7g.80gb": 1}, 90.0),
        _run(Arm.FIRST_FIT, 1, {"7g.80gb": 9}, 50.0),
        _run(Arm.GPUPACK, 2, {"7g.80gb": 5}, 80.0),
        _run(Arm.FIRST_FIT, 2, {"7g.80gb": 4}, 60.0),
    ]
    seeds = bench.pairs(runs)
    lines = bench.findings(seeds, bench.compare(seeds))
    assert lines[0].startswith("Rejected pods over the 2 seeds: first fit 13, gpupack 9; first fit rejected 1.44x")
    assert "on 1 of 2 seeds (equal on 0, more on 1)" in lines[1] and "did not reject fewer on every seed" in lines[1]
    assert any(line.startswith("**Not better: pods rejected** (tie)") for line in lines)
    assert "**gpupack rejected more pods than first fit of:** 1g.10gb (3 against 0) (sum over the seeds)." in lines
