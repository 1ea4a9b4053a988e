"""scoring.gang (#29): all members or none, in the smallest topology domain that holds them; a plan changes
nothing; properties over random clusters against a plain one-by-one reference."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupack.scoring.decider import Decider
from gpupack.scoring.facts import NodeFacts
from gpupack.scoring.gang import (
    CLIQUE_LABEL,
    DEFAULT_RACK_LABEL,
    ZONE_LABEL,
    Domain,
    GangPlan,
    Level,
    level_labels,
    node_labels_of,
    place_members,
    plan_gang,
    topology_domains,
)
from gpupack.scoring.inventory import Inventory
from gpupack.scoring.policies import gpupack
from gpupack.scoring.request import PodRequest
from tests.scoring.test_placement import H100, node, whole
from tests.scoring.test_property import assert_same_arrays, node_facts, pod_request, snapshot


def labelled(name: str, clique: str = "", rack: str = "", zone: str = "", gpus: int = 8) -> NodeFacts:
    labels = {CLIQUE_LABEL: clique, DEFAULT_RACK_LABEL: rack, ZONE_LABEL: zone}
    return node(name, H100, gpus, labels={k: v for k, v in labels.items() if v})


def cluster(*nodes: NodeFacts) -> Decider:
    inventory = Inventory()
    for facts in nodes:
        inventory.add_node(facts)
    return Decider(inventory, gpupack())


def plan(decider: Decider, request: PodRequest, count: int, widest: Level = Level.CLUSTER) -> GangPlan:
    domains = topology_domains(node_labels_of(decider.inventory), level_labels(), widest)
    return plan_gang(decider, request, count, domains)


def two_racks() -> Decider:
    """Rack r1: NVLink domains a (n0, n1) and b (n2); rack r2: n3, n4 without a clique; one zone."""
    return cluster(
        labelled("n0", "a", "r1", "z"),
        labelled("n1", "a", "r1", "z"),
        labelled("n2", "b", "r1", "z"),
        labelled("n3", "", "r2", "z"),
        labelled("n4", "", "r2", "z"),
    )


def test_domains_smallest_level_first_without_repeats() -> None:
    domains = topology_domains(node_labels_of(two_racks().inventory), level_labels())
    assert [(d.level, d.name, d.nodes) for d in domains] == [
        (Level.NVLINK, "a", ("n0", "n1")),
        (Level.NVLINK, "b", ("n2",)),
        (Level.RACK, "r1", ("n0", "n1", "n2")),
        (Level.RACK, "r2", ("n3", "n4")),
        (Level.ZONE, "z", ("n0", "n1", "n2", "n3", "n4")),  # the cluster has the same nodes: not listed again
    ]


def test_a_group_that_fits_one_nvlink_domain_stays_in_it() -> None:
    decider = two_racks()
    result = plan(decider, whole(4), 4)  # 16 GPUs: clique a holds them, clique b does not
    assert result.fits and result.domain is not None
    assert (result.domain.level, result.domain.name) == (Level.NVLINK, "a")
    assert {p.node for p in result.placements} == {"n0", "n1"}


def test_a_group_too_big_for_any_nvlink_domain_takes_the_smallest_rack() -> None:
    decider = two_racks()
    result = plan(decider, whole(8), 3)  # three whole nodes: rack r1 (3 nodes), not r2 (2 nodes)
    assert result.domain == Domain(Level.RACK, "r1", ("n0", "n1", "n2"))
    assert sorted(p.node for p in result.placements) == ["n0", "n1", "n2"]


def test_members_share_a_node_when_it_holds_them() -> None:
    decider = cluster(labelled("n0"), labelled("n1"))
    result = plan(decider, whole(2), 4)
    assert result.fits and {p.node for p in result.placements} == {"n0"}  # gpupack packs: one node, 8 GPUs


def test_a_group_that_does_not_fit_gets_nothing_and_the_largest_fit() -> None:
    decider = two_racks()
    before = snapshot(decider.inventory)
    result = plan(decider, whole(8), 6)
    assert not result.fits and result.placements == () and result.domain is None
    assert result.largest_fit == 5  # the whole zone took five
    assert_same_arrays(before, snapshot(decider.inventory))


def test_a_group_held_to_one_nvlink_domain_is_not_spread() -> None:
    decider = two_racks()
    result = plan(decider, whole(8), 3, widest=Level.NVLINK)
    assert not result.fits and result.largest_fit == 2  # clique a: two nodes


def test_busy_gpus_count_against_a_domain() -> None:
    decider = two_racks()
    for name in ("n0", "n1"):  # clique a half used: 8 GPUs free over two nodes
        decider.inventory.commit(decider.look(whole(4), [name]).placement)  # type: ignore[arg-type]
    result = plan(decider, whole(4), 3)
    assert result.domain is not None and (result.domain.level, result.domain.name) == (Level.RACK, "r1")


def test_no_members_no_plan() -> None:
    assert not plan(two_racks(), whole(1), 0).fits


@st.composite
def gang_case(draw: st.DrawFn) -> tuple[list[NodeFacts], PodRequest, int]:
    count = draw(st.integers(1, 5))
    nodes = []
    for i in range(count):
        facts = draw(node_facts(f"n{i}"))
        clique = draw(st.sampled_from(["", "a", "b"]))
        nodes.append(replace(facts, labels={CLIQUE_LABEL: clique} if clique else {}))
    request = draw(pod_request())
    return nodes, request, draw(st.integers(1, 6))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gang_case())
def test_plan_is_all_or_nothing_and_matches_one_by_one(case: tuple[list[NodeFacts], PodRequest, int]) -> None:
    """A plan leaves the inventory as it was; it holds `count` placements that commit together, all in its
    domain, or none; and it fits exactly when placing members one by one in some domain does."""
    nodes, request, count = case
    decider = cluster(*nodes)
    domains = topology_domains(node_labels_of(decider.inventory), level_labels())
    before = snapshot(decider.inventory)
    result = plan_gang(decider, request, count, domains)
    assert_same_arrays(before, snapshot(decider.inventory))
    one_by_one = [len(place_members(decider, request, count, d.nodes)[0]) for d in domains]
    assert result.largest_fit == (count if result.fits else max(one_by_one, default=0))
    assert result.fits == (count in one_by_one)
    if result.fits:
        assert result.domain is not None and len(result.placements) == count
        assert {p.node for p in result.placements} <= set(result.domain.nodes)
        assert min(d.level for d, n in zip(domains, one_by_one, strict=True) if n == count) == result.domain.level
        for placement in result.placements:
            decider.inventory.commit(placement)  # raises if two members were given the same capacity
