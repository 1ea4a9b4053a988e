"""ClusterState: accounting of bound pods, forged assignments, reservations and restarts."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import orjson
import pytest
from kubernetes.client.exceptions import ApiException

from gpupack.extender.binder import BindError
from gpupack.extender.decisions import NOT_CHOSEN, UNKNOWN_NODE, UNSCHEDULABLE_NODE, normalise
from gpupack.extender.reservations import Ended
from gpupack.extender.settings import Settings
from gpupack.extender.state import ClusterState
from gpupack.extender.warm_up import warm_up
from gpupack.kube.sources import (
    JsonObject,
    NodeDeleted,
    NodeUpserted,
    PodDeleted,
    PodUpserted,
    Synced,
    load_cluster_objects,
)
from gpupack.scoring.facts import GpuSlot, Placement
from gpupack.scoring.names import NameArray
from tests.extender_helpers import (
    A100,
    EXAMPLE_CLUSTER,
    H100,
    L4,
    FakeClock,
    assert_no_overlap,
    file_state,
    mixed_kinds_pod,
    node,
    pod,
    state_from,
    write_cluster,
)

EXAMPLE = load_cluster_objects(EXAMPLE_CLUSTER)


def example_state(extra_pods: Sequence[dict] = (), **kw) -> ClusterState:
    return state_from(EXAMPLE.nodes, [*EXAMPLE.pods, *extra_pods], **kw)


def by_key(state: ClusterState) -> dict[str, Placement | None]:
    return {record.key: record.placement for record in state.bound_pods().values()}


def placed(placement: Placement | None) -> Placement:
    """The placement a pod holds; the test fails if it holds nothing."""
    assert placement is not None
    return placement


def test_example_cluster_commits_assignments_and_accounts_the_foreign_gpu_pod() -> None:
    state = example_state()
    held = by_key(state)
    for obj in EXAMPLE.pods:
        if "nodeName" not in obj["spec"]:
            continue  # pending (the README's train-0): holds nothing until it is bound
        key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        text = obj["metadata"].get("annotations", {}).get("gpupack.io/assignment")
        assert held[key] is not None, key
        if text:
            assert placed(held[key]).to_assignment() == json.loads(text)
    (foreign,) = [r for r in state.bound_pods().values() if r.claimed is None]
    assert foreign.how == "first-fit" and foreign.node == "l4-spot-0"
    assert placed(foreign.placement).slots == (GpuSlot(0),)
    assert state.unplaced() == []
    snap = state.snapshot()
    assert snap.gpus_allocated == pytest.approx(4 + 2 + 1 + 0.25 + 3 / 7 + 1 / 7)
    assert_no_overlap(EXAMPLE.nodes, state.placements().values())
    # l4-spot-0 has four GPUs and the foreign pod holds one of them
    chosen, failed, _ = state.decide_for_filter(pod("four", gpus=4), ["l4-spot-0"])
    assert chosen is None and failed == {"l4-spot-0": "not enough free GPU capacity"}
    assert state.decide_for_filter(pod("three", gpus=3), ["l4-spot-0"])[0] == "l4-spot-0"


def test_list_order_does_not_matter_before_sync() -> None:
    """A foreign pod listed first must not take the GPU an assigned pod listed later claims."""
    nodes = [node("l4", L4, 1)]
    foreign = pod("foreign", gpus=1, node_name="l4", scheduler="default-scheduler")
    claimed = pod("claimed", gpus=1, node_name="l4", assignment={"node": "l4", "gpus": [{"index": 0}]})
    state = state_from(nodes, [foreign, claimed])
    held = by_key(state)
    assert placed(held["default/claimed"]).slots == (GpuSlot(0),)
    assert held["default/foreign"] is None  # waits for capacity; never double-booked
    assert state.unplaced() == ["default/foreign"]
    state.apply(PodDeleted("default/claimed", "uid-default-claimed"))
    assert placed(by_key(state)["default/foreign"]).slots == (GpuSlot(0),)
    assert state.unplaced() == []


def test_assignment_naming_another_node_is_placed_first_fit_on_the_bound_node() -> None:
    forged = pod("forged", gpus=1, node_name="l4-od-0", assignment={"node": "l4-spot-1", "gpus": [{"index": 0}]})
    state = example_state([forged])
    record = state.bound_pods()["uid-default-forged"]
    assert record.claimed is None and record.how == "first-fit"
    assert placed(record.placement).node == "l4-od-0"
    # l4-spot-1 stays free: the forged claim took nothing there
    chosen, _, _ = state.decide_for_filter(pod("probe", gpus=1), ["l4-spot-1"])
    assert chosen == "l4-spot-1"
    assert_no_overlap(EXAMPLE.nodes, state.placements().values())


def test_assignment_claiming_a_gpu_in_use_never_double_books_or_frees() -> None:
    before = example_state().snapshot().gpus_allocated
    # llama-pretrain-3-worker-0 holds GPUs 4-7 of h100-spot-0
    forged = pod("forged", gpus=1, node_name="h100-spot-0", assignment={"node": "h100-spot-0", "gpus": [{"index": 5}]})
    state = example_state([forged])
    record = state.bound_pods()["uid-default-forged"]
    assert record.how == "first-fit" and placed(record.placement).slots[0].index not in (4, 5, 6, 7)
    llama = next(r for r in state.bound_pods().values() if r.key.endswith("llama-pretrain-3-worker-0"))
    assert [s.index for s in placed(llama.placement).slots] == [4, 5, 6, 7]
    assert state.snapshot().gpus_allocated == pytest.approx(before + 1)
    assert_no_overlap(EXAMPLE.nodes, state.placements().values())
    # deleting the forger gives back exactly its one GPU
    state.apply(PodDeleted("default/forged", "uid-default-forged"))
    assert state.snapshot().gpus_allocated == pytest.approx(before)


def test_forged_claim_on_a_full_node_holds_nothing_until_capacity_frees() -> None:
    nodes = [node("l4", L4, 1)]
    owner = pod("owner", gpus=1, node_name="l4", assignment={"node": "l4", "gpus": [{"index": 0}]})
    forged = pod("forged", gpus=1, node_name="l4", assignment={"node": "l4", "gpus": [{"index": 0}]})
    state = state_from(nodes, [owner, forged])
    assert by_key(state) == {"default/owner": owner_placement(state), "default/forged": None}
    assert state.snapshot().gpus_allocated == 1
    # an annotation change on the holder does not free or move anything
    changed = copy.deepcopy(owner)
    changed["metadata"]["annotations"]["gpupack.io/assignment"] = "garbage"
    state.apply(PodUpserted(changed))
    assert state.snapshot().gpus_allocated == 1
    state.apply(PodDeleted("default/owner", "uid-default-owner"))
    assert placed(by_key(state)["default/forged"]).slots == (GpuSlot(0),)


def owner_placement(state: ClusterState):
    return state.bound_pods()["uid-default-owner"].placement


def test_cpu_only_pods_take_cpu_memory_and_a_pod_slot() -> None:
    nodes = [node("l4", L4, 1, cpu="4", memory="8Gi")]
    state = state_from(nodes, [pod("web", cpu="3", memory="1Gi", node_name="l4")])
    row = state.inventory.index["l4"]
    assert state.inventory.node_cpu_free[row] == 1000
    assert state.inventory.node_pods_free[row] == 109
    chosen, failed, _ = state.decide_for_filter(pod("gpu", gpus=1, cpu="2"), ["l4"])
    assert chosen is None and failed == {"l4": "not enough free CPU"}


def test_filter_reserves_at_once_and_returns_the_same_reservation_on_retry() -> None:
    state = state_from([node("a", L4, 1), node("b", L4, 1)])
    first = pod("p1", gpus=1)
    chosen, failed, unresolvable = state.decide_for_filter(first, ["a", "b", "ghost"])
    other = "b" if chosen == "a" else "a"
    assert failed == {}  # by default only the infeasible candidates are named
    assert unresolvable == {"ghost": UNKNOWN_NODE}
    assert state.decide_for_filter(first, ["a", "b"])[0] == chosen  # kube-scheduler retry
    chosen2, _, _ = state.decide_for_filter(pod("p2", gpus=1), ["a", "b"])
    assert chosen2 == other  # the reservation is seen by the next filter
    assert state.decide_for_filter(pod("p3", gpus=1), ["a", "b"])[0] is None
    assert state.snapshot().reservations == {"assumed": 2, "binding": 0}


def test_reservation_ttl_expiry_releases() -> None:
    clock = FakeClock()
    state = state_from([node("a", L4, 1)], settings=Settings(reservation_ttl_seconds=5), clock=clock)
    assert state.decide_for_filter(pod("p1", gpus=1), ["a"])[0] == "a"
    assert state.decide_for_filter(pod("p2", gpus=1), ["a"])[0] is None
    clock.advance(5.1)
    assert state.decide_for_filter(pod("p2", gpus=1), ["a"])[0] == "a"
    assert state.book.ended[Ended.EXPIRED] == 1
    assert state.snapshot().gpus_allocated == 1


def test_expired_reservation_is_re_decided_at_bind_when_it_still_fits(tmp_path: Path) -> None:
    clock = FakeClock()
    path = write_cluster(tmp_path / "c.yaml", [node("a", L4, 2), pod("p1", gpus=1)])
    state, source = file_state(path, Settings(reservation_ttl_seconds=5), clock=clock)
    assert state.decide_for_filter(source.pods[0], ["a"])[0] == "a"
    clock.advance(10)
    state.bind("default", "p1", "uid-default-p1", "a")
    assert state.snapshot().gpus_allocated == 1
    assert state.bound_pods()["uid-default-p1"].how == "reservation"


def test_confirm_does_not_double_count(tmp_path: Path) -> None:
    path = write_cluster(tmp_path / "c.yaml", [node("a", L4, 4), pod("p1", gpus=2)])
    state, source = file_state(path)
    assert state.decide_for_filter(source.pods[0], ["a"])[0] == "a"
    assert state.snapshot().gpus_allocated == 2
    state.bind("default", "p1", "uid-default-p1", "a")
    assert state.snapshot().gpus_allocated == 2
    assert state.snapshot().reservations == {"assumed": 0, "binding": 0}
    assert state.book.ended == {"confirmed": 1}
    bound = source.pods[0]
    assert bound["spec"]["nodeName"] == "a"
    assert json.loads(bound["metadata"]["annotations"]["gpupack.io/assignment"])["node"] == "a"


def test_pod_deleted_between_filter_and_bind_releases(tmp_path: Path) -> None:
    path = write_cluster(tmp_path / "c.yaml", [node("a", L4, 1), pod("p1", gpus=1)])
    state, source = file_state(path)
    assert state.decide_for_filter(source.pods[0], ["a"])[0] == "a"
    state.apply(PodDeleted("default/p1", "uid-default-p1"))
    assert state.snapshot().gpus_allocated == 0
    with pytest.raises(BindError) as err:
        state.bind("default", "p1", "uid-default-p1", "a")
    assert err.value.kind == "no-reservation"


def test_node_deleted_while_reserved(tmp_path: Path) -> None:
    path = write_cluster(tmp_path / "c.yaml", [node("a", L4, 1), node("b", L4, 1), pod("p1", gpus=1)])
    state, source = file_state(path)
    chosen = state.decide_for_filter(source.pods[0], ["a", "b"])[0]
    assert chosen is not None
    state.apply(NodeDeleted(chosen))
    assert state.book.ended[Ended.NODE_GONE] == 1
    with pytest.raises(BindError) as err:
        state.bind("default", "p1", "uid-default-p1", chosen)
    assert err.value.kind == "node-unknown"
    other = "b" if chosen == "a" else "a"
    state.bind("default", "p1", "uid-default-p1", other)  # node changed: re-decided there
    assert source.pods[0]["spec"]["nodeName"] == other


def test_bind_failure_removes_the_annotation_and_releases(tmp_path: Path) -> None:
    path = write_cluster(tmp_path / "c.yaml", [node("a", L4, 1), pod("p1", gpus=1)])
    state, source = file_state(path)
    assert state.decide_for_filter(source.pods[0], ["a"])[0] == "a"
    with pytest.raises(BindError) as err:
        state.bind("default", "p1", "wrong-uid", "a")  # the API server refuses: uid precondition
    assert err.value.kind in ("binding", "no-reservation")
    # the reservation is keyed by uid; bind with the right uid works and a wrong one left no trace
    state.bind("default", "p1", "uid-default-p1", "a")
    assert state.snapshot().gpus_allocated == 1


def test_binding_error_releases_the_reservation_and_writes_nothing(tmp_path: Path) -> None:
    path = write_cluster(tmp_path / "c.yaml", [node("a", L4, 1), pod("p1", gpus=1)])
    state, source = file_state(path)
    calls: list[tuple] = []
    events: list[JsonObject] = []

    class Refusing:
        def create_binding(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]):
            calls.append((name, node, annotations))
            raise ApiException(status=403, reason="Forbidden")  # a definite refusal: nothing was written

        def create_event(self, namespace: str, event: JsonObject) -> None:
            events.append(event)

        def patch_event(self, namespace: str, name: str, patch: JsonObject) -> None:
            events.append(patch)

    state.writer = Refusing()
    assert state.decide_for_filter(source.pods[0], ["a"])[0] == "a"
    with pytest.raises(BindError) as err:
        state.bind("default", "p1", "uid-default-p1", "a")
    assert err.value.kind == "binding"
    assert [(name, node) for name, node, _ in calls] == [("p1", "a")]  # one write, nothing to undo
    assert "gpupack.io/assignment" in calls[0][2]
    assert "gpupack.io/assignment" not in (source.pods[0]["metadata"].get("annotations") or {})
    assert state.snapshot().gpus_allocated == 0
    assert state.book.ended[Ended.BIND_FAILED] == 1
    assert state.events.flush(5) and events == []  # no Assigned event for a bind that failed


def test_restart_rebuilds_the_same_state(tmp_path: Path) -> None:
    nodes = [node("h", mig="dynamic"), node("l", L4, 4)]
    pending = [
        pod("w2", gpus=2),
        pod("m3", mig="3g.40gb"),
        pod("m1", mig="1g.10gb", mig_count=2),
        pod("s", milli=300),
        pod("s2", milli=500),
    ]
    path = write_cluster(tmp_path / "c.yaml", [*nodes, *pending])
    state, source = file_state(path)
    for obj in source.pods:
        chosen, _, _ = state.decide_for_filter(obj, ["h", "l"])
        assert chosen
        state.bind(obj["metadata"]["namespace"], obj["metadata"]["name"], obj["metadata"]["uid"], chosen)
    before = state.placements()
    assert len(before) == len(pending)
    restarted = state_from(source.nodes, source.pods)
    assert restarted.placements() == before
    assert all(r.how == "assignment" for r in restarted.bound_pods().values())
    assert restarted.snapshot().gpus_allocated == pytest.approx(state.snapshot().gpus_allocated)


def test_node_with_unreadable_facts_is_unresolvable_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    bad = node("bad", L4, 1, annotations={"gpupack.io/hourly-cost": "cheap"})
    with caplog.at_level(logging.WARNING, logger="gpupack.extender.pod_ledger"):
        state = state_from([bad, node("good", L4, 1)])
        state.apply(NodeUpserted(bad))
        state.apply(NodeUpserted(bad))
    assert sum("not usable" in r.getMessage() for r in caplog.records) == 1
    for i in range(2):
        _, _, unresolvable = state.decide_for_filter(pod(f"p{i}", gpus=1), ["bad", "good"])
        assert "hourly-cost" in unresolvable["bad"]
    fixed = node("bad", L4, 1)
    state.apply(NodeUpserted(fixed))
    assert state.bad_nodes() == {}


def test_node_shape_change_re_commits_pods_on_it() -> None:
    l4 = node("l", L4, 4)
    pods = [
        pod("a", gpus=1, node_name="l", assignment={"node": "l", "gpus": [{"index": 0}]}),
        pod("b", gpus=1, node_name="l", assignment={"node": "l", "gpus": [{"index": 3}]}),
    ]
    state = state_from([l4], pods)
    assert state.decide_for_filter(pod("r", gpus=1), ["l"])[0] == "l"  # reserved on GPU 1
    smaller = node("l", L4, 2)
    state.apply(NodeUpserted(smaller))
    held = by_key(state)
    assert placed(held["default/a"]).slots == (GpuSlot(0),)
    assert held["default/b"] is None  # GPU 3 is gone and GPU 1 is reserved: nothing to take
    assert state.book.get("uid-default-r") is not None
    assert state.snapshot().gpus_allocated == 2
    state.apply(NodeUpserted(l4))  # back to 4 GPUs: b's claim fits again
    assert placed(by_key(state)["default/b"]).slots == (GpuSlot(3),)
    # an unchanged node (heartbeat) changes nothing
    state.apply(NodeUpserted(copy.deepcopy(l4)))
    assert placed(by_key(state)["default/b"]).slots == (GpuSlot(3),)


def test_mixed_request_is_unresolvable_everywhere() -> None:
    state = state_from([node("a", L4, 1)])
    mixed = pod("mixed", gpus=1, milli=200)
    chosen, failed, unresolvable = state.decide_for_filter(mixed, ["a", "x"])
    assert chosen is None and not failed
    assert set(unresolvable) == {"a", "x"} and "mixes" in unresolvable["a"]


def test_prioritize_scores() -> None:
    assert normalise([1.0, None, 3.0, 2.0]) == [0, 0, 10, 5]
    assert normalise([2.0, 2.0]) == [10, 10]
    assert normalise([None]) == [0]
    state = state_from([node("a", L4, 2), node("b", L4, 2), node("c", L4, 1, cpu="1")])
    scores = dict(state.scores_for_prioritize(pod("p", gpus=1, cpu="2"), ["a", "b", "c", "zz"]))
    assert set(scores) == {"a", "b", "c", "zz"}
    assert scores["c"] == scores["zz"] == 0 and max(scores.values()) == 10


def test_synced_and_ready() -> None:
    state = ClusterState(Settings())
    assert not state.ready
    state.apply(Synced())
    assert not state.ready
    warm_up(state)
    assert state.ready


def as_sent(names: list[str], form: str) -> list[str] | NameArray:
    """The candidates as a list of names, or as kube-scheduler's bytes (what the HTTP layer passes)."""
    if form == "names":
        return names
    array = NameArray.read(orjson.dumps(names))
    assert array is not None
    return array


FORMS = pytest.mark.parametrize("form", ["names", "bytes"])


@FORMS
def test_failed_nodes_name_the_infeasible_or_with_report_not_chosen_the_rest(form: str) -> None:
    nodes = [node("a", L4, 1), node("b", L4, 1), node("small", L4, 1, cpu="1")]
    request = pod("p", gpus=1, cpu="2")
    candidates = as_sent(["a", "b", "small", "b"], form)
    full = state_from(nodes, settings=Settings(report_not_chosen=True))
    chosen, failed, _ = full.decide_for_filter(request, candidates)
    other = "b" if chosen == "a" else "a"
    assert dict(failed) == {"small": "not enough free CPU", other: NOT_CHOSEN}
    lean = state_from(nodes)  # the default
    _, failed, _ = lean.decide_for_filter(request, candidates)
    assert dict(failed) == {"small": "not enough free CPU"}
    retry_chosen, failed, _ = lean.decide_for_filter(request, candidates)  # the reservation, reused
    assert retry_chosen is not None and dict(failed) == {}


@FORMS
def test_the_same_candidates_see_every_node_change(form: str) -> None:
    """kube-scheduler sends the same candidate list call after call; each change to the nodes behind
    it (deleted, added, cordoned, uncordoned) must show in the next answer all the same."""
    nodes = [node("a", L4, 1), node("b", L4, 1), node("c", L4, 1)]
    state = state_from(nodes, settings=Settings(report_not_chosen=True))
    candidates = as_sent(["a", "b", "c", "d"], form)
    first, failed, unresolvable = state.decide_for_filter(pod("p1", gpus=1), candidates)
    assert first is not None and unresolvable == {"d": UNKNOWN_NODE}
    assert failed == dict.fromkeys({"a", "b", "c"} - {first}, NOT_CHOSEN)

    state.apply(NodeDeleted(first))
    state.apply(NodeUpserted(node("d", L4, 1)))  # takes the deleted node's inventory row
    second, _, unresolvable = state.decide_for_filter(pod("p2", gpus=1), candidates)
    assert unresolvable == {first: UNKNOWN_NODE}
    assert second in {"a", "b", "c", "d"} - {first}

    left = sorted({"a", "b", "c", "d"} - {first, second})
    cordoned = left[0]
    state.apply(NodeUpserted({**node(cordoned, L4, 1), "spec": {"unschedulable": True}}))
    third, _, unresolvable = state.decide_for_filter(pod("p3", gpus=1), candidates)
    assert unresolvable == {first: UNKNOWN_NODE, cordoned: UNSCHEDULABLE_NODE}
    assert third == left[1]

    state.apply(NodeUpserted(node(cordoned, L4, 1)))  # uncordoned
    fourth, _, unresolvable = state.decide_for_filter(pod("p4", gpus=1), candidates)
    assert unresolvable == {first: UNKNOWN_NODE}
    assert fourth == cordoned


def unreadable_bound_pods() -> dict[str, dict]:
    """Bound pods whose requests gpupack refuses to schedule, each on a node of its own."""
    milli = pod("milli", milli=500, node_name="n-milli", scheduler="default-scheduler", cpu="4")
    milli["spec"]["containers"][0]["resources"]["limits"]["gpupack.io/gpu-milli"] = "1000"
    garbage_cpu = pod("cpu", node_name="n-cpu", scheduler="default-scheduler")
    garbage_cpu["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "2000000"  # over gpupack's range
    return {"n-mixed": mixed_kinds_pod("mixed", "n-mixed"), "n-milli": milli, "n-cpu": garbage_cpu}


@pytest.mark.parametrize("node_name", ["n-mixed", "n-milli", "n-cpu"])
def test_bound_pod_with_an_unreadable_request_is_charged_all_it_can_be_using(
    node_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    obj = unreadable_bound_pods()[node_name]
    nodes = [node(node_name, L4, 4, cpu="16", memory="128Gi")]
    with caplog.at_level(logging.WARNING):
        state = state_from(nodes, [obj])
    key = f"default/{obj['metadata']['name']}"
    (record,) = state.bound_pods().values()
    assert record.how == "unreadable" and record.placement is not None
    row = state.inventory.index[node_name]
    assert state.inventory.node_pods_free[row] == 109
    if node_name == "n-cpu":  # no GPU asked, CPU out of range: all the CPU there is, none of the GPUs
        assert state.inventory.node_cpu_free[row] == 0 and state.snapshot().gpus_allocated == 0
    else:
        cpu_used = state.inventory.node_cpu_cap[row] - state.inventory.node_cpu_free[row]
        assert cpu_used == (8000 if node_name == "n-mixed" else 4000)
        assert state.snapshot().gpus_allocated == 4  # which devices it got is unknown: all of them
        chosen, failed, _ = state.decide_for_filter(pod("next", milli=100), [node_name])
        assert chosen is None and failed == {node_name: "not enough free GPU capacity"}
    assert state.snapshot().unreadable_pods == 1
    assert sum(key in r.getMessage() and "unreadable" in r.getMessage() for r in caplog.records) == 1
    state.apply(PodDeleted(key, obj["metadata"]["uid"]))  # gone: exactly its charge comes back
    assert state.inventory.node_is_empty(row) and state.snapshot().unreadable_pods == 0


def test_unreadable_pod_listed_first_never_takes_what_a_later_pod_claims() -> None:
    nodes = [node("a", L4, 4)]
    claimed = pod("claimed", gpus=1, node_name="a", assignment={"node": "a", "gpus": [{"index": 2}]})
    state = state_from(nodes, [mixed_kinds_pod("mixed", "a"), claimed])
    held = by_key(state)
    assert placed(held["default/claimed"]).slots == (GpuSlot(2),)
    assert {slot.index for slot in placed(held["default/mixed"]).slots} == {0, 1, 3}
    assert_no_overlap(nodes, state.placements().values())


def test_unreadable_pod_on_mig_nodes_takes_every_free_instance() -> None:
    nodes = [node("dyn", mig="dynamic", gpus=2), node("static", A100, 2, static_mig={"3g.40gb": 4})]
    used = [
        pod(f"on-{name}", mig="3g.40gb", node_name=name, assignment={"node": name, "gpus": [slot]})
        for name, slot in (
            ("dyn", {"index": 0, "mig": "3g.40gb", "start": 4}),
            ("static", {"index": 1, "mig": "3g.40gb", "start": 0}),
        )
    ]
    state = state_from(nodes, [*used, mixed_kinds_pod("m1", "dyn"), mixed_kinds_pod("m2", "static")])
    for name in ("dyn", "static"):
        for request in (pod("x", mig="1g.10gb"), pod("y", milli=10), pod("z", gpus=1)):
            assert state.decide_for_filter(request, [name])[0] is None, (name, request["spec"])
    assert_no_overlap(nodes, state.placements().values())
    for obj in used:  # the pods gpupack knows give back exactly their own instance
        state.apply(PodDeleted(pod_key_of(obj), obj["metadata"]["uid"]))
    assert state.decide_for_filter(pod("w", mig="3g.40gb"), ["dyn", "static"])[0] is not None


def pod_key_of(obj: dict) -> str:
    return f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"


def product_node(name: str, product: str) -> dict:
    """A one-GPU node of some GPU product of its own."""
    return node(name, product, 1, cpu="8", memory="64Gi")


def test_gpu_model_ids_are_freed_with_their_last_node() -> None:
    """More than 63 products over time, never more than 63 at once: every node stays usable (#13)."""
    state = state_from([product_node(f"old-{i}", f"ACME-Old-{i}") for i in range(63)])
    state.apply(NodeUpserted(product_node("one-too-many", "ACME-New-X")))
    assert state.bad_nodes() == {"one-too-many": "node one-too-many: more than 63 GPU products in one cluster"}
    for i in range(63):
        state.apply(NodeDeleted(f"old-{i}"))
    for i in range(62):
        state.apply(NodeUpserted(product_node(f"new-{i}", f"ACME-New-{i}")))
    state.apply(NodeUpserted(product_node("one-too-many", "ACME-New-X")))  # relisted: the 63rd id is free
    assert state.bad_nodes() == {}
    assert state.decide_for_filter(pod("p", gpus=1), ["one-too-many"])[0] == "one-too-many"


def test_a_reused_model_id_carries_nothing_of_the_model_that_had_it() -> None:
    state = state_from([node("h100"), node("other", L4, 8)])
    pinned = pod("pinned", gpus=1)
    pinned["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": H100}
    assert state.decide_for_filter(pinned, ["h100", "other"])[0] == "h100"  # the engine caches its layout
    state.apply(NodeDeleted("h100"))
    state.apply(NodeUpserted(node("l40s", "NVIDIA-L40S", 8)))  # takes the H100's model id
    state.apply(PodDeleted("default/pinned", "uid-default-pinned"))
    chosen, failed, _ = state.decide_for_filter(pinned, ["l40s", "other"])
    assert chosen is None and set(failed) == {"l40s", "other"}


def test_a_bound_pod_scores_nothing_anywhere() -> None:
    """As filter calls it unresolvable everywhere, prioritize gives it 0 on every node (#13)."""
    bound = pod("b", gpus=1, node_name="a", assignment={"node": "a", "gpus": [{"index": 0}]})
    state = state_from([node("a", L4, 4), node("b", L4, 2)], [bound])
    assert state.decide_for_filter(bound, ["a", "b"])[0] is None
    assert state.scores_for_prioritize(bound, ["a", "b"]) == [("a", 0), ("b", 0)]
