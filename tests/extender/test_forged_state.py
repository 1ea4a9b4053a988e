"""Forged state: `gpupack.io/assignment` annotations gpupack did not write never hand out capacity twice
and never free capacity in use (the rule: extender/state.py docstring, docs/forged-state.md).

Already proven in tests/extender/test_state.py and referenced from docs/forged-state.md:
test_assignment_naming_another_node_is_placed_first_fit_on_the_bound_node,
test_assignment_claiming_a_gpu_in_use_never_double_books_or_frees,
test_forged_claim_on_a_full_node_holds_nothing_until_capacity_frees,
test_list_order_does_not_matter_before_sync.
"""

from __future__ import annotations

import copy
import json

import pytest

from gpupack.extender.binder import BindError
from gpupack.extender.state import ClusterState
from gpupack.kube.sources import PodUpserted
from gpupack.scoring.facts import GpuSlot, Placement
from tests.extender_helpers import L4, assert_matches_rebuild, assert_no_overlap, node, pod, state_from
from tests.fake_apiserver import Extender, FakeApiServer, launch

ASSIGNMENT = "gpupack.io/assignment"
GPU0 = {"node": "a", "gpus": [{"index": 0}]}
GPU1 = {"node": "a", "gpus": [{"index": 1}]}


def held(state: ClusterState) -> dict[str, tuple[str, tuple[GpuSlot, ...]] | None]:
    """pod name -> (node, slots) it holds (None: nothing), bound pods and reservations alike."""
    out: dict[str, tuple[str, tuple[GpuSlot, ...]] | None] = {}
    for record in state.bound_pods().values():
        out[record.key.split("/")[1]] = (record.placement.node, record.placement.slots) if record.placement else None
    for reservation in state.book.live():
        out[reservation.key.split("/")[1]] = (reservation.node, reservation.placement.slots)
    return out


def reserved_for(extender: Extender, ident: str) -> Placement:
    """The placement held for a pod in flight; the test fails if it holds none."""
    reservation = extender.state.book.get(ident)
    assert reservation is not None
    return reservation.placement


def written(server: FakeApiServer, key: str) -> dict:
    return json.loads(server.pod(key)["metadata"]["annotations"][ASSIGNMENT])


# --- pod created with an assignment -------------------------------------------------------------------


def test_pending_pod_created_with_an_assignment_holds_nothing_and_is_placed_by_gpupack(
    extenders: list[Extender],
) -> None:
    owner = pod("owner", gpus=1, node_name="a", assignment=GPU0)
    forger = pod("forger", gpus=1, assignment=GPU0)  # claims the GPU owner uses
    server = FakeApiServer([node("a", L4, 2)], [owner, forger])
    extender = launch(extenders, server)
    assert held(extender.state) == {"owner": ("a", (GpuSlot(0),))}  # a pending pod holds nothing
    assert extender.filter("default/forger", ["a"]) == "a"
    extender.bind("default/forger", "a")
    assert written(server, "default/forger") == GPU1  # gpupack's own decision overwrote the claim
    extender.assert_matches_rebuild()


def test_the_annotation_of_a_pending_pod_does_not_steer_the_decision() -> None:
    nodes = [node("a", L4, 2), node("b", L4, 2)]
    plain = state_from(nodes).decide_for_filter(pod("p", gpus=1), ["a", "b"])
    forged = pod("p", gpus=1, assignment={"node": "b", "gpus": [{"index": 1}]})
    assert state_from(nodes).decide_for_filter(forged, ["a", "b"]) == plain


@pytest.mark.parametrize(
    "claim",
    [
        "not json",
        json.dumps({"node": "a", "gpus": [{"index": 0}, {"index": 0}]}),  # the same GPU twice
        json.dumps({"node": "a", "gpus": [{"index": 99}]}),  # no such GPU
        json.dumps({"node": "a", "gpus": [{"index": 0, "milli": 500}]}),  # a share, but it asks for a GPU
        json.dumps({"node": "a", "gpus": [{"index": 0, "mig": "1g.10gb", "start": 0}]}),  # MIG on an L4
        json.dumps({"node": "a", "gpus": [{"index": 1}], "extra": True}),
        json.dumps([GPU0]),
    ],
)
def test_malformed_or_impossible_claims_on_a_bound_pod_fall_back_to_first_fit(claim: str) -> None:
    owner = pod("owner", gpus=1, node_name="a", assignment=GPU0)
    bound = pod("bound", gpus=1, node_name="a", assignment=claim)
    state = state_from([node("a", L4, 2)], [owner, bound])
    assert held(state) == {"owner": ("a", (GpuSlot(0),)), "bound": ("a", (GpuSlot(1),))}
    assert_matches_rebuild(state, [node("a", L4, 2)], [owner, bound])


# --- set by a user on an unbound pod ------------------------------------------------------------------


def test_annotation_set_on_a_reserved_pod_before_bind_is_overwritten(extenders: list[Extender]) -> None:
    owner = pod("owner", gpus=1, node_name="a", assignment=GPU0)
    server = FakeApiServer([node("a", L4, 3)], [owner, pod("p", gpus=1)])
    extender = launch(extenders, server)
    assert extender.filter("default/p", ["a"]) == "a"
    reserved = reserved_for(extender, "uid-default-p").to_assignment()
    server.patch_pod_annotations("default", "p", {ASSIGNMENT: json.dumps(GPU0)})  # the user claims GPU 0
    extender.caught_up()
    extender.bind("default/p", "a")
    assert written(server, "default/p") == reserved != GPU0
    extender.assert_matches_rebuild()


def test_annotation_forged_just_before_the_binding_is_overwritten_by_it(extenders: list[Extender]) -> None:
    """The user claims a GPU in use just before the Binding: the Binding writes gpupack's assignment
    over it in the same update that binds the pod, so the pod holds what gpupack reserved."""
    owner = pod("owner", gpus=1, node_name="a", assignment=GPU0)
    server = FakeApiServer([node("a", L4, 3)], [owner, pod("p", gpus=1)])
    extender = launch(extenders, server)
    assert extender.filter("default/p", ["a"]) == "a"

    def forge(namespace: str, name: str) -> None:
        obj = server.pods[f"{namespace}/{name}"]
        obj["metadata"]["annotations"][ASSIGNMENT] = json.dumps(GPU0)
        server.put_pod(obj)

    reserved = reserved_for(extender, "uid-default-p").to_assignment()
    server.fail_binding = forge  # runs inside create_binding, before the pod is bound
    extender.bind("default/p", "a")
    extender.caught_up()
    assert written(server, "default/p") == reserved != GPU0
    mine = held(extender.state)
    assert mine["owner"] == ("a", (GpuSlot(0),))  # the capacity in use stays with its owner
    assert mine["p"] is not None and mine["p"][1] != (GpuSlot(0),)
    assert extender.state.bound_pods()["uid-default-p"].how == "reservation"
    extender.assert_matches_rebuild()


def test_bind_whose_name_and_uid_disagree_touches_neither_pod(extenders: list[Extender]) -> None:
    """A bind naming pod `owner` with pod p's uid: refused before any write, so owner keeps its
    assignment (a restart re-derives it as before) and p's reservation stays for p's own bind."""
    owner = pod("owner", gpus=1, node_name="a", assignment=GPU0)
    server = FakeApiServer([node("a", L4, 2)], [owner, pod("p", gpus=1)])
    extender = launch(extenders, server)
    assert extender.filter("default/p", ["a"]) == "a"
    p_uid = server.pod("default/p")["metadata"]["uid"]
    with pytest.raises(BindError) as refused:
        extender.state.bind("default", "owner", p_uid, "a")
    assert refused.value.kind == "name-mismatch" and "default/owner" in refused.value.reason
    assert written(server, "default/owner") == GPU0
    assert extender.state.snapshot().bind_failures == {"name-mismatch": 1}
    extender.bind("default/p", "a")
    extender.caught_up()
    assert held(extender.state) == {"owner": ("a", (GpuSlot(0),)), "p": ("a", (GpuSlot(1),))}
    rebuilt = extender.assert_matches_rebuild()  # a restart derives the same picture from the objects
    assert rebuilt.snapshot().gpus_allocated == 2


# --- disagreeing with spec.nodeName, or with capacity already held ------------------------------------


def test_claim_naming_another_node_takes_nothing_there(extenders: list[Extender]) -> None:
    elsewhere = pod("elsewhere", gpus=2, node_name="b", assignment={"node": "a", "gpus": [{"index": 0}, {"index": 1}]})
    server = FakeApiServer([node("a", L4, 2), node("b", L4, 2)], [elsewhere, pod("p", gpus=2)])
    extender = launch(extenders, server)
    assert held(extender.state)["elsewhere"] == ("b", (GpuSlot(0), GpuSlot(1)))  # on its real node
    assert extender.filter("default/p", ["a"]) == "a"  # node a is entirely free
    extender.bind("default/p", "a")
    extender.assert_matches_rebuild()


def test_foreign_claim_on_a_reserved_gpu_does_not_take_it(extenders: list[Extender]) -> None:
    """Another scheduler binds a pod claiming the GPU gpupack has just reserved for a pending pod."""
    server = FakeApiServer([node("a", L4, 2)], [pod("p", gpus=1)])
    extender = launch(extenders, server)
    assert extender.filter("default/p", ["a"]) == "a"
    reserved = reserved_for(extender, "uid-default-p")
    claim = reserved.to_assignment()
    server.put_pod(pod("foreign", gpus=1, node_name="a", scheduler="other", assignment=claim))
    extender.caught_up()
    foreign = held(extender.state)["foreign"]
    assert foreign is not None and foreign[1] != reserved.slots  # first-fit on what is left
    extender.bind("default/p", "a")
    assert written(extender.server, "default/p") == claim
    extender.caught_up()
    assert_no_overlap([node("a", L4, 2)], extender.state.placements().values())
    assert extender.state.snapshot().gpus_allocated == 2


def test_editing_the_claim_of_a_bound_pod_moves_nothing() -> None:
    """Rule 3: the pod keeps what it holds; the GPU its edited claim names stays free for others."""
    nodes = [node("a", L4, 2)]
    bound = pod("bound", gpus=1, node_name="a", assignment=GPU0)
    state = state_from(nodes, [bound])
    edited = copy.deepcopy(bound)
    edited["metadata"]["annotations"][ASSIGNMENT] = json.dumps(GPU1)
    state.apply(PodUpserted(edited))
    assert held(state) == {"bound": ("a", (GpuSlot(0),))}  # GPU 0 (in use) is not freed
    chosen, _, _ = state.decide_for_filter(pod("next", gpus=1), ["a"])
    assert chosen == "a" and held(state)["next"] == ("a", (GpuSlot(1),))
    assert_no_overlap(nodes, state.placements().values())
    assert state.snapshot().gpus_allocated == 2


def test_share_claims_beyond_a_whole_gpu_are_refused() -> None:
    """Forged shares on one GPU that add up past 1000 milli: the excess pod is placed elsewhere or waits."""
    nodes = [node("a", L4, 1)]
    share = {"node": "a", "gpus": [{"index": 0, "milli": 600}]}
    first = pod("first", milli=600, node_name="a", assignment=share)
    second = pod("second", milli=600, node_name="a", assignment=share)
    state = state_from(nodes, [first, second])
    assert held(state) == {"first": ("a", (GpuSlot(0, milli=600),)), "second": None}
    assert state.unplaced() == ["default/second"]
    assert state.snapshot().gpus_allocated == pytest.approx(0.6)
