"""defrag.plan (#31): moves only where the simulation shows they help, never of a pod that may not move.

Every plan is also replayed on the original inventory (`replay`): the evictions released, the new
placements and the pending pod's committed in order, each commit checked by the inventory, and the goal
checked afterwards. A random property test holds every plan to that.
"""

from __future__ import annotations

import copy
import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupack.scoring.decider import Decider
from gpupack.scoring.defrag import Goal, Pending, Resident, plan_defrag
from gpupack.scoring.facts import GpuSlot, MigMode, NodeFacts, Placement
from gpupack.scoring.inventory import Inventory
from gpupack.scoring.policies import gpupack
from gpupack.scoring.request import PodRequest
from tests.scoring.test_placement import mig, whole

GIB = 1 << 30
H100 = "NVIDIA-H100-80GB-HBM3"


class Cluster:
    """H100 nodes and the pods committed on them, as residents."""

    def __init__(
        self, nodes: int, gpus: int = 8, mode: MigMode = MigMode.NONE, prices: tuple[float, ...] = ()
    ) -> None:
        self.inventory = Inventory()
        for i in range(nodes):
            price = prices[i] if i < len(prices) else None
            self.inventory.add_node(
                NodeFacts(f"n{i}", 64000, 512 * GIB, gpu_product=H100, gpu_count=gpus, mig_mode=mode, hourly_cost=price)
            )
        self.residents: list[Resident] = []

    def add(self, key: str, node: str, request: PodRequest, *slots: GpuSlot, **kw: Any) -> None:
        placement = Placement(node, slots, request.cpu_milli, request.memory_bytes)
        self.inventory.commit(placement)
        self.residents.append(Resident(f"default/{key}", placement, request, **kw))

    def plan(self, pending: list[Pending] | None = None, **kw: Any) -> Any:
        names = [n for n in self.inventory.index]
        return plan_defrag(self.inventory, self.residents, pending or [], names, gpupack_policy(), **kw)


def gpupack_policy() -> Any:
    return gpupack()


def replay(inventory: Inventory, residents: list[Resident], plan: Any, pending: list[Pending]) -> Inventory:
    """The plan carried out on a copy of `inventory`; asserts each step is legal and each goal met."""
    live = copy.deepcopy(inventory)
    where = {r.key: r.placement for r in residents}
    movable = {r.key for r in residents if not r.unmovable and not r.daemon and r.request is not None}
    asks = {p.key: p.request for p in pending}
    for move in plan.moves:
        if move.goal == Goal.PENDING:  # it did not fit before the move
            assert Decider(copy.deepcopy(live), gpupack_policy()).decide(asks[move.target]).placement is None
        for eviction in move.evictions:
            assert eviction.pod in movable, f"{eviction.pod} may not move"
            live.release(where.pop(eviction.pod))
        if move.goal == Goal.PENDING:
            live.commit(move.placement)
        for eviction in move.evictions:
            live.commit(eviction.to)  # raises when the simulation handed capacity out twice
            where[eviction.pod] = eviction.to
        if move.goal == Goal.FREE_GPU:
            node, gpu = move.target.rsplit("/gpu-", 1)
            assert all(not (p.node == node and any(s.index == int(gpu) for s in p.slots)) for p in where.values())
        if move.goal == Goal.FREE_NODE:
            assert all(p.node != move.target for k, p in where.items() if k in movable)
    return live


def test_a_pending_8_gpu_pod_gets_a_node_by_moving_the_fewest_movable_pods() -> None:
    cluster = Cluster(3)
    for n in range(3):  # a 6-GPU pod on each node, then 1-GPU pods: n0 and n1 have one GPU free, n2 none
        cluster.add(f"n{n}-big", f"n{n}", whole(6), *(GpuSlot(g) for g in range(6)), unmovable="a bare pod")
        cluster.add(f"n{n}-g6", f"n{n}", whole(1), GpuSlot(6))
    cluster.add("n2-g7", "n2", whole(1), GpuSlot(7))
    pending = [Pending("default/train", whole(2))]
    plan = cluster.plan(pending, goals=[Goal.PENDING])
    [move] = plan.moves
    assert move.goal == Goal.PENDING and move.target == "default/train"
    assert [e.pod for e in move.evictions] == ["default/n0-g6"]  # one eviction (n0 and n1 tie: the first)
    assert move.placement is not None and move.placement.node == "n0"
    assert move.evictions[0].to.node == "n1"
    replay(cluster.inventory, cluster.residents, plan, pending)


def test_a_pending_7g_pod_is_placed_by_moving_scattered_1g_instances_onto_gpus_in_use() -> None:
    cluster = Cluster(1, gpus=2, mode=MigMode.DYNAMIC)
    cluster.add("a", "n0", mig("1g.10gb"), GpuSlot(0, mig="1g.10gb", start=6))
    cluster.add("b", "n0", mig("1g.10gb"), GpuSlot(1, mig="1g.10gb", start=6))
    pending = [Pending("default/big", mig("7g.80gb"))]
    plan = cluster.plan(pending, goals=[Goal.PENDING])
    [move] = plan.moves
    [eviction] = move.evictions
    assert move.placement is not None and move.placement.slots[0].mig == "7g.80gb"
    assert eviction.to.slots[0].index != move.placement.slots[0].index
    replay(cluster.inventory, cluster.residents, plan, pending)


def test_unmovable_pods_are_never_evicted_and_the_plan_says_why() -> None:
    cluster = Cluster(1, gpus=2, mode=MigMode.DYNAMIC)
    cluster.add("a", "n0", mig("1g.10gb"), GpuSlot(0, mig="1g.10gb", start=6), unmovable="a bare pod")
    cluster.add("b", "n0", mig("1g.10gb"), GpuSlot(1, mig="1g.10gb", start=6), unmovable="a bare pod")
    pending = [Pending("default/big", mig("7g.80gb"))]
    plan = cluster.plan(pending)
    assert plan.moves == [] and "default/big" in plan.skipped
    assert "may not move" in plan.skipped["n0/gpu-0"]


def test_a_pod_that_fits_now_needs_no_move() -> None:
    cluster = Cluster(1)
    plan = cluster.plan([Pending("default/p", whole(8))])
    assert plan.moves == [] and plan.skipped == {"default/p": "fits now without a move"}


def test_a_gpu_is_freed_only_when_its_pods_fit_on_gpus_in_use() -> None:
    cluster = Cluster(1, gpus=3, mode=MigMode.DYNAMIC)
    cluster.add("full", "n0", mig("4g.40gb"), GpuSlot(0, mig="4g.40gb", start=0))
    cluster.add("lone", "n0", mig("2g.20gb"), GpuSlot(1, mig="2g.20gb", start=4))
    plan = cluster.plan(goals=[Goal.FREE_GPU])
    [move] = plan.moves
    assert move.target == "n0/gpu-1" and [e.pod for e in move.evictions] == ["default/lone"]
    assert move.evictions[0].to.slots[0].index == 0  # beside the 4g, not onto the untouched GPU 2
    assert move.gain == "untouched GPUs 1 -> 2"
    replay(cluster.inventory, cluster.residents, plan, [])


def test_moving_a_pod_onto_an_untouched_gpu_is_no_gain_and_not_planned() -> None:
    cluster = Cluster(1, gpus=2)
    cluster.add("one", "n0", whole(1), GpuSlot(0))
    plan = cluster.plan(goals=[Goal.FREE_GPU])
    assert plan.moves == [] and "n0/gpu-0" in plan.skipped


def test_a_node_is_freed_when_its_pods_fit_elsewhere_and_its_daemon_pods_stay() -> None:
    cluster = Cluster(2)
    cluster.add("x", "n0", whole(4), *(GpuSlot(g) for g in range(4)))
    cluster.add("y", "n1", whole(2), GpuSlot(0), GpuSlot(1))
    cluster.add("agent", "n1", PodRequest(cpu_milli=100), daemon=True, unmovable="a DaemonSet pod")
    plan = cluster.plan(goals=[Goal.FREE_NODE])
    [move] = plan.moves
    assert move.target == "n1" and [e.pod for e in move.evictions] == ["default/y"]
    replay(cluster.inventory, cluster.residents, plan, [])


def test_nodes_are_emptied_fewest_gpus_first_then_dearest_and_a_node_taking_pods_is_not_emptied() -> None:
    """n0 and n1 hold one GPU each and n1 is dearer, so n1 is emptied first (onto n0, first in the fixed
    order); n2's pod then joins it there; n0, which took pods, stays. A node without GPUs is no candidate."""
    cluster = Cluster(3, prices=(10.0, 20.0, 10.0))
    cluster.inventory.add_node(NodeFacts("cpu", 64000, 512 * GIB))
    cluster.add("a", "n0", whole(1), GpuSlot(0))
    cluster.add("b", "n1", whole(1), GpuSlot(0))
    cluster.add("c", "n2", whole(4), *(GpuSlot(g) for g in range(4)))
    cluster.add("d", "cpu", PodRequest(cpu_milli=1000))
    plan = cluster.plan(goals=[Goal.FREE_NODE])
    moved = [(m.target, [(e.pod, e.to.node) for e in m.evictions]) for m in plan.moves]
    assert moved == [("n1", [("default/b", "n0")]), ("n2", [("default/c", "n0")])]
    assert plan.skipped == {"n0": "takes pods of the move for n1: a pod moves once"}
    replay(cluster.inventory, cluster.residents, plan, [])


def test_a_node_not_emptied_names_the_pod_that_fits_nowhere_else_and_nodes_tried_are_bounded() -> None:
    cluster = Cluster(2)
    cluster.add("small", "n0", whole(1), GpuSlot(0))
    cluster.add("big", "n0", whole(7), *(GpuSlot(g) for g in range(1, 8)))
    cluster.add("other", "n1", whole(8), *(GpuSlot(g) for g in range(8)))
    plan = cluster.plan(goals=[Goal.FREE_NODE])
    assert plan.moves == []
    assert plan.skipped == {"n0": "pod default/big fits nowhere else", "n1": "pod default/other fits nowhere else"}
    assert set(cluster.plan(goals=[Goal.FREE_NODE], nodes_tried=1).skipped) == {"n0"}


def test_the_eviction_budget_bounds_the_plan() -> None:
    cluster = Cluster(1, gpus=2, mode=MigMode.DYNAMIC)
    cluster.add("a", "n0", mig("1g.10gb"), GpuSlot(0, mig="1g.10gb", start=6))
    cluster.add("b", "n0", mig("1g.10gb"), GpuSlot(1, mig="1g.10gb", start=6))
    plan = cluster.plan([Pending("default/big", mig("7g.80gb"))], max_evictions=0)
    assert plan.moves == [] and plan.evictions == 0


def test_the_live_inventory_is_not_changed() -> None:
    cluster = Cluster(1, gpus=2, mode=MigMode.DYNAMIC)
    cluster.add("a", "n0", mig("1g.10gb"), GpuSlot(0, mig="1g.10gb", start=6))
    cluster.add("b", "n0", mig("1g.10gb"), GpuSlot(1, mig="1g.10gb", start=6))
    before = copy.deepcopy(cluster.inventory)
    cluster.plan([Pending("default/big", mig("7g.80gb"))])
    assert (before.gpu_slices == cluster.inventory.gpu_slices).all()
    assert (before.node_cpu_free == cluster.inventory.node_cpu_free).all()


PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), nodes=st.integers(1, 3), share_unmovable=st.floats(0, 0.5))
def test_every_plan_replays_legally_on_the_original_inventory(seed: int, nodes: int, share_unmovable: float) -> None:
    """Random dynamic-MIG clusters filled by gpupack itself in random order, random pending pods: every
    move the plan makes is legal on the original inventory, evicts only movable pods, and meets its goal."""
    rng = random.Random(seed)
    cluster = Cluster(nodes, gpus=4, mode=MigMode.DYNAMIC)
    decider = Decider(cluster.inventory, gpupack())
    for i in range(rng.randrange(4, 30)):
        request = mig(rng.choice(PROFILES))
        placement = decider.decide(request).placement
        if placement is None:
            continue
        unmovable = "a bare pod" if rng.random() < share_unmovable else ""
        cluster.add(f"p{i}", placement.node, request, *placement.slots, unmovable=unmovable)
    for key in rng.sample([r.key for r in cluster.residents], k=len(cluster.residents) // 3):
        gone = next(r for r in cluster.residents if r.key == key)
        cluster.inventory.release(gone.placement)
        cluster.residents.remove(gone)
    pending = [Pending(f"default/q{i}", mig(rng.choice(PROFILES[2:]))) for i in range(rng.randrange(0, 3))]
    budget = rng.randrange(0, 6)
    plan = cluster.plan(pending, max_evictions=budget)
    assert plan.evictions <= budget
    replay(cluster.inventory, cluster.residents, plan, pending)
