"""The DRA inventory in the ledger (#30 item 1): GPUs of DRA nodes from their ResourceSlices, devices of
allocated ResourceClaims held exactly once, and a mixed cluster of device-plugin and DRA nodes never counted
twice — one test per KEP-5004 case (docs/dra.md#rules)."""

from __future__ import annotations

import copy
import json
import logging
from typing import Any

import pytest

from gpupack.extender.pod_records import PlacedBy
from gpupack.extender.settings import Settings
from gpupack.extender.state import ClusterState
from gpupack.kube.dra import DRIVER
from gpupack.kube.keys import ANNOTATION_ASSIGNMENT
from gpupack.kube.objects import make_node, make_pod
from gpupack.kube.pod_request import request_from_pod
from gpupack.kube.sources import (
    DraDeleted,
    DraUpserted,
    Event,
    NodeDeleted,
    NodeUpserted,
    PodDeleted,
    PodUpserted,
    Synced,
)
from gpupack.scoring.facts import GpuSlot, Placement
from gpupack.scoring.inventory import InventoryError
from tests.kube.dra_bodies import (
    claim,
    device_class,
    gpu_device,
    h100_dynamic,
    h100_full,
    mig_device,
    mig_name,
    resource_slice,
    served_by,
)

JsonObject = dict[str, Any]


def dra_node(name: str, **kwargs: Any) -> JsonObject:
    """A Node of a DRA GPU node: no GPU in allocatable, no GPU labels (the slices say it all)."""
    return make_node(name, product=None, cpu="96", memory="1Ti", **kwargs)


def gpu_pod(name: str, node: str, gpus: int, **kwargs: Any) -> JsonObject:
    """A bound pod asking `nvidia.com/gpu: gpus` (limits), 4 CPUs and 16 GiB."""
    requests: dict[str, str | int] = {"nvidia.com/gpu": gpus, "cpu": "4", "memory": "16Gi"}
    return make_pod(name, namespace="ml", uid=f"uid-{name}", requests=requests, node=node, **kwargs)


def state_of(*events: Event) -> ClusterState:
    state = ClusterState(Settings())
    for event in events:
        state.apply(event)
    return state


def up(obj: JsonObject) -> Event:
    return (
        NodeUpserted(obj) if obj["kind"] == "Node" else PodUpserted(obj) if obj["kind"] == "Pod" else DraUpserted(obj)
    )


def whole_free(state: ClusterState, node: str) -> int:
    """Entire GPUs nothing holds on the node."""
    return sum(1 for slot in state.ledger.inventory.free_slots(node) if not slot.mig and not slot.milli)


def gpus_total(state: ClusterState) -> int:
    return state.ledger.inventory.gpus_total()


def claim_of(name: str, devices: list[str], node: str = "dra", **kwargs: Any) -> JsonObject:
    return claim(name, [(node, device) for device in devices], **kwargs)


# --- KEP-5004 mixed-cluster cases: never counted twice ---------------------------------------------


def test_a_device_plugin_node_and_a_dra_node_are_each_counted_once() -> None:
    state = state_of(
        NodeUpserted(make_node("dp", gpus=8)),
        NodeUpserted(dra_node("dra")),
        DraUpserted(h100_full("dra")),
        PodUpserted(gpu_pod("plugin-pod", "dp", 2)),
        DraUpserted(claim_of("train", ["gpu-0", "gpu-1", "gpu-2"], pods=["uid-claim-pod"])),
        PodUpserted(make_pod("claim-pod", namespace="ml", uid="uid-claim-pod", node="dra")),  # CPU only in limits
        Synced(),
    )
    assert gpus_total(state) == 16
    assert (whole_free(state, "dp"), whole_free(state, "dra")) == (6, 5)
    assert state.ledger.dra.is_dra_node("dra") and not state.ledger.dra.is_dra_node("dp")


@pytest.mark.parametrize("order", ["pod first", "claim first", "slices last"])
def test_a_dra_nodes_gpu_pod_served_by_an_extended_resource_claim_is_counted_through_its_claim(order: str) -> None:
    """KEP-5004: `nvidia.com/gpu: 2` on a DRA node is served by a claim kube-scheduler made; its GPUs are the
    claim's two devices, not two more from its limits, whatever order the watches deliver them in."""
    pod = served_by(gpu_pod("a", "dra", 2), "a-gpu-x7k2p")
    special = claim_of("a-gpu-x7k2p", ["gpu-4", "gpu-5"], pods=["uid-a"], extended=True)
    events = {
        "pod first": [up(pod), up(h100_full("dra")), up(special)],
        "claim first": [up(special), up(h100_full("dra")), up(pod)],
        "slices last": [up(pod), up(special), Synced(), up(h100_full("dra"))],
    }[order]
    state = state_of(NodeUpserted(dra_node("dra")), DraUpserted(device_class()), *events, Synced())
    assert whole_free(state, "dra") == 6
    record = state.ledger.bound("uid-a")
    assert record is not None and record.how == PlacedBy.CLAIM
    assert record.placement == Placement("dra", (), 4000, 16 << 30)
    assert set(state.ledger.dra.held()) == {(DRIVER, "dra", "gpu-4"), (DRIVER, "dra", "gpu-5")}


def test_a_pod_on_a_pure_dra_node_is_served_by_a_claim_before_its_status_says_so() -> None:
    """The Node advertises no nvidia.com/gpu and a DeviceClass backs it: only a claim can have served the pod."""
    state = state_of(
        NodeUpserted(dra_node("dra")),
        DraUpserted(h100_full("dra")),
        DraUpserted(device_class()),
        PodUpserted(gpu_pod("a", "dra", 2)),
        Synced(),
    )
    assert whole_free(state, "dra") == 8  # nothing held until its claim is seen
    state.apply(DraUpserted(claim_of("a-gpu-1", ["gpu-0", "gpu-1"], pods=["uid-a"], extended=True)))
    assert whole_free(state, "dra") == 6


def test_without_a_device_class_a_gpu_pod_on_a_dra_node_is_charged_from_its_limits() -> None:
    """No DeviceClass backs nvidia.com/gpu: nothing served it through a claim, so it is charged first-fit."""
    state = state_of(NodeUpserted(dra_node("dra")), DraUpserted(h100_full("dra")), PodUpserted(gpu_pod("a", "dra", 2)))
    state.apply(Synced())
    record = state.ledger.bound("uid-a")
    assert record is not None and record.how == PlacedBy.FIRST_FIT
    assert whole_free(state, "dra") == 6


def test_a_node_with_device_plugin_capacity_and_slices_counts_its_gpus_once() -> None:
    """Slices win: 8 GPUs, not 16; a pod the device plugin served (no extended claim, the Node advertises
    nvidia.com/gpu) and a claim share those 8."""
    node = make_node("both", gpus=8)
    state = state_of(
        NodeUpserted(node),
        DraUpserted(h100_full("both")),
        DraUpserted(device_class()),
        PodUpserted(gpu_pod("plugin-pod", "both", 2)),
        DraUpserted(claim_of("train", ["gpu-6", "gpu-7"], node="both")),
        Synced(),
    )
    assert gpus_total(state) == 8
    assert whole_free(state, "both") == 4
    record = state.ledger.bound("uid-plugin-pod")
    assert record is not None and record.how == PlacedBy.FIRST_FIT
    assert all(slot.index < 6 for slot in record.placement.slots)  # type: ignore[union-attr]


def test_a_claim_allocated_while_its_slice_is_missing_holds_its_devices_once_the_slice_comes() -> None:
    state = state_of(
        NodeUpserted(dra_node("dra")),
        DraUpserted(claim_of("train", ["gpu-0", "gpu-1"], pods=["uid-p"])),
        Synced(),
    )
    assert gpus_total(state) == 0 and state.ledger.dra.held() == {}
    assert set(state.ledger.dra.holders()) == {(DRIVER, "dra", "gpu-0"), (DRIVER, "dra", "gpu-1")}
    state.apply(DraUpserted(h100_full("dra")))
    assert whole_free(state, "dra") == 6
    state.apply(DraUpserted(h100_full("dra", generation=2, rv="2")))  # the driver republishes the pool
    state.apply(DraUpserted(claim_of("train", ["gpu-0", "gpu-1"], pods=["uid-p"], rv="2")))  # and the claim again
    assert whole_free(state, "dra") == 6
    assert len(state.ledger.dra.held()) == 2


def test_a_slice_removed_while_claims_hold_its_devices_keeps_them_held() -> None:
    state = state_of(
        NodeUpserted(dra_node("dra")),
        DraUpserted(h100_full("dra")),
        DraUpserted(claim_of("train", ["gpu-0", "gpu-1"])),
        Synced(),
    )
    state.apply(DraDeleted("ResourceSlice", "dra-gpu", "uid-slice-dra-gpu"))  # the driver restarts
    assert gpus_total(state) == 8 and whole_free(state, "dra") == 6  # held GPUs do not look free
    state.apply(DraUpserted(h100_full("dra", generation=2)))  # it publishes again
    assert gpus_total(state) == 8 and whole_free(state, "dra") == 6
    state.apply(DraDeleted("ResourceSlice", "dra-gpu", "uid-slice-dra-gpu"))
    state.apply(DraDeleted("ResourceClaim", "ml/train", "uid-claim-train"))  # no claim holds them: gone
    assert gpus_total(state) == 0
    assert state.ledger.dra.held() == {} and state.ledger.dra.holders() == {}


def test_a_deallocated_claim_gives_its_devices_back_and_waiting_pods_take_them() -> None:
    state = state_of(
        NodeUpserted(dra_node("dra")),
        DraUpserted(h100_full("dra", gpus=2)),
        DraUpserted(claim_of("train", ["gpu-0", "gpu-1"])),
        PodUpserted(gpu_pod("late", "dra", 1)),  # no DeviceClass: charged first-fit, and nothing is free
        Synced(),
    )
    assert state.ledger.unplaced() == ["ml/late"]
    state.apply(DraUpserted(claim_of("train", [], rv="2")))  # deallocated
    assert state.ledger.unplaced() == []
    assert whole_free(state, "dra") == 1


def test_a_bound_pods_extended_claim_appearing_later_moves_its_gpus_to_the_claim() -> None:
    """A mixed node: the pod was first charged from its limits; once its status names the claim kube-scheduler
    made, the claim holds its GPUs and the pod only its CPU and memory."""
    state = state_of(
        NodeUpserted(make_node("both", gpus=8)),
        DraUpserted(h100_full("both")),
        PodUpserted(gpu_pod("a", "both", 2)),
        Synced(),
    )
    assert whole_free(state, "both") == 6
    state.apply(DraUpserted(claim_of("a-gpu-1", ["gpu-6", "gpu-7"], node="both", pods=["uid-a"], extended=True)))
    state.apply(PodUpserted(served_by(gpu_pod("a", "both", 2), "a-gpu-1")))
    assert whole_free(state, "both") == 6
    record = state.ledger.bound("uid-a")
    assert record is not None and record.how == PlacedBy.CLAIM
    state.apply(PodDeleted("ml/a", "uid-a"))
    state.apply(DraDeleted("ResourceClaim", "ml/a-gpu-1", "uid-claim-a-gpu-1"))
    assert whole_free(state, "both") == 8


def test_two_pods_sharing_one_claim_hold_its_device_once() -> None:
    state = state_of(
        NodeUpserted(dra_node("dra")),
        DraUpserted(h100_full("dra")),
        DraUpserted(claim_of("shared", ["gpu-3"], pods=["uid-x", "uid-y"])),
        PodUpserted(make_pod("x", namespace="ml", uid="uid-x", node="dra")),
        PodUpserted(make_pod("y", namespace="ml", uid="uid-y", node="dra")),
        Synced(),
    )
    assert whole_free(state, "dra") == 7


# --- MIG, taints, bad objects -------------------------------------------------------------------------


def test_a_dynamic_mig_claim_holds_its_placement() -> None:
    state = state_of(
        NodeUpserted(dra_node("dra")),
        *(DraUpserted(s) for s in h100_dynamic("dra", gpus=2)),
        DraUpserted(claim_of("small", [mig_name(0, "3g.40gb", 4)])),
        Synced(),
    )
    inventory = state.ledger.inventory
    with pytest.raises(InventoryError):
        inventory.commit(Placement("dra", (GpuSlot(0, mig="3g.40gb", start=4),), pod_slots=0))
    inventory.commit(Placement("dra", (GpuSlot(0, mig="3g.40gb", start=0),), pod_slots=0))
    assert state.ledger.dra.held()[DRIVER, "dra", mig_name(0, "3g.40gb", 4)].slots == (
        GpuSlot(0, mig="3g.40gb", start=4),
    )


def test_a_static_mig_claim_holds_its_instance() -> None:
    instances = [mig_device("dra", 0, "4g.40gb", 0), mig_device("dra", 0, "3g.40gb", 4), gpu_device("dra", 1)]
    state = state_of(
        NodeUpserted(dra_node("dra")),
        DraUpserted(resource_slice("dra-gpu", "dra", instances)),
        DraUpserted(claim_of("one", [mig_name(0, "3g.40gb", 4)])),
        Synced(),
    )
    free = state.ledger.inventory.free_slots("dra")
    assert GpuSlot(0, mig="4g.40gb", start=0) in free and GpuSlot(0, mig="3g.40gb", start=4) not in free
    assert GpuSlot(1) in free


def test_a_tainted_device_is_held_until_the_taint_goes() -> None:
    tainted = resource_slice("dra-gpu", "dra", [gpu_device("dra", 0, taint="NoExecute"), gpu_device("dra", 1)])
    state = state_of(NodeUpserted(dra_node("dra")), DraUpserted(tainted), Synced())
    assert state.ledger.inventory.free_slots("dra") == (GpuSlot(1),)
    healed = resource_slice("dra-gpu", "dra", [gpu_device("dra", 0), gpu_device("dra", 1)], generation=2)
    state.apply(DraUpserted(healed))
    assert whole_free(state, "dra") == 2


def test_a_bad_slice_makes_its_node_unusable_with_the_reason(caplog: pytest.LogCaptureFixture) -> None:
    bad = h100_full("dra")
    bad["spec"]["devices"][2]["capacity"]["memory"] = {"value": "lots"}
    state = state_of(NodeUpserted(dra_node("dra")), DraUpserted(bad), Synced())
    reason = state.ledger.bad["dra"]
    assert reason.startswith("node dra: ResourceSlices: ResourceSlice dra-gpu: spec.devices[2].capacity.memory: ")
    state.apply(DraUpserted(h100_full("dra")))
    assert "dra" not in state.ledger.bad and gpus_total(state) == 8
    assert "DRA: ResourceSlice dra-gpu: spec.devices[2].capacity.memory" in caplog.text


def test_a_bad_claim_keeps_what_it_held(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    state = state_of(
        NodeUpserted(dra_node("dra")), DraUpserted(h100_full("dra")), DraUpserted(claim_of("c", ["gpu-0"]))
    )
    bad = claim_of("c", ["gpu-0"], rv="2")
    bad["status"]["allocation"]["devices"]["results"][0]["device"] = 7
    state.apply(DraUpserted(bad))
    assert whole_free(state, "dra") == 7
    assert "ResourceClaim ml/c: status.allocation.devices.results[0].device" in caplog.text


def test_a_deleted_node_forgets_its_devices_and_comes_back_with_them() -> None:
    node = dra_node("dra")
    state = state_of(NodeUpserted(node), DraUpserted(h100_full("dra")), DraUpserted(claim_of("c", ["gpu-0"])))
    state.apply(NodeDeleted("dra"))
    assert gpus_total(state) == 0 and state.ledger.dra.held() == {}
    state.apply(NodeUpserted(copy.deepcopy(node)))
    assert whole_free(state, "dra") == 7


def test_a_filter_reservation_on_a_dra_node_gives_way_to_the_claim_that_serves_the_pod() -> None:
    """gpupack reserved two GPUs in filter; kube-scheduler's DRA plugin allocated the pod's claim elsewhere on the
    node. Once the pod is seen bound and served by that claim, the reservation is given back: the GPUs are held
    once, by the claim."""
    state = state_of(
        NodeUpserted(dra_node("dra")), DraUpserted(h100_full("dra")), DraUpserted(device_class()), Synced()
    )
    reserved = Placement("dra", (GpuSlot(0), GpuSlot(1)), 4000, 16 << 30)
    pod = served_by(
        gpu_pod("a", "dra", 2, annotations={ANNOTATION_ASSIGNMENT: json.dumps(reserved.to_assignment())}), "a-1"
    )
    state.ledger.inventory.commit(reserved)
    state.ledger.book.assume("uid-a", "ml/a", reserved, request_from_pod(pod))
    state.apply(DraUpserted(claim_of("a-1", ["gpu-4", "gpu-5"], pods=["uid-a"], extended=True)))
    assert whole_free(state, "dra") == 4  # until the bind is seen, both hold
    state.apply(PodUpserted(pod))
    assert whole_free(state, "dra") == 6
    record = state.ledger.bound("uid-a")
    assert record is not None and record.how == PlacedBy.CLAIM
    assert state.ledger.book.get("uid-a") is None
