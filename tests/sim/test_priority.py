"""The priority protocol (#28 item 3): high-priority pods preempting in a full cluster, gpupack's victim
choice against kube-scheduler's counting, and the accounting of wasted evictions."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpupack.scoring.decider import Decider
from gpupack.scoring.facts import GpuSlot, MigMode, NodeFacts, Placement
from gpupack.scoring.request import Kind, PodRequest
from gpupack.sim.churn import inference_pods
from gpupack.sim.priority import (
    Choice,
    Chooser,
    Cluster,
    PriorityConfig,
    PriorityResult,
    candidate_limit,
    choose,
    count_victims,
    drawn_order,
    eligible,
    preempt,
    priority_arrivals,
    run_priority,
)
from gpupack.sim.scenarios import H100, churn_cluster
from gpupack.sim.simulate import make_policy
from gpupack.sim.workload import Trace, TracePod, gpu_count

GIB = 1 << 30
LOW, HIGH = 0, 1000
CONFIG = PriorityConfig()


def _mig_node(name: str = "h100-0", gpus: int = 2) -> NodeFacts:
    return NodeFacts(name, 64_000, 512 * GIB, 110, H100, gpus, mig_mode=MigMode.DYNAMIC)


def _plain_node(name: str = "v100-0", gpus: int = 2) -> NodeFacts:
    return NodeFacts(name, 64_000, 512 * GIB, 110, "V100", gpus)


def _mig(profile: str) -> PodRequest:
    return PodRequest(1000, GIB, Kind.MIG, mig=((profile, 1),))


def _decider(cluster: Cluster) -> Decider:
    return Decider.seeded(cluster.inventory, make_policy("gpupack", []), 0)


def _scattered_1g(cluster: Cluster, node: str = "h100-0") -> None:
    """Both GPUs full of 1g.10gb instances; the three started last sit on slice 0 of GPU 0, slice 2 of GPU 1
    and slice 5 of GPU 0, so freeing the newest three frees three compute slices but no 3g placement."""
    newest = {(0, 0): 100, (1, 2): 99, (0, 5): 98}
    start = itertools.count()
    for gpu, first in itertools.product(range(2), range(7)):
        placement = Placement(node, (GpuSlot(gpu, mig="1g.10gb", start=first),), 1000, GIB)
        when = newest.get((gpu, first), next(start))
        cluster.bind(f"g{gpu}-s{first}", _mig("1g.10gb"), placement, LOW, when)


# ----------------------------------------------------------------------------- counts
def test_counts_pool_gpu_capacity_per_node_by_units() -> None:
    cluster = Cluster([_mig_node(), _plain_node()])
    _scattered_1g(cluster)
    mig = cluster.nodes["h100-0"]
    assert mig.gpu_units_free == 0
    three_newest = [mig.pods[n] for n in ("g0-s0", "g1-s2", "g0-s5")]
    assert mig.count_fits(_mig("3g.40gb"), three_newest)  # 3 compute slices freed, wherever they are
    assert not mig.count_fits(_mig("3g.40gb"), three_newest[:2])
    plain = cluster.nodes["v100-0"]
    share = Placement("v100-0", (GpuSlot(0, milli=600),), 1000, GIB)
    cluster.bind("share", PodRequest(1000, GIB, Kind.SHARE, milli=600), share, LOW, 0)
    assert plain.gpu_units_free == 1400
    assert plain.count_fits(PodRequest(0, 0, Kind.WHOLE, gpus=1))
    assert not plain.count_fits(PodRequest(0, 0, Kind.WHOLE, gpus=2))
    assert plain.count_fits(PodRequest(0, 0, Kind.WHOLE, gpus=2), [plain.pods["share"]])


def test_eligible_nodes_follow_kind_product_and_size() -> None:
    mig, plain = _mig_node(), _plain_node()
    assert eligible(mig, _mig("3g.40gb")) and not eligible(plain, _mig("3g.40gb"))
    assert not eligible(mig, _mig("3g.71gb"))  # an H200 profile on an H100 node
    whole = PodRequest(0, 0, Kind.WHOLE, gpus=2)
    assert eligible(plain, whole) and not eligible(mig, whole)
    assert not eligible(plain, PodRequest(0, 0, Kind.WHOLE, gpus=4))
    assert not eligible(plain, PodRequest(0, 0, Kind.WHOLE, gpus=1, allowed_products=frozenset({"T4"})))
    assert eligible(plain, PodRequest(1000, GIB))


def test_candidate_limit_is_kube_schedulers() -> None:
    assert candidate_limit(30, CONFIG) == 30
    assert candidate_limit(500, CONFIG) == 100
    assert candidate_limit(1213, CONFIG) == 121


# ----------------------------------------------------------------------------- the constructed case
def test_counting_frees_scattered_slices_and_gpupack_frees_a_placement() -> None:
    """Seven 1g slices a GPU, the newest three scattered: counting evicts those three (the count fit holds)
    and the 3g still does not fit, three wasted evictions; gpupack evicts three aligned ones and places it."""
    request = _mig("3g.40gb")
    outcomes = {}
    for chooser in Chooser:
        cluster = Cluster([_mig_node()])
        _scattered_1g(cluster)
        decider = _decider(cluster)
        assert decider.decide(request).placement is None
        rng = np.random.default_rng(0)
        choice = choose(chooser, cluster, decider, request, HIGH, 200, rng, CONFIG)
        assert choice is not None
        result = PriorityResult(0, chooser.value)
        placement = preempt(cluster, decider, choice, request, result)
        outcomes[chooser] = (sorted(v.name for v in choice.victims), placement, result)
    victims, placement, result = outcomes[Chooser.COUNT]
    assert victims == ["g0-s0", "g0-s5", "g1-s2"]
    assert placement is None
    assert (result.evictions, result.wasted_evictions, result.wasted_preemptions) == (3, 3, 1)
    victims, placement, result = outcomes[Chooser.GPUPACK]
    assert len(victims) == 3 and len({v[:2] for v in victims}) == 1  # three slices of one GPU
    assert placement is not None and placement.slots[0].mig == "3g.40gb" and placement.slots[0].start == 4
    assert (result.evictions, result.wasted_evictions, result.wasted_preemptions) == (3, 0, 0)


def test_count_victims_reprieve_the_earliest_started_first() -> None:
    cluster = Cluster([_mig_node()])
    _scattered_1g(cluster)
    victims = count_victims(cluster.nodes["h100-0"], _mig("2g.20gb"), HIGH)
    assert victims is not None and sorted(v.name for v in victims) == ["g0-s0", "g1-s2"]
    assert count_victims(cluster.nodes["h100-0"], _mig("2g.20gb"), LOW) is None  # equal priority: never


# ----------------------------------------------------------------------------- accounting
def _full_plain_node() -> tuple[Cluster, Decider]:
    """Two GPUs, each holding a 600-milli share (s00, s10) and a 400-milli one (s01, s11)."""
    cluster = Cluster([_plain_node()])
    for gpu, k in itertools.product(range(2), range(2)):
        milli = 600 if k == 0 else 400
        placement = Placement("v100-0", (GpuSlot(gpu, milli=milli),), 1000, GIB)
        cluster.bind(f"s{gpu}{k}", PodRequest(1000, GIB, Kind.SHARE, milli=milli), placement, LOW, 2 * gpu + k)
    return cluster, _decider(cluster)


def test_a_wasted_eviction_is_counted_when_the_victims_went_and_the_preemptor_did_not_fit() -> None:
    cluster, decider = _full_plain_node()
    nodes = cluster.nodes["v100-0"]
    request = PodRequest(1000, GIB, Kind.SHARE, milli=500)
    split = (nodes.pods["s01"], nodes.pods["s11"])  # 400 + 400 freed milli, split over the two GPUs
    result = PriorityResult(0, "test")
    assert preempt(cluster, decider, Choice("v100-0", split), request, result) is None
    assert (result.preemptions, result.evictions, result.wasted_preemptions, result.wasted_evictions) == (1, 2, 1, 2)
    assert set(nodes.pods) == {"s00", "s10"}  # the victims went all the same
    one_gpu = (nodes.pods["s00"],)  # now GPU 0 is empty: the 500 fits
    placement = preempt(cluster, decider, Choice("v100-0", one_gpu), request, result)
    assert placement is not None and placement.slots[0].index == 0
    assert (result.preemptions, result.evictions, result.wasted_preemptions, result.wasted_evictions) == (2, 3, 1, 2)


def test_no_candidate_node_evicts_nothing_and_wastes_nothing() -> None:
    cluster, decider = _full_plain_node()
    request = PodRequest(1000, GIB, Kind.WHOLE, gpus=2)
    for chooser in Chooser:  # everything at the preemptor's own priority: nobody may go
        assert choose(chooser, cluster, decider, request, LOW, 10, np.random.default_rng(0), CONFIG) is None


def _small_run(chooser: Chooser, seed: int) -> PriorityResult:
    nodes = churn_cluster().scaled(0.1).build()
    pods = inference_pods(200)
    order = drawn_order(pods, gpu_count(nodes), seed, 2.0)
    return run_priority(Trace(nodes, pods), order, make_policy("gpupack", order), chooser, seed)


@pytest.mark.parametrize("chooser", list(Chooser))
def test_a_run_keeps_its_books(chooser: Chooser) -> None:
    for seed in (1, 2):
        result = _small_run(chooser, seed)
        assert result.high_submitted > 0 and result.preemptions > 0
        assert result.high_placed + result.high_pending == result.high_submitted
        assert result.wasted_preemptions == result.preemptions - result.high_placed_by_preemption
        assert result.wasted_evictions <= result.evictions
        assert result.evictions >= result.preemptions
        if chooser == Chooser.GPUPACK:
            assert result.wasted_evictions == 0 and result.high_pending == result.no_node
        cluster = result.cluster
        assert cluster is not None
        inventory = cluster.inventory  # the books and the inventory agree
        for name, state in cluster.nodes.items():
            row = inventory.index[name]
            assert int(inventory.node_cpu_free[row]) == state.cpu_free
            assert int(inventory.node_pods_free[row]) == state.pods_free
            assert inventory.node_is_empty(row) == (not state.pods)


# ----------------------------------------------------------------------------- arrivals
def test_arrivals_fill_low_then_a_seeded_share_is_high() -> None:
    pod = TracePod("one", PodRequest(1000, GIB, Kind.WHOLE, gpus=1))
    order = [pod.clone(f"p{i}") for i in range(4000)]
    config = PriorityConfig(high_fraction=0.1)
    arrivals = priority_arrivals(order, 1000, 7, config)
    assert all(a.priority == LOW for a in arrivals[:1000])  # the fill: 1000 GPUs of demand
    high = sum(a.priority == HIGH for a in arrivals[1000:])
    assert high == pytest.approx(300, abs=60)
    again = priority_arrivals(order, 1000, 7, config)
    assert [a.priority for a in again] == [a.priority for a in arrivals]
    assert [a.priority for a in priority_arrivals(order, 1000, 8, config)] != [a.priority for a in arrivals]
    with pytest.raises(ValueError):
        PriorityConfig(high_fraction=1.5)


def test_drawn_order_reaches_the_ratio_under_names_of_its_own() -> None:
    pods = inference_pods(100)
    order = drawn_order(pods, 24, 5, 2.0)
    assert len({p.name for p in order}) == len(order)
    assert order == drawn_order(pods, 24, 5, 2.0)
    with pytest.raises(ValueError, match="GPU"):
        drawn_order([TracePod("cpu", PodRequest(1000))], 8, 1, 1.3)
