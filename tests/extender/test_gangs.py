"""Gang placement in the service (#29, docs/gangs.md): all members or none, nothing held for a group that is
not complete or does not fit, competing groups never deadlock, and every way a hold ends gives back
exactly what it held."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gpupack.extender.binder import BindError
from gpupack.extender.decisions import Outcome
from gpupack.extender.explain import explain, render_text
from gpupack.extender.gang_roster import NOTED_SECONDS
from gpupack.extender.gangs import HoldEnded, PlanOutcome
from gpupack.extender.reservations import Ended
from gpupack.extender.settings import Settings
from gpupack.extender.state import ClusterState
from gpupack.kube.node_facts import facts_from_node
from gpupack.kube.sources import GroupUpserted, NodeUpserted, PodDeleted, PodUpserted
from gpupack.scoring.gang import CLIQUE_LABEL
from gpupack.scoring.inventory import Inventory
from tests.extender_helpers import FakeClock, node, pod, state_from

NODES = [node("a"), node("b")]


def member(name: str, group: str = "train", size: int | None = 3, gpus: int = 4, **kw: Any) -> dict[str, Any]:
    """A pod of gpupack's group `group` (annotation pair) asking for `gpus` whole GPUs."""
    notes = {"gpupack.io/group": group}
    if size is not None:
        notes["gpupack.io/group-size"] = str(size)
    return pod(name, gpus=gpus, uid=f"uid-{name}", annotations=notes, **kw)


def filter_for(state: ClusterState, obj: dict[str, Any], nodes: list[str] | None = None) -> tuple[str | None, dict]:
    chosen, failed, unresolvable = state.decide_for_filter(obj, nodes or [n["metadata"]["name"] for n in NODES])
    return chosen, {**failed, **unresolvable}


def free_gpus(state: ClusterState) -> int:
    inventory = state.inventory
    return int(inventory.node_gpu_count[: inventory.size].sum()) - int(inventory.gpu_whole.sum())


def assert_consistent(state: ClusterState, nodes: list[dict[str, Any]] = NODES) -> None:
    """The live inventory holds exactly the bound pods, the reservations and the groups' unclaimed
    placements: nothing twice (a fresh inventory takes them all) and nothing leaked."""
    fresh = Inventory()
    for obj in nodes:
        fresh.add_node(facts_from_node(obj))
    unclaimed = [p for hold in state.gangs.holds.values() for p in hold.unclaimed]
    for placement in [*state.placements().values(), *unclaimed]:
        fresh.commit(placement)
    live = state.inventory
    for array in ("node_cpu_free", "node_mem_free", "node_pods_free", "gpu_milli_free", "gpu_whole"):
        size = live.size * (16 if array.startswith("gpu") else 1)
        assert np.array_equal(getattr(live, array)[:size], getattr(fresh, array)[:size]), array


def test_a_group_waits_whole_until_every_member_exists() -> None:
    state = state_from(NODES, [member("w0"), member("w1")])
    chosen, reasons = filter_for(state, member("w0"))
    assert chosen is None
    assert set(reasons.values()) == {"group default/train waits for its members: 2 of 3 exist"}
    assert free_gpus(state) == 16 and not state.book.live() and not state.gangs.holds
    assert state.gangs.outcomes[PlanOutcome.WAITING] == 1


def test_the_first_member_plans_the_group_and_each_member_gets_its_planned_node() -> None:
    members = [member(f"w{i}") for i in range(3)]
    state = state_from(NODES, members)
    chosen, _ = filter_for(state, members[0])
    assert chosen is not None
    assert free_gpus(state) == 4  # all three held at once: one reserved, two planned
    hold = state.gangs.holds[next(iter(state.gangs.holds))]
    planned = sorted(p.node for p in hold.unclaimed)
    got = sorted(filter_for(state, obj)[0] for obj in members[1:])  # type: ignore[type-var]
    assert got == planned
    assert not state.gangs.holds and state.gangs.ended[HoldEnded.CLAIMED] == 1
    assert len(state.book.live()) == 3 and free_gpus(state) == 4
    assert state.decisions[Outcome.GROUP, ""] == 3
    assert_consistent(state)


def test_a_group_that_does_not_fit_holds_nothing_and_says_its_largest_fit() -> None:
    members = [member(f"w{i}", size=5) for i in range(5)]
    state = state_from(NODES, members)
    chosen, reasons = filter_for(state, members[2])
    assert chosen is None
    assert set(reasons.values()) == {"group default/train needs 5 × 4 GPUs in the cluster; largest fit: 4"}
    assert free_gpus(state) == 16 and not state.book.live()


def test_two_competing_groups_one_gets_all_the_other_waits_whole() -> None:
    first = [member(f"a{i}", group="first") for i in range(3)]
    second = [member(f"b{i}", group="second") for i in range(3)]
    state = state_from(NODES, [*first, *second])
    placed: dict[str, str | None] = {}
    for obj in [first[0], second[0], *first[1:], *second[1:]]:  # interleaved, as a queue would
        placed[obj["metadata"]["name"]] = filter_for(state, obj)[0]
    assert all(placed[f"a{i}"] for i in range(3))
    assert not any(placed[f"b{i}"] for i in range(3))
    _, reasons = filter_for(state, second[0])
    assert set(reasons.values()) == {"group default/second needs 3 × 4 GPUs in the cluster; largest fit: 1"}
    for i in range(3):  # the first job ends
        state.apply(PodDeleted(f"default/a{i}", f"uid-a{i}"))
    assert all(filter_for(state, obj)[0] for obj in second)
    assert_consistent(state)


def test_members_share_a_node_when_it_holds_them() -> None:
    members = [member(f"w{i}", size=4, gpus=2) for i in range(4)]
    state = state_from(NODES, members)
    nodes = {filter_for(state, obj)[0] for obj in members}
    assert len(nodes) == 1 and None not in nodes


def test_unclaimed_placements_are_released_after_the_hold_time() -> None:
    clock = FakeClock()
    members = [member(f"w{i}") for i in range(3)]
    state = state_from(NODES, members, clock=clock)
    filter_for(state, members[0])
    clock.advance(Settings().gangs.hold_seconds + 1)
    state.gangs.refresh()
    assert not state.gangs.holds and state.gangs.ended[HoldEnded.EXPIRED] == 1
    assert free_gpus(state) == 12  # the first member's reservation is still live (its own TTL is longer)
    assert_consistent(state)


def test_a_member_whose_bind_fails_releases_the_whole_group() -> None:
    members = [member(f"w{i}") for i in range(3)]
    state = state_from(NODES, members)
    first, _ = filter_for(state, members[0])
    filter_for(state, members[1])
    with pytest.raises(BindError):  # no writer: the Binding is refused
        state.bind("default", "w0", "uid-w0", first)  # type: ignore[arg-type]
    assert not state.book.live() and not state.gangs.holds
    assert state.gangs.ended[HoldEnded.BIND_FAILED] == 1 and state.book.ended[Ended.GROUP_RELEASED] == 1
    assert free_gpus(state) == 16
    assert_consistent(state)


def test_a_pod_bound_by_another_scheduler_wins_over_a_planned_placement() -> None:
    members = [member(f"w{i}", size=4) for i in range(4)]  # 16 GPUs: both nodes, whole
    state = state_from(NODES, members)
    filter_for(state, members[0])
    assert free_gpus(state) == 0
    intruder = pod("intruder", gpus=8, uid="uid-intruder", node_name="b", scheduler="default-scheduler")
    state.apply(PodUpserted(intruder))
    assert "default/intruder" in [p.key for p in state.bound_pods().values()]
    assert_consistent(state)
    hold = next(iter(state.gangs.holds.values()), None)
    assert hold is None or all(p.node == "a" for p in hold.unclaimed)  # what was planned on b is gone
    if hold is None:
        assert state.gangs.ended[HoldEnded.TAKEN] == 1


def test_a_podgroup_object_gives_the_size() -> None:
    labels = {"scheduling.x-k8s.io/pod-group": "train"}
    members = [pod(f"w{i}", gpus=4, uid=f"uid-w{i}") for i in range(2)]
    for obj in members:
        obj["metadata"]["labels"] = dict(labels)
    state = state_from(NODES, members)
    _, reasons = filter_for(state, members[0])
    assert set(reasons.values()) == {"group default/train has no scheduling.x-k8s.io PodGroup and no size"}
    group = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "train", "namespace": "default", "uid": "g1"},
        "spec": {"minMember": 2},
    }
    state.apply(GroupUpserted(group))
    assert all(filter_for(state, obj)[0] for obj in members)


def test_a_member_asking_for_other_resources_is_told() -> None:
    members = [member(f"w{i}") for i in range(3)]
    state = state_from(NODES, members)
    filter_for(state, members[0])
    odd = member("w1", gpus=2)
    _, reasons = filter_for(state, odd)
    assert set(reasons.values()) == {
        "group default/train was planned for members of 4 GPUs; this member asks for 2 GPUs"
    }


def test_a_replaced_member_is_placed_inside_the_groups_domain() -> None:
    members = [member(f"w{i}") for i in range(3)]
    state = state_from(NODES, members)
    for obj in members[:2]:
        filter_for(state, obj)
    state.apply(PodDeleted("default/w1", "uid-w1"))  # its reservation goes back
    replacement = member("w3")
    state.apply(PodUpserted(replacement))
    assert filter_for(state, members[2])[0] is not None  # the last planned placement
    assert filter_for(state, replacement)[0] is not None  # inside the domain, on its own
    assert_consistent(state)


def cliques() -> tuple[ClusterState, list[dict[str, Any]]]:
    """Node a in NVLink domain x; b and c in y, with 4 of b's GPUs taken."""
    nodes = [node(name) for name in ("a", "b", "c")]
    for obj, clique in zip(nodes, ("x", "y", "y"), strict=True):
        obj["metadata"]["labels"][CLIQUE_LABEL] = clique
    blocker = pod("blocker", gpus=4, uid="uid-blocker", node_name="b", scheduler="default-scheduler")
    return state_from(nodes, [blocker]), nodes


def place_group(state: ClusterState, size: int, gpus: int, **notes: str) -> tuple[set[str | None], dict]:
    members = [member(f"w{i}", size=size, gpus=gpus) for i in range(size)]
    for obj in members:
        obj["metadata"]["annotations"].update(notes)
        state.apply(PodUpserted(obj))
    answers = [filter_for(state, obj, ["a", "b", "c"]) for obj in members]
    return {chosen for chosen, _ in answers}, answers[0][1]


def test_a_group_stays_in_one_nvlink_domain_when_one_holds_it() -> None:
    state, nodes = cliques()
    got, _ = place_group(state, 2, 4)
    assert got <= {"a"} or got <= {"b", "c"}
    assert_consistent(state, nodes)


def test_a_group_no_nvlink_domain_holds_is_spread_unless_held_to_one() -> None:
    state, nodes = cliques()
    got, _ = place_group(state, 2, 6)  # x holds one member, y one (on c): only the cluster holds both
    assert got == {"a", "c"}
    assert_consistent(state, nodes)
    state, _ = cliques()
    got, reasons = place_group(state, 2, 6, **{"gpupack.io/group-topology": "nvlink"})
    assert got == {None}
    assert set(reasons.values()) == {"group default/train needs 2 × 6 GPUs in one NVLink domain; largest fit: 1"}


def test_an_unreadable_group_size_places_the_pod_alone() -> None:
    obj = member("w0", size=None)
    obj["metadata"]["annotations"]["gpupack.io/group-size"] = "many"
    state = state_from(NODES, [obj])
    assert filter_for(state, obj)[0] is not None and not state.gangs.holds


def test_preempt_leaves_out_every_node_for_a_group_member() -> None:
    state = state_from(NODES, [pod(f"p{i}", gpus=8, uid=f"uid-p{i}", node_name=n) for i, n in enumerate("ab")])
    assert state.plan_preemption(member("w0"), ["a", "b"]) == {}


def test_a_node_label_change_moves_the_node_between_domains() -> None:
    nodes = [node("a"), node("b")]
    state = state_from(nodes, [])
    relabelled = node("a")
    relabelled["metadata"]["labels"][CLIQUE_LABEL] = "x"
    state.apply(NodeUpserted(relabelled))
    row = state.inventory.index["a"]
    assert state.inventory.facts[row].labels[CLIQUE_LABEL] == "x"  # type: ignore[union-attr]


def test_explain_shows_why_a_waiting_group_has_no_plan() -> None:
    state = state_from(NODES, [member("w0"), member("w1")])
    report = explain(state, member("w0"))
    assert report["group"] == {
        "group": "default/train",
        "rule": "gpupack",
        "size": 3,
        "exist": 2,
        "bound": 0,
        "widest": "cluster",
        "plan": None,
        "reason": "group default/train waits for its members: 2 of 3 exist",
    }
    assert "  no plan: group default/train waits for its members: 2 of 3 exist" in render_text(report)


def test_explain_shows_the_plan_a_complete_group_would_get_and_the_one_it_holds() -> None:
    members = [member(f"w{i}") for i in range(3)]
    state = state_from(NODES, members)
    would = explain(state, members[0])["group"]
    assert would["plan"]["domain"] == "the cluster" and len(would["plan"]["members"]) == 3
    assert not state.gangs.holds and not state.book.live()  # explaining holds nothing
    filter_for(state, members[0])
    held = explain(state, members[1])
    assert [m["pod"] for m in held["group"]["plan"]["members"]] == ["default/w0", None, None]
    assert "(unclaimed)" in render_text(held)


def test_explain_of_a_group_that_does_not_fit_names_the_largest_fit() -> None:
    members = [member(f"w{i}", size=5) for i in range(5)]
    state = state_from(NODES, members)
    section = explain(state, members[0])["group"]
    assert section["reason"] == "group default/train needs 5 × 4 GPUs in the cluster; largest fit: 4"
    assert explain(state, pod("solo", gpus=1, uid="uid-solo"))["group"] is None


def test_members_shown_by_filter_count_before_the_watch_shows_them() -> None:
    """kube-scheduler does not retry a turned-down pod when another pending pod is created: the member filtered
    last must see the ones filtered before it even when the watch has shown none of them."""
    clock = FakeClock()
    members = [member(f"w{i}") for i in range(3)]
    state = state_from(NODES, [], clock=clock)
    _, first = filter_for(state, members[0])
    _, second = filter_for(state, members[1])
    assert set(first.values()) == {"group default/train waits for its members: 1 of 3 exist"}
    assert set(second.values()) == {"group default/train waits for its members: 2 of 3 exist"}
    assert filter_for(state, members[2])[0] is not None


def test_a_member_shown_by_filter_that_the_watch_never_shows_is_dropped() -> None:
    clock = FakeClock()
    members = [member(f"w{i}") for i in range(3)]
    state = state_from(NODES, [], clock=clock)
    filter_for(state, members[0])
    state.apply(PodUpserted(members[1]))  # the watch shows w1; w0 was deleted before it showed w0
    clock.advance(NOTED_SECONDS + 1)
    _, reasons = filter_for(state, members[2])
    assert set(reasons.values()) == {"group default/train waits for its members: 2 of 3 exist"}
