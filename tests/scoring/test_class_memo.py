"""The class memo: pristine nodes of one class are scored once per epoch and the others read it.

Its results must be exactly those of scoring every node (the reference does), through commits and
releases that take nodes out of and back into the pristine state, and nodes that differ in anything a
kernel reads must not share a class.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupack.scoring.engine import Engine
from gpupack.scoring.facts import NodeFacts
from gpupack.scoring.inventory import Inventory
from gpupack.scoring.layout import MEMO_CLASS_EPOCH, MEMO_CURRENT
from gpupack.scoring.policies import gpupack
from gpupack.scoring.request import Kind, PodRequest
from tests.scoring.test_property import assert_agree, make_policy, node_facts, pod_request, profile_pool, run_stream

GIB = 1 << 30


@st.composite
def clones(draw: st.DrawFn) -> tuple[list[NodeFacts], list[PodRequest], int]:
    """Two node designs, each cloned under several names, and a stream of requests for them."""
    designs = [draw(node_facts(f"design-{i}")) for i in range(2)]
    copies = draw(st.lists(st.integers(1, 4), min_size=2, max_size=2))
    nodes = [
        dataclasses.replace(design, name=f"{design.name}-{c}")
        for design, count in zip(designs, copies, strict=True)
        for c in range(count)
    ]
    pools = [pool for f in designs if (pool := profile_pool(f))]
    products = sorted({f.gpu_product for f in designs if f.gpu_product})
    stream = draw(st.lists(pod_request(pools, products), min_size=1, max_size=10))
    return nodes, stream, draw(st.integers(0, 2**32 - 1))


@pytest.mark.slow
@pytest.mark.parametrize("policy_name", ["gpupack", "fgd", "best-fit", "gpupack-tuned"])
def test_clones_agree_with_the_reference(policy_name: str) -> None:
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
    @given(case=clones())
    def agree(case: tuple[list[NodeFacts], list[PodRequest], int]) -> None:
        nodes, stream, seed = case
        run_stream(make_policy(policy_name, stream), nodes, stream, seed)

    agree()


def test_a_class_is_the_same_hardware_capacity_and_price() -> None:
    base = NodeFacts("a", 64_000, 512 * GIB, gpu_product="NVIDIA-H100-80GB-HBM3", gpu_count=8, hourly_cost=60.0)
    variants = {
        "a": base, "b": base, "pricier": dataclasses.replace(base, hourly_cost=70.0),
        "spot": dataclasses.replace(base, spot=True), "fewer": dataclasses.replace(base, gpu_count=4),
        "linked": dataclasses.replace(base, nvlink=tuple(tuple(int(i != j) for j in range(8)) for i in range(8))),
    }  # fmt: skip
    inv = Inventory()
    rows = {name: inv.add_node(dataclasses.replace(facts, name=name)) for name, facts in variants.items()}
    classes = {name: int(inv.node_class[row]) for name, row in rows.items()}
    assert classes["a"] == classes["b"]
    assert len({classes[name] for name in rows if name != "b"}) == len(rows) - 1
    inv.update_node(dataclasses.replace(base, name="b", hourly_cost=70.0))
    assert int(inv.node_class[rows["b"]]) == classes["pricier"]


def test_busy_clones_leave_the_class_and_come_back_when_released() -> None:
    """A placement on one clone changes its score but not its class: the class memo must not answer
    for it, and once released it is pristine again and may."""
    inv = Inventory()
    for name in ("a", "b", "c"):
        inv.add_node(NodeFacts(name, 64_000, 512 * GIB, gpu_product="NVIDIA-H100-80GB-HBM3", gpu_count=8))
    policy = gpupack()
    engine = Engine(inv, policy)
    share = PodRequest(1000, GIB, Kind.SHARE, milli=500)
    first = assert_agree(engine, inv, policy, share)
    assert first.placement is not None
    memo = engine.memo(engine.request_arrays(share))
    assert memo[MEMO_CLASS_EPOCH][int(inv.node_class[0])] == memo[MEMO_CURRENT][0]  # the class was scored
    inv.commit(first.placement)
    busy = assert_agree(engine, inv, policy, share)  # same request, same epoch: the busy clone is scored anew
    row = inv.index[first.placement.node]
    assert busy.scores[row] != first.scores[row]
    inv.release(first.placement)
    again = assert_agree(engine, inv, policy, share)
    assert np.array_equal(again.scores, first.scores)
