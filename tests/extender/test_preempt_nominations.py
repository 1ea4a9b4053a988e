"""Holds for nominated preemptors (#28 item 2): what the victims free goes to the pod they were evicted
for, and to nobody else; each way a hold ends; victims that never go leave nothing handed out twice."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from gpupack.extender.decisions import Outcome
from gpupack.extender.nominations import PLAN_TTL_SECONDS, HoldEnded
from gpupack.extender.settings import Settings
from gpupack.extender.state import ClusterState
from gpupack.kube.node_facts import facts_from_node
from gpupack.kube.sources import NodeUpserted, PodDeleted, PodUpserted
from gpupack.scoring.facts import Placement
from gpupack.scoring.inventory import Inventory
from tests.extender.test_preempt import client_of, meta_args, preempt, preemptor, victims_of, whole
from tests.extender_helpers import FakeClock, node, pod, state_from

NODES = [node("a"), node("b")]
BOSS = "uid-default-boss"


def setup(clock: FakeClock | None = None) -> tuple[ClusterState, list[dict[str, Any]]]:
    """Node a full of 1-GPU pods p0..p7 (priorities 1..8), node b full of priority-1000 pods; the
    preemptor `boss` (priority 100, 2 GPUs) pending; its preempt call planned p0 and p1 on a."""
    victims = [whole(f"p{i}", i + 1, i) for i in range(8)]
    guards = [whole(f"hi{i}", 1000, i, "b") for i in range(8)]
    state = state_from(NODES, [*victims, *guards, preemptor()], clock=clock or FakeClock())
    plans = state.plan_preemption(preemptor(), ["a", "b"])
    assert {n: sorted(v.key for v in plan.victims) for n, plan in plans.items()} == {"a": ["default/p0", "default/p1"]}
    return state, victims


def nominate(state: ClusterState, node_name: str) -> None:
    boss = preemptor()
    boss["status"]["nominatedNodeName"] = node_name
    state.apply(PodUpserted(boss))


def terminate(state: ClusterState, victim: dict[str, Any]) -> None:
    leaving = dict(victim, metadata={**victim["metadata"], "deletionTimestamp": "2027-01-01T00:00:00Z"})
    state.apply(PodUpserted(leaving))


def delete(state: ClusterState, name: str) -> None:
    state.apply(PodDeleted(f"default/{name}", f"uid-default-{name}"))


def filter_for(state: ClusterState, obj: dict[str, Any], nodes: list[str]) -> str | None:
    chosen, _, _ = state.decide_for_filter(obj, nodes)
    return chosen


def held_gpus(state: ClusterState) -> list[int]:
    return sorted(slot.index for piece in state.nominations.held_for(BOSS) for slot in piece.slots)


def assert_consistent(state: ClusterState) -> None:
    """The live inventory holds exactly the bound pods, the reservations and the holds: nothing twice
    (a fresh inventory takes them all) and nothing leaked (its free capacity equals the live one's)."""
    fresh = Inventory()
    for obj in NODES:
        fresh.add_node(facts_from_node(obj))
    held: list[Placement] = [p for pieces in state.nominations.held().values() for p in pieces]
    for placement in [*state.placements().values(), *held]:
        fresh.commit(placement)
    live = state.inventory
    for array in ("node_cpu_free", "node_mem_free", "node_pods_free", "gpu_milli_free", "gpu_whole"):
        size = live.size * (16 if array.startswith("gpu") else 1)
        assert np.array_equal(getattr(live, array)[:size], getattr(fresh, array)[:size]), array


def test_the_victims_gpus_are_held_as_they_go_and_handed_to_the_nominee_only() -> None:
    state, victims = setup()
    nominate(state, "a")
    terminate(state, victims[0])
    terminate(state, victims[1])
    assert held_gpus(state) == []  # terminating pods still hold their GPUs: nothing is held that is not free
    thief = pod("thief", gpus=1)
    delete(state, "p0")
    assert held_gpus(state) == [0]
    assert filter_for(state, thief, ["a"]) is None  # the freed GPU is not handed to another pod
    delete(state, "p1")
    assert held_gpus(state) == [0, 1]
    assert filter_for(state, thief, ["a", "b"]) is None
    assert_consistent(state)
    assert state.snapshot().holds == 1
    assert filter_for(state, preemptor(), ["a", "b"]) == "a"
    reservation = state.book.get(BOSS)
    assert reservation is not None and sorted(s.index for s in reservation.placement.slots) == [0, 1]
    assert state.nominations.held() == {}
    assert state.nominations.ended == {HoldEnded.HANDED: 1}
    assert state.snapshot().holds_ended == {"handed to the nominee": 1}
    assert_consistent(state)


def test_the_hold_ends_when_the_nominee_binds() -> None:
    state, _ = setup()
    nominate(state, "a")
    delete(state, "p0")
    delete(state, "p1")
    assert held_gpus(state) == [0, 1]
    bound = preemptor(node_name="a", assignment={"node": "a", "gpus": [{"index": 0}, {"index": 1}]})
    state.apply(PodUpserted(bound))  # bound otherwise (another path): it takes what it names, the hold goes
    assert state.nominations.held() == {} and state.nominations.ended == {HoldEnded.BOUND: 1}
    assert state.bound_pods()[BOSS].placement is not None
    assert_consistent(state)


def test_the_hold_ends_when_the_nominee_is_deleted() -> None:
    state, _ = setup()
    nominate(state, "a")
    delete(state, "p0")
    delete(state, "boss")
    assert state.nominations.held() == {} and state.nominations.ended == {HoldEnded.DELETED: 1}
    assert filter_for(state, pod("thief", gpus=1), ["a"]) == "a"  # GPU 0 is free for anyone again
    assert_consistent(state)


def test_the_hold_ends_when_the_nominee_is_nominated_elsewhere_or_no_longer() -> None:
    state, _ = setup()
    nominate(state, "a")
    delete(state, "p0")
    nominate(state, "b")  # no plan there: nothing to hold
    assert state.nominations.held() == {} and state.nominations.ended == {HoldEnded.ELSEWHERE: 1}
    nominate(state, "a")
    assert held_gpus(state) == [0]
    nominate(state, "")
    assert state.nominations.held() == {} and state.nominations.ended == {HoldEnded.ELSEWHERE: 2}
    assert_consistent(state)


def test_the_hold_ends_when_the_ttl_passes() -> None:
    clock = FakeClock()
    state, _ = setup(clock)
    nominate(state, "a")
    delete(state, "p0")
    assert held_gpus(state) == [0]
    clock.advance(PLAN_TTL_SECONDS + 1)
    assert filter_for(state, pod("thief", gpus=1), ["a"]) == "a"  # the filter sees the TTL passed first
    assert state.nominations.held() == {} and state.nominations.ended == {HoldEnded.EXPIRED: 1}
    assert_consistent(state)


def test_victims_that_never_go_leave_nothing_handed_out_twice() -> None:
    clock = FakeClock()
    state, victims = setup(clock)
    before = state.snapshot().gpus_allocated
    nominate(state, "a")
    terminate(state, victims[0])  # p0 starts to go but never does; p1 is never even evicted
    assert held_gpus(state) == []
    assert filter_for(state, preemptor(), ["a"]) is None  # the nominee cannot have what others still hold
    assert filter_for(state, pod("thief", gpus=1), ["a"]) is None
    assert state.book.get(BOSS) is None
    assert_consistent(state)
    clock.advance(PLAN_TTL_SECONDS + 1)
    state.apply(PodUpserted(victims[2]))  # any event: the TTL passes
    assert state.nominations.held() == {} and state.snapshot().gpus_allocated == before
    assert_consistent(state)


def test_pods_the_source_shows_bound_win_over_holds() -> None:
    """GPU 0 freed and held; another scheduler binds a pod there anyway: the pod holds it, the hold does
    not, and the nominee is never given GPU 0 (nothing twice)."""
    state, _ = setup()
    nominate(state, "a")
    delete(state, "p0")
    assert held_gpus(state) == [0]
    intruder = whole("intruder", 0, 0, scheduler="default-scheduler")
    state.apply(PodUpserted(intruder))
    assert state.bound_pods()["uid-default-intruder"].placement is not None
    assert held_gpus(state) == []
    delete(state, "p1")
    assert held_gpus(state) == [1]
    assert filter_for(state, preemptor(), ["a"]) is None
    assert_consistent(state)


def test_a_node_rebuilt_under_a_hold_keeps_the_books_straight() -> None:
    state, _ = setup()
    nominate(state, "a")
    delete(state, "p0")
    changed = node("a", cpu="191")  # new facts: the node is re-added and everything re-committed
    state.apply(NodeUpserted(changed))
    NODES[0] = changed
    try:
        assert held_gpus(state) == [0]
        assert_consistent(state)
    finally:
        NODES[0] = node("a")


def test_a_second_preempt_call_plans_with_its_own_hold_as_free_and_keeps_it() -> None:
    state, _ = setup()
    nominate(state, "a")
    delete(state, "p0")
    plans = state.plan_preemption(preemptor(), ["a"])
    assert [v.key for v in plans["a"].victims] == ["default/p1"]
    assert held_gpus(state) == [0]
    assert_consistent(state)


def test_without_decide_in_filter_the_full_hold_is_given_back_for_the_nominee_to_take() -> None:
    state, _ = setup()
    state.settings = state.service_decisions.settings = Settings(decide_in_filter=False)
    nominate(state, "a")
    delete(state, "p0")
    delete(state, "p1")
    assert held_gpus(state) == [0, 1]
    passed, _, _ = state.feasible_for_filter(preemptor(), ["a", "b"])
    assert passed == ["a"] and state.nominations.ended == {HoldEnded.HANDED: 1}
    assert_consistent(state)


def test_the_whole_exchange_over_http_preempt_nominate_filter_bind_in_one_placement() -> None:
    """kube-scheduler's order of calls: /preempt, its evictions and nomination (seen by the watch), then
    /filter of the nominee on its nominated node alone: it gets exactly the planned GPUs."""
    state, _ = setup()
    client = client_of(state)
    answer = preempt(client, meta_args(preemptor(), ["a", "b"]))
    assert sorted(victims_of(answer)["a"]) == ["uid-default-p0", "uid-default-p1"] and "b" not in victims_of(answer)
    planned = state.nominations.nominee(BOSS)
    assert planned is not None
    placement = planned.plans["a"].placement
    nominate(state, "a")
    delete(state, "p0")
    delete(state, "p1")
    body = orjson.dumps({"Pod": preemptor(), "Nodes": None, "NodeNames": ["a"]})
    response = client.post("/filter", content=body, headers={"Content-Type": "application/json"})
    assert response.json()["NodeNames"] == ["a"]
    reservation = state.book.get(BOSS)
    assert reservation is not None and reservation.placement == placement
    assert state.decisions[Outcome.NOMINATED, ""] == 1
    assert_consistent(state)


# ------------------------------------------------------------------ defrag holds (#31)
def with_hold(obj: dict[str, Any], value: object) -> dict[str, Any]:
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    obj["metadata"]["annotations"]["gpupack.io/defrag-hold"] = text
    return obj


def test_a_defrag_hold_keeps_what_the_moved_pods_free_for_the_pending_pod_only() -> None:
    """Node a full of 1-GPU pods; defrag moves p0 and p1 for `boss` (2 GPUs) and marks it with the hold."""
    victims = [whole(f"p{i}", i + 1, i) for i in range(8)]
    state = state_from(NODES, [*victims, *(whole(f"hi{i}", 1000, i, "b") for i in range(8))], clock=FakeClock())
    state.apply(PodUpserted(with_hold(preemptor(), {"node": "a", "gpus": [{"index": 0}, {"index": 1}]})))
    delete(state, "p0")
    assert held_gpus(state) == [0]
    assert filter_for(state, pod("thief", gpus=1), ["a", "b"]) is None  # the evicted pod's replacement waits
    delete(state, "p1")
    assert held_gpus(state) == [0, 1]
    assert filter_for(state, preemptor(), ["a", "b"]) == "a"
    assert state.nominations.ended == {HoldEnded.HANDED: 1}
    assert_consistent(state)


def test_a_defrag_hold_that_cannot_be_read_is_ignored_once_and_counted() -> None:
    state = state_from(NODES, [whole("p0", 1, 0)], clock=FakeClock())
    boss = with_hold(preemptor(), {"node": "a", "gpus": [{"index": 0}]})  # one GPU for a 2-GPU pod
    state.apply(PodUpserted(boss))
    state.apply(PodUpserted(boss))
    assert state.nominations.bad_holds == 1 and state.nominations.held() == {}
    state.apply(PodUpserted(with_hold(preemptor(), "not json")))
    assert state.nominations.bad_holds == 2


def test_an_expired_defrag_hold_is_not_taken_up_again() -> None:
    clock = FakeClock()
    state = state_from(NODES, [whole("p0", 1, 0)], clock=clock)
    boss = with_hold(preemptor(), {"node": "a", "gpus": [{"index": 1}, {"index": 2}]})
    state.apply(PodUpserted(boss))
    assert held_gpus(state) == [1, 2]
    clock.advance(PLAN_TTL_SECONDS + 1)
    state.apply(PodUpserted(boss))  # kube-scheduler updates the pending pod's status: the same hold
    assert state.nominations.held() == {} and state.nominations.ended == {HoldEnded.EXPIRED: 1}
    assert_consistent(state)


def test_the_free_rest_of_a_gpu_whose_planned_instance_is_not_free_yet_goes_to_nobody() -> None:
    """A 7g.80gb hold on GPU 0 of a dynamic-MIG node whose 1g mover has not left yet: its replacement (seen
    before the mover's deletion) goes beside the other 1g on GPU 1, not into GPU 0's free slices."""
    one_g = [{"index": 0, "mig": "1g.10gb", "start": 6}]
    mover = pod("mover", mig="1g.10gb", node_name="m", assignment={"node": "m", "gpus": one_g})
    other = [{"index": 1, "mig": "1g.10gb", "start": 6}]
    pinned = pod("pinned", mig="1g.10gb", node_name="m", assignment={"node": "m", "gpus": other})
    state = state_from([node("m", gpus=2, mig="dynamic")], [mover, pinned], clock=FakeClock())
    hold = {"node": "m", "gpus": [{"index": 0, "mig": "7g.80gb", "start": 0}]}
    big = with_hold(pod("big", mig="7g.80gb"), hold)
    state.apply(PodUpserted(big))
    held_slots = [s for p in state.nominations.held_for("uid-default-big") for s in p.slots]
    assert held_slots == []  # the 7g is not free (only its CPU and memory are held): its GPU is fenced
    replacement = pod("mover-2", mig="1g.10gb")
    assert filter_for(state, replacement, ["m"]) == "m"
    assert state.book.get("uid-default-mover-2").placement.slots[0].index == 1  # type: ignore[union-attr]
    state.apply(PodDeleted("default/mover", "uid-default-mover"))
    assert [s.mig for p in state.nominations.held_for("uid-default-big") for s in p.slots] == ["7g.80gb"]
    assert filter_for(state, big, ["m"]) == "m"
    assert state.nominations.ended == {HoldEnded.HANDED: 1} and state.nominations.held() == {}
