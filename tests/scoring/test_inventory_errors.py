"""Bad input gives a typed error with a clear message, and the inventory is left exactly as it was."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from gpupack.scoring import kernels as k
from gpupack.scoring.engine import Engine
from gpupack.scoring.facts import GpuSlot, MigMode, NodeFacts, Placement
from gpupack.scoring.inventory import Inventory, InventoryError
from gpupack.scoring.policies import gpupack
from gpupack.scoring.reference import reference_decide
from gpupack.scoring.request import MAX_CPU_MILLI, MAX_MEMORY_BYTES, Kind, PodRequest, RequestError

GIB = 1 << 30
H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-80GB"


def node(
    name: str, product: str = H100, count: int = 2, mode: MigMode = MigMode.NONE, **kw: Any
) -> NodeFacts:
    """A node with 8 cores, 64 GiB and 4 pod slots."""
    facts = NodeFacts(name, 8000, 64 * GIB, pods=4, gpu_product=product, gpu_count=count, mig_mode=mode)
    return replace(facts, **kw)


def state(inv: Inventory) -> dict[str, object]:
    """Everything the inventory holds: every array, plus names, index, facts and models."""
    arrays = {name: v.copy() for name, v in vars(inv).items() if isinstance(v, np.ndarray)}
    return {
        **arrays,
        "names": list(inv.names),
        "index": dict(inv.index),
        "facts": list(inv.facts),
        "models": list(inv.models),
        "free_rows": list(inv._free_rows),
    }


def assert_same(before: dict[str, object], after: dict[str, object]) -> None:
    assert before.keys() == after.keys()
    for key, value in before.items():
        if isinstance(value, np.ndarray):
            other = after[key]
            assert isinstance(other, np.ndarray), key
            assert np.array_equal(value, other, equal_nan=value.dtype.kind == "f"), key
        else:
            assert value == after[key], key


@contextmanager
def unchanged(inv: Inventory, error: type[Exception], match: str) -> Iterator[None]:
    """Expect `error` (message matching `match`) and no change at all to the inventory."""
    before = state(inv)
    with pytest.raises(error, match=match):
        yield
    assert_same(before, state(inv))


@pytest.fixture
def inv() -> Inventory:
    """A small cluster with some capacity already taken."""
    inventory = Inventory(capacity=2)
    inventory.add_node(node("plain", "NVIDIA-L4", 4))
    inventory.add_node(node("dyn", H100, 2, MigMode.DYNAMIC))
    layout = {0: (("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6))}
    inventory.add_node(node("static", A100, 2, MigMode.STATIC, mig_layout=layout))
    inventory.commit(Placement("plain", (GpuSlot(0),), 1000, GIB))
    inventory.commit(Placement("plain", (GpuSlot(1, milli=600),)))
    inventory.commit(Placement("dyn", (GpuSlot(0, mig="3g.40gb", start=4),)))
    inventory.commit(Placement("static", (GpuSlot(0, mig="2g.20gb", start=4),)))
    return inventory


# ----------------------------------------------------------------------------- unknown products


@pytest.mark.parametrize("mode", [MigMode.NONE, MigMode.DYNAMIC])
def test_unknown_product_is_schedulable_but_never_mig(mode: MigMode) -> None:
    inv = Inventory()
    inv.add_node(node("x", "ACME-Accelerator-X1", 2, mode))
    engine = Engine(inv, gpupack())
    for request in (PodRequest(kind=Kind.WHOLE, gpus=2), PodRequest(kind=Kind.SHARE, milli=300)):
        decision = engine.decide(request)
        assert decision.node == "x"
        assert reference_decide(inv, engine.policy, request).placement == decision.placement
    decision = engine.decide(PodRequest(kind=Kind.MIG, mig=(("1g.10gb", 1),)))
    # no preemption can help: unresolvable, saying so (#18)
    assert decision.placement is None and decision.verdicts[0] == (k.NOT_MIG if mode == MigMode.NONE else k.NO_PROFILE)
    assert decision.reasons() == {} and decision.unresolvable() == {"x": "ACME-Accelerator-X1 has no MIG"}


def test_unknown_product_with_a_static_layout_is_rejected() -> None:
    inv = Inventory()
    bad = node("x", "ACME-Accelerator-X1", 1, MigMode.STATIC, mig_layout={0: (("1g.10gb", 0),)})
    with unchanged(inv, InventoryError, "has no MIG"):
        inv.add_node(bad)


# ----------------------------------------------------------------------------- requests


def test_profile_unknown_for_every_model_is_a_request_error(inv: Inventory) -> None:
    engine = Engine(inv, gpupack())
    for profile in ("5g.50gb", "1g.10gb+gfx", "mig-1g.10gb", ""):
        request = PodRequest(kind=Kind.MIG, mig=((profile, 1),))
        with unchanged(inv, RequestError, "exists on no known GPU model"):
            engine.decide(request)
        with unchanged(inv, RequestError, "exists on no known GPU model"):
            reference_decide(inv, engine.policy, request)


def test_profile_of_another_model_gets_no_mig(inv: Inventory) -> None:
    engine = Engine(inv, gpupack())
    decision = engine.decide(PodRequest(kind=Kind.MIG, mig=(("1g.6gb", 1),)))  # an A30 profile
    assert decision.placement is None
    expected = {"plain": k.NOT_MIG, "dyn": k.NO_PROFILE, "static": k.NO_PROFILE}  # unresolvable (#18)
    assert {name: int(decision.verdicts[row]) for name, row in inv.index.items()} == expected
    assert decision.unresolvable()["plain"] == "NVIDIA-L4 has no MIG"
    assert decision.unresolvable()["dyn"].startswith(f"{H100} has no MIG profile 1g.6gb (its profiles: 1g.10gb, ")
    # one instance of a known profile does not rescue the other
    mixed = engine.decide(PodRequest(kind=Kind.MIG, mig=(("1g.10gb", 1), ("1g.6gb", 1))))
    assert mixed.placement is None
    assert {name: int(mixed.verdicts[row]) for name, row in inv.index.items()} == expected
    assert mixed.reasons() == {} and "1g.6gb" in mixed.unresolvable()["static"]


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"kind": Kind.WHOLE, "gpus": 1, "milli": 500}, "mixes GPU request kinds"),
        ({"kind": Kind.MIG, "gpus": 1, "mig": (("1g.10gb", 1),)}, "mixes GPU request kinds"),
        ({"kind": Kind.SHARE, "milli": 100, "mig": (("1g.10gb", 1),)}, "mixes GPU request kinds"),
        ({"kind": Kind.WHOLE, "milli": 100}, "does not match its quantities"),
        ({"kind": Kind.NONE, "gpus": 2}, "does not match its quantities"),
        ({"kind": Kind.MIG}, "does not match its quantities"),
        ({"cpu_milli": -1}, "cpu request"),
        ({"cpu_milli": MAX_CPU_MILLI + 1}, "cpu request"),
        ({"memory_bytes": -1}, "memory request"),
        ({"memory_bytes": MAX_MEMORY_BYTES + 1}, "memory request"),
        ({"kind": Kind.WHOLE, "gpus": -1}, "nvidia.com/gpu"),
        ({"kind": Kind.WHOLE, "gpus": 17}, "nvidia.com/gpu"),
        ({"kind": Kind.SHARE, "milli": -5}, "gpu-milli"),
        ({"kind": Kind.SHARE, "milli": 1000}, "gpu-milli"),
        ({"kind": Kind.MIG, "mig": (("1g.10gb", 0),)}, "must be at least 1"),
        ({"kind": Kind.MIG, "mig": (("1g.10gb", -2),)}, "must be at least 1"),
        ({"kind": Kind.MIG, "mig": (("1g.10gb", 65),)}, "exceed"),
        ({"kind": Kind.WHOLE, "gpus": 1, "allowed_products": frozenset()}, "allows no product"),
    ],
)
def test_bad_requests_are_request_errors(fields: dict[str, Any], match: str) -> None:
    with pytest.raises(RequestError, match=match):
        PodRequest(**fields)
    assert issubclass(RequestError, ValueError)


# ----------------------------------------------------------------------------- node facts


LAYOUT_ERRORS: list[tuple[dict[int, tuple[tuple[str, int], ...]], str]] = [
    ({0: (("3g.40gb", 0), ("2g.20gb", 2))}, "cannot hold 2g.20gb@2"),  # overlap
    ({0: (("7g.80gb", 0), ("1g.10gb", 3))}, "cannot hold 1g.10gb@3"),  # overlap
    ({0: (("1g.10gb", 1), ("1g.10gb", 1))}, "cannot hold 1g.10gb@1"),  # the same slot twice
    ({0: (("3g.40gb", 2),)}, "cannot hold 3g.40gb@2"),  # no such start
    ({0: (("1g.10gb", 7),)}, "cannot hold 1g.10gb@7"),  # beyond the 1g starts
    ({0: (("7g.80gb", 1),)}, "cannot hold 7g.80gb@1"),  # would run past the last slice
    ({0: (("1g.10gb", -1),)}, "cannot hold 1g.10gb@-1"),
    ({0: (("1g.6gb", 0),)}, "does not exist on A100-80GB"),  # an A30 profile
    ({2: (("1g.10gb", 0),)}, "names GPU 2 of 2"),
    ({-1: (("1g.10gb", 0),)}, "names GPU -1 of 2"),
]


@pytest.mark.parametrize(("layout", "match"), LAYOUT_ERRORS)
def test_bad_static_layouts(
    inv: Inventory, layout: dict[int, tuple[tuple[str, int], ...]], match: str
) -> None:
    with unchanged(inv, InventoryError, match):
        inv.add_node(node("new", A100, 2, MigMode.STATIC, mig_layout=layout))


def test_full_static_layouts_are_accepted() -> None:
    # every 8-slice geometry tops out at 7 compute slices, so a layout can only exceed the GPU's
    # compute by overlapping (caught above); these full ones are fine
    inv = Inventory()
    inv.add_node(
        node(
            "full",
            A100,
            3,
            MigMode.STATIC,
            mig_layout={
                0: (("4g.40gb", 0), ("2g.20gb", 4), ("1g.20gb", 6)),
                1: tuple(("1g.10gb", s) for s in range(7)),
                2: (("4g.40gb", 0), ("3g.40gb", 4)),
            },
        )
    )
    inv.add_node(
        node("a30", "NVIDIA-A30", 1, MigMode.STATIC, mig_layout={0: (("2g.12gb", 0), ("2g.12gb", 2))})
    )


@pytest.mark.parametrize(
    ("nvlink", "numa", "match"),
    [
        (((0, 1, 1), (1, 0, 1), (1, 1, 0)), None, "NVLink matrix is not 2x2"),
        (((0, 1), (1,)), None, "NVLink matrix is not 2x2"),
        (((0, 1), (1, 0), (0, 0)), None, "NVLink matrix is not 2x2"),
        ((), None, "NVLink matrix is not 2x2"),
        (((0, -1), (-1, 0)), None, "NVLink count -1 out of range"),
        (((0, 100), (100, 0)), None, "NVLink count 100 out of range"),
        (None, (0, 0, 1), "numa has 3 entries"),
    ],
)
def test_bad_topology(inv: Inventory, nvlink: object, numa: object, match: str) -> None:
    with unchanged(inv, InventoryError, match):
        inv.add_node(node("new", H100, 2, nvlink=nvlink, numa=numa))


@pytest.mark.parametrize(
    ("facts", "match"),
    [
        (node("plain"), "already exists"),
        (node("new", count=17), "out of range"),
        (node("new", count=-1), "out of range"),
        (replace(node("new"), cpu_milli=-1), "negative cpu"),
        (replace(node("new"), memory_bytes=-1), "negative memory"),
        (replace(node("new"), pods=-1), "negative pods"),
    ],
)
def test_bad_node_facts(inv: Inventory, facts: NodeFacts, match: str) -> None:
    with unchanged(inv, InventoryError, match):
        inv.add_node(facts)


# ----------------------------------------------------------------------------- commit and release


ME_0 = GpuSlot(1, mig="1g.10gb+me", start=0)
BAD_COMMITS: list[tuple[Placement, str]] = [
    (Placement("nowhere", ()), "unknown"),
    (Placement("plain", (), cpu_milli=7001), "not enough CPU"),
    (Placement("plain", (), memory_bytes=63 * GIB + 1), "not enough memory"),
    (Placement("plain", (GpuSlot(4),)), "GPU 4 does not exist"),
    (Placement("plain", (GpuSlot(-1),)), "GPU -1 does not exist"),
    (Placement("plain", (GpuSlot(0),)), "GPU 0 is not free"),  # taken whole
    (Placement("plain", (GpuSlot(1),)), "GPU 1 is not free"),  # shared
    (Placement("plain", (GpuSlot(2), GpuSlot(2))), "GPU 2 is not free"),  # the same GPU twice
    (Placement("plain", (GpuSlot(2), GpuSlot(0))), "GPU 0 is not free"),  # second slot fails
    (Placement("plain", (GpuSlot(1, milli=401),)), "has 400 milli free, not 401"),
    (Placement("plain", (GpuSlot(0, milli=1),)), "not shareable"),
    (Placement("plain", (GpuSlot(2, milli=1000),)), "share 1000 out of range"),
    (Placement("plain", (GpuSlot(2, mig="1g.10gb", start=0),)), "MIG is not enabled"),
    (Placement("dyn", (GpuSlot(0, mig="1g.10gb", start=5),)), "slices for 1g.10gb@5 are in use"),
    (Placement("dyn", (GpuSlot(0, mig="4g.40gb", start=0), GpuSlot(0, mig="1g.10gb", start=4))), "in use"),
    (Placement("dyn", (GpuSlot(1, mig="3g.40gb", start=2),)), "cannot start at slice 2"),
    (Placement("dyn", (GpuSlot(1, mig="1g.6gb", start=0),)), "unknown on H100-80GB"),
    (
        Placement("dyn", (GpuSlot(1, mig="1g.10gb+me", start=0), GpuSlot(1, mig="1g.10gb+me", start=1))),
        "no room",
    ),
    (Placement("dyn", (GpuSlot(0),)), "GPU 0 is not free"),
    (Placement("dyn", (GpuSlot(0, milli=100),)), "not shareable"),
    (Placement("static", (GpuSlot(0, mig="2g.20gb", start=4),)), "already in use"),
    (Placement("static", (GpuSlot(0, mig="2g.20gb", start=0),)), "has no 2g.20gb@0 instance"),
    (Placement("static", (GpuSlot(1, mig="1g.10gb", start=0),)), "has no 1g.10gb@0 instance"),
    (Placement("static", (GpuSlot(0),)), "GPU 0 is not free"),
]


@pytest.mark.parametrize(("placement", "match"), BAD_COMMITS)
def test_commit_that_does_not_fit(inv: Inventory, placement: Placement, match: str) -> None:
    with unchanged(inv, InventoryError, match):
        inv.commit(placement)


def test_commit_without_a_pod_slot(inv: Inventory) -> None:
    for _ in range(2):  # "plain" has 4 slots, two taken by the fixture
        inv.commit(Placement("plain", ()))
    with unchanged(inv, InventoryError, "no pod slot left"):
        inv.commit(Placement("plain", ()))


BAD_RELEASES: list[tuple[Placement, str]] = [
    (Placement("nowhere", ()), "unknown"),
    (Placement("static", ()), "releasing more than is allocated"),  # CPU-only: one pod there
    (Placement("plain", (), cpu_milli=1001), "releasing more than is allocated"),
    (Placement("plain", (GpuSlot(2),)), "GPU 2 is not allocated whole"),
    (Placement("plain", (GpuSlot(0), GpuSlot(0))), "GPU 0 is not allocated whole"),  # twice
    (Placement("plain", (GpuSlot(2, milli=100),)), "share 100 is not allocated"),
    (Placement("plain", (GpuSlot(1, milli=601),)), "share 601 is not allocated"),
    (Placement("dyn", (GpuSlot(1, mig="1g.10gb", start=0),)), "1g.10gb@0 is not allocated"),
    (Placement("dyn", (GpuSlot(0, mig="3g.40gb", start=0),)), "3g.40gb@0 is not allocated"),
    # a smaller profile over part of the 3g.40gb@4 instance: the slices are in use, but not as that instance
    (Placement("dyn", (GpuSlot(0, mig="2g.20gb", start=4),)), "2g.20gb@4 is not allocated"),
    (Placement("dyn", (GpuSlot(0, mig="1g.10gb", start=4),)), "1g.10gb@4 is not allocated"),
    (Placement("dyn", (GpuSlot(0, mig="1g.10gb", start=6),)), "1g.10gb@6 is not allocated"),
    (Placement("static", (GpuSlot(0, mig="3g.40gb", start=0),)), "3g.40gb@0 already free"),
    (Placement("static", (GpuSlot(1, mig="1g.10gb", start=0),)), "has no 1g.10gb@0 instance"),
]


@pytest.mark.parametrize(("placement", "match"), BAD_RELEASES)
def test_release_of_what_was_never_committed(inv: Inventory, placement: Placement, match: str) -> None:
    if placement.node == "static" and not placement.slots:
        inv.release(Placement("static", (GpuSlot(0, mig="2g.20gb", start=4),)))  # now no pod there
    with unchanged(inv, InventoryError, match):
        inv.release(placement)


def test_release_twice(inv: Inventory) -> None:
    placement = Placement("dyn", (GpuSlot(1, mig="2g.20gb", start=2),), 500, GIB)
    inv.commit(placement)
    inv.release(placement)
    with unchanged(inv, InventoryError, "allocated"):
        inv.release(placement)
    inv.commit(replace(placement, cpu_milli=0, memory_bytes=0))  # the pod slot is taken again
    inv.release(replace(placement, cpu_milli=0, memory_bytes=0))
    with unchanged(inv, InventoryError, "2g.20gb@2 is not allocated"):
        inv.release(replace(placement, cpu_milli=0, memory_bytes=0))


def test_errors_are_value_errors() -> None:
    for error in (InventoryError, RequestError):
        assert issubclass(error, ValueError)


def test_deciding_never_changes_the_inventory(inv: Inventory) -> None:
    engine = Engine(inv, gpupack())
    before = state(inv)
    for request in (
        PodRequest(kind=Kind.WHOLE, gpus=1),
        PodRequest(kind=Kind.SHARE, milli=999),
        PodRequest(kind=Kind.MIG, mig=(("1g.10gb", 2), ("3g.40gb", 1))),
        PodRequest(cpu_milli=9000),
    ):
        engine.decide(request)
        reference_decide(inv, engine.policy, request)
    assert_same(before, state(inv))


def test_update_node_keeps_allocations_and_refuses_gpu_changes() -> None:
    """update_node changes scalars in place; a GPU change or a capacity below use is refused unchanged."""
    inv = Inventory()
    facts = NodeFacts("n", 8000, 64 << 30, 10, "NVIDIA-L4", 2)
    inv.add_node(facts)
    inv.commit(Placement("n", (GpuSlot(0),), 3000, 8 << 30))
    inv.update_node(replace(facts, cpu_milli=16000, spot=True, hourly_cost=4.0))
    row = inv.index["n"]
    assert inv.node_cpu_free[row] == 13000 and inv.node_cpu_cap[row] == 16000
    assert inv.node_spot[row] and inv.node_price[row] == 4.0
    assert inv.gpu_whole[row * 16]  # the GPU allocation survived
    before = {k: v.copy() for k, v in vars(inv).items() if isinstance(v, np.ndarray)}
    with pytest.raises(InventoryError, match="GPUs changed"):
        inv.update_node(replace(facts, gpu_count=4))
    with pytest.raises(InventoryError, match="below what is allocated"):
        inv.update_node(replace(facts, cpu_milli=1000))
    assert all(np.array_equal(before[k], v, equal_nan=True) for k, v in vars(inv).items() if isinstance(v, np.ndarray))
