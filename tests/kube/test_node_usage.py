"""`gpupack.io/devices-in-use` in gpupack serve: read, charged once, never a crash on garbage."""

from __future__ import annotations

import json

import orjson
import pytest

from gpupack.kube.node_facts import NodeFactsError
from gpupack.kube.node_usage import MAX_DEVICES_IN_USE_BYTES, MAX_DEVICES_IN_USE_SLOTS, NodeUsage, read_node_usage
from gpupack.kube.sources import NodeUpserted, PodDeleted, PodUpserted
from gpupack.scoring.facts import GpuSlot
from tests.extender_helpers import node, pod, state_from

IN_USE = "gpupack.io/devices-in-use"


def _node(gpus: int = 4, mig: str | None = None, **in_use: object) -> dict:
    annotations = {IN_USE: json.dumps(in_use)} if in_use else {}
    return node("n1", gpus=gpus, mig=mig, annotations=annotations)


def _held(state) -> dict[str, tuple[GpuSlot, ...]]:
    return {record.key: record.placement.slots for record in state.bound_pods().values() if record.placement}


def test_the_annotation_is_read_into_slots() -> None:
    usage = read_node_usage(_node(pods={"ml/x": [{"index": 3}]}, blocked=[{"index": 1, "milli": 250, "reason": "r"}]))
    assert usage == NodeUsage("n1", (("ml/x", (GpuSlot(3),)),), (GpuSlot(1, milli=250),))
    assert read_node_usage(_node()) == NodeUsage("n1")


@pytest.mark.parametrize("value", ["[", '["x"]', '{"pods": []}', '{"pods": {"a/b": [{"index": -1}]}}',
                                   '{"blocked": [{"index": 0, "reason": 7}]}', '{"other": 1}'])
def test_garbage_makes_the_node_unusable_with_a_reason_naming_it(value: str, caplog) -> None:
    bad = node("n1", annotations={IN_USE: value})
    with pytest.raises(NodeFactsError, match=f"node n1: {IN_USE}"):
        read_node_usage(bad)
    state = state_from([bad])
    assert state.bad_nodes()["n1"].startswith(f"node n1: {IN_USE}: ")
    state.apply(NodeUpserted(bad))  # the same again: logged once
    assert sum(IN_USE in r.getMessage() for r in caplog.records) == 1


def _listing(pods: int, slots_each: int) -> str:
    """A well-formed annotation listing `slots_each` share slots for each of `pods` pods."""
    listed = {f"ml/p{i}": [{"index": 0, "milli": 1 + j} for j in range(slots_each)] for i in range(pods)}
    return orjson.dumps({"pods": listed}).decode()


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (_listing(1, MAX_DEVICES_IN_USE_SLOTS + 1), f"{MAX_DEVICES_IN_USE_SLOTS + 1} slots listed"),
        (_listing(10, 51) + " " * MAX_DEVICES_IN_USE_BYTES, "characters, more than"),  # 256 KiB-class values
    ],
)
def test_an_annotation_larger_than_any_node_needs_is_refused_before_it_is_charged(value: str, reason: str) -> None:
    """Each change re-commits every listed slot under the state lock: an unbounded value would stall serve."""
    bad = node("n1", annotations={IN_USE: value})
    with pytest.raises(NodeFactsError, match=reason):
        read_node_usage(bad)
    assert state_from([bad]).bad_nodes()["n1"].startswith(f"node n1: {IN_USE}: ")


def test_a_full_node_listing_is_within_the_bounds() -> None:
    """250 pods (beyond kubelet's default 110 per node) with two extra share slots each still reads."""
    value = _listing(250, 2)
    assert len(value) < MAX_DEVICES_IN_USE_BYTES
    assert len(read_node_usage(node("n1", annotations={IN_USE: value})).pods) == 250


def test_a_foreign_pod_is_charged_what_the_agent_saw_not_a_first_fit_guess() -> None:
    foreign = pod("x", gpus=1, node_name="n1", namespace="ml", scheduler="default-scheduler")
    state = state_from([_node(pods={"ml/x": [{"index": 3}]})], [foreign])
    assert _held(state) == {"ml/x": (GpuSlot(3),)}
    assert "n1" not in state.node_usage.holds
    assert state.snapshot().gpus_allocated == 1
    state.apply(PodDeleted("ml/x", "uid-ml-x"))
    assert state.snapshot().gpus_allocated == 0


def test_the_annotation_arriving_later_moves_the_first_fit_guess() -> None:
    foreign = pod("x", gpus=1, node_name="n1", namespace="ml", scheduler="default-scheduler")
    state = state_from([_node()], [foreign])
    assert _held(state) == {"ml/x": (GpuSlot(0),)}  # first-fit
    state.apply(NodeUpserted(_node(pods={"ml/x": [{"index": 2}]})))
    assert _held(state) == {"ml/x": (GpuSlot(2),)}
    assert state.snapshot().gpus_allocated == 1


def test_devices_beyond_an_assignment_are_held_once() -> None:
    placed = pod("p", gpus=1, node_name="n1", namespace="ml", assignment={"node": "n1", "gpus": [{"index": 1}]})
    state = state_from([_node(pods={"ml/p": [{"index": 2}], "ml/later": [{"index": 3}]})], [placed])
    assert set(state.node_usage.holds["n1"].slots) == {GpuSlot(2), GpuSlot(3)}
    assert state.snapshot().gpus_allocated == 3
    later = pod("later", gpus=1, node_name="n1", namespace="ml", scheduler="default-scheduler")
    state.apply(PodUpserted(later))  # its GPU is in the hold already: it takes CPU and memory only
    assert _held(state)["ml/later"] == ()
    assert state.snapshot().gpus_allocated == 3
    chosen, _, _ = state.decide_for_filter(pod("new", gpus=1), ["n1"])
    assert chosen == "n1" and state.placements()["uid-default-new"].slots == (GpuSlot(0),)


def test_a_node_at_its_pod_limit_still_holds_what_the_agent_reports() -> None:
    """#26 item 7: the hold took a pod slot, so on a full node it was dropped, never retried, and the
    GPU the agent reported held was handed out once a pod left. A hold is no pod: it takes no slot."""
    full = node("n1", gpus=2, annotations={IN_USE: json.dumps({"blocked": [{"index": 1, "reason": "XID 79"}]})})
    full["status"]["allocatable"]["pods"] = full["status"]["capacity"]["pods"] = "1"
    placed = pod("p", gpus=1, node_name="n1", namespace="ml", assignment={"node": "n1", "gpus": [{"index": 0}]})
    state = state_from([full], [placed])
    assert state.node_usage.holds["n1"].slots == (GpuSlot(1),)
    assert state.snapshot().gpus_allocated == 2
    state.apply(PodDeleted("ml/p", "uid-ml-p"))
    assert state.decide_for_filter(pod("two", gpus=2), ["n1"])[0] is None
    assert state.decide_for_filter(pod("one", gpus=1), ["n1"])[0] == "n1"
    assert state.placements()["uid-default-one"].slots == (GpuSlot(0),)


def test_a_refused_mig_slot_is_not_offered_again_and_slots_in_use_are_skipped() -> None:
    blocked = [{"index": 0, "mig": "3g.40gb", "start": 4, "reason": "NVML refused"},
               {"index": 1, "mig": "3g.40gb", "start": 0, "reason": "assigned below"},
               {"index": 9, "reason": "no such GPU"}]
    assigned = pod("m", mig="3g.40gb", node_name="n1", assignment={"node": "n1", "gpus": [
        {"index": 1, "mig": "3g.40gb", "start": 0}]})
    state = state_from([_node(gpus=2, mig="dynamic", blocked=blocked)], [assigned])
    assert state.node_usage.holds["n1"].slots == (GpuSlot(0, mig="3g.40gb", start=4),)
    placements = []
    for name in ("a", "b"):
        assert state.decide_for_filter(pod(name, mig="3g.40gb"), ["n1"])[0] == "n1"
        placements.append(state.placements()[f"uid-default-{name}"].slots[0])
    assert GpuSlot(0, mig="3g.40gb", start=4) not in placements
    assert set(placements) == {GpuSlot(0, mig="3g.40gb", start=0), GpuSlot(1, mig="3g.40gb", start=4)}
