"""gpupack as DRA's device chooser (#30 item 2): gated pods' claims allocated by gpupack's engine, written with
resourceVersion preconditions, the gate removed; what gpupack does not read, or cannot place, is left to
kube-scheduler with the reason. The API server is a fake that keeps the contract the allocator relies on
(resourceVersion checked on every write, a 404 for a missing claim)."""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

from gpupack.extender.dra_allocator import Step, claim_names
from gpupack.extender.settings import Settings
from gpupack.extender.state import ClusterState
from gpupack.kube.dra import DRIVER
from gpupack.kube.dra.allocation import FINALIZER, allocation_node
from gpupack.kube.keys import GATE_DRA_ALLOCATION
from gpupack.kube.objects import make_node, make_pod
from gpupack.kube.sources import DraUpserted, NodeUpserted, PodDeleted, PodUpserted, Synced
from gpupack.kube.sources.dra_writes import Conflict
from gpupack.scoring.facts import GpuSlot
from tests.kube.dra_bodies import gpu_device, h100_dynamic, h100_full, resource_slice

JsonObject = dict[str, Any]
MIG_CLASS = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
GPU_CLASS = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"


class FakeApi:
    """Claims and pods by key; every write checks the resourceVersion it carries, as the API server does."""

    def __init__(self) -> None:
        self.claims: dict[str, JsonObject] = {}
        self.pods: dict[str, JsonObject] = {}
        self.writes: list[str] = []
        self.version = 100
        self.during_status: Any = None  # called inside a status write (to look at the inventory then)

    def add_claim(self, claim: JsonObject) -> None:
        self.claims[f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"] = claim

    def get_claim(self, namespace: str, name: str) -> JsonObject | None:
        claim = self.claims.get(f"{namespace}/{name}")
        return copy.deepcopy(claim) if claim is not None else None

    def replace_claim(self, claim: JsonObject) -> JsonObject:
        return self._put(claim, "claim")

    def replace_claim_status(self, claim: JsonObject) -> JsonObject:
        if self.during_status is not None:
            self.during_status()
        return self._put(claim, "status")

    def _put(self, claim: JsonObject, what: str) -> JsonObject:
        key = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
        stored = self.claims.get(key)
        if stored is None or stored["metadata"]["resourceVersion"] != claim["metadata"]["resourceVersion"]:
            raise Conflict(f"claim {key}: the object has been modified")
        self.version += 1
        stored = copy.deepcopy(claim)
        stored["metadata"]["resourceVersion"] = str(self.version)
        self.claims[key] = stored
        self.writes.append(f"{what} {key}")
        return copy.deepcopy(stored)

    def remove_gate(self, pod: JsonObject, gate: str) -> None:
        self.writes.append(f"ungate {pod['metadata']['namespace']}/{pod['metadata']['name']}")
        self.pods[pod["metadata"]["name"]] = pod


def device_class(name: str, expression: str) -> JsonObject:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": {"selectors": [{"cel": {"expression": expression}}], "config": [{"opaque": {"driver": DRIVER}}]},
    }


def mig_request(name: str, profile: str, count: int = 1) -> JsonObject:
    selector = {"cel": {"expression": f"device.attributes['gpu.nvidia.com'].profile == '{profile}'"}}
    return {"name": name, "exactly": {"deviceClassName": "mig.nvidia.com", "count": count, "selectors": [selector]}}


def unallocated(name: str, *requests: JsonObject, namespace: str = "ml") -> JsonObject:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "resourceVersion": "7"},
        "spec": {"devices": {"requests": list(requests)}},
    }


def gated_pod(name: str, claims: list[str], **kwargs: Any) -> JsonObject:
    pod = make_pod(name, namespace="ml", uid=f"uid-{name}", requests={"cpu": "1", "memory": "1Gi"}, **kwargs)
    pod["spec"]["resourceClaims"] = [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)]
    pod["spec"]["schedulingGates"] = [{"name": GATE_DRA_ALLOCATION}]
    return pod


def cluster(*slices: JsonObject, nodes: tuple[str, ...] = ("a",)) -> tuple[ClusterState, FakeApi]:
    state = ClusterState(Settings())
    for node in nodes:
        state.apply(NodeUpserted(make_node(node, product=None, cpu="64", memory="512Gi")))
    for piece in slices:
        state.apply(DraUpserted(piece))
    state.apply(DraUpserted(device_class("mig.nvidia.com", MIG_CLASS)))
    state.apply(DraUpserted(device_class("gpu.nvidia.com", GPU_CLASS)))
    state.apply(Synced())
    api = FakeApi()
    state.dra_allocator.writer = api
    return state, api


def submit(state: ClusterState, api: FakeApi, pod: JsonObject, *claims: JsonObject) -> Step:
    for claim in claims:
        api.add_claim(claim)
    state.apply(PodUpserted(pod))
    return state.dra_allocator.attempt(pod)


def results(api: FakeApi, key: str) -> list[JsonObject]:
    return api.claims[key]["status"]["allocation"]["devices"]["results"]


def test_a_mig_claim_is_allocated_on_a_published_device_with_the_node_selector_and_the_gate_goes() -> None:
    state, api = cluster(*h100_dynamic("a", gpus=2))
    step = submit(state, api, gated_pod("p", ["small"]), unallocated("small", mig_request("mig", "1g.10gb")))
    assert step == Step.ALLOCATED
    claim = api.claims["ml/small"]
    assert FINALIZER in claim["metadata"]["finalizers"]
    assert allocation_node(claim) == "a"
    [result] = results(api, "ml/small")
    assert (result["request"], result["driver"], result["pool"]) == ("mig", DRIVER, "a")
    assert result["device"].startswith("gpu-") and "-mig-1g10gb-" in result["device"]
    assert claim["status"]["allocation"]["devices"]["config"] == [
        {"source": "FromClass", "requests": ["mig"], "opaque": {"driver": DRIVER}}
    ]
    assert api.writes == ["claim ml/small", "status ml/small", "ungate ml/p"]
    held = state.ledger.dra.held()
    assert list(held) == [(DRIVER, "a", result["device"])]
    assert state.dra_allocator.waiting() == 0


def test_small_instances_are_packed_so_the_largest_profile_stays_placeable() -> None:
    """Upstream's first fit may spread 1g instances over GPUs (dra-driver-nvidia-gpu #932); gpupack keeps a
    whole GPU free for 7g.80gb."""
    state, api = cluster(*h100_dynamic("a", gpus=2))
    for i in range(3):
        pod = gated_pod(f"p{i}", [f"c{i}"])
        assert submit(state, api, pod, unallocated(f"c{i}", mig_request("mig", "1g.10gb"))) == Step.ALLOCATED
    gpus = {results(api, f"ml/c{i}")[0]["device"].split("-mig-")[0] for i in range(3)}
    assert len(gpus) == 1
    big = gated_pod("big", ["big"])
    assert submit(state, api, big, unallocated("big", mig_request("mig", "7g.80gb"))) == Step.ALLOCATED


def test_the_devices_are_held_while_the_allocation_is_written_and_once_after() -> None:
    state, api = cluster(h100_full("a", gpus=2))
    seen: list[int] = []
    api.during_status = lambda: seen.append(len(state.ledger.inventory.free_slots("a")))
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}
    assert submit(state, api, gated_pod("p", ["one"]), unallocated("one", request)) == Step.ALLOCATED
    assert seen == [1]  # the hold: one of two GPUs taken while writing
    assert [s for s in state.ledger.inventory.free_slots("a") if s == GpuSlot(s.index)] != []
    assert len(state.ledger.inventory.free_slots("a")) == 1  # the claim holds it now, once


def test_first_available_is_scored_and_names_the_entry_it_used() -> None:
    state, api = cluster(h100_full("a", gpus=1))
    request = {
        "name": "gpu",
        "firstAvailable": [
            {"name": "two", "deviceClassName": "gpu.nvidia.com", "count": 2},  # fits no node
            {"name": "one", "deviceClassName": "gpu.nvidia.com", "count": 1},
        ],
    }
    assert submit(state, api, gated_pod("p", ["c"]), unallocated("c", request)) == Step.ALLOCATED
    assert [r["request"] for r in results(api, "ml/c")] == ["gpu/one"]


def test_an_alternative_placed_where_no_device_is_published_falls_through_to_the_next() -> None:
    """Only 1g.10gb at start 0 is published: the engine puts a 1g elsewhere, so the 2g entry is the one used."""
    published = (("1g.10gb", (0,)), ("2g.20gb", (0, 2, 4)))
    state, api = cluster(*h100_dynamic("a", gpus=1, placements=published))
    request = {
        "name": "mig",
        "firstAvailable": [
            {"name": "small", **mig_request("", "1g.10gb")["exactly"]},
            {"name": "mid", **mig_request("", "2g.20gb")["exactly"]},
        ],
    }
    assert submit(state, api, gated_pod("p", ["c"]), unallocated("c", request)) == Step.ALLOCATED
    [result] = results(api, "ml/c")
    assert result["request"] == "mig/mid" and "-mig-2g20gb-" in result["device"]


def test_a_selector_gpupack_does_not_read_is_left_to_kube_scheduler_with_the_reason() -> None:
    state, api = cluster(*h100_dynamic("a"))
    odd = {
        "name": "g",
        "exactly": {
            "deviceClassName": "mig.nvidia.com",
            "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].memory > 5"}}],
        },
    }
    step = submit(state, api, gated_pod("p", ["c"]), unallocated("c", odd))
    assert step == Step.LEFT
    assert "status" not in api.claims["ml/c"] and api.writes == ["ungate ml/p"]
    assert state.ledger.dra.held() == {}


def test_a_pod_that_fits_nowhere_is_ungated_unallocated_so_autoscalers_see_it() -> None:
    state, api = cluster(h100_full("a", gpus=1))
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 4}}
    assert submit(state, api, gated_pod("p", ["c"]), unallocated("c", request)) == Step.LEFT
    assert api.writes == ["ungate ml/p"]
    assert len(state.ledger.inventory.free_slots("a")) == 1  # nothing held


def test_a_lost_race_releases_the_hold_and_plans_again_from_a_fresh_read() -> None:
    state, api = cluster(h100_full("a", gpus=2))
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}
    claim = unallocated("c", request)
    api.add_claim(claim)
    pod = gated_pod("p", ["c"])
    state.apply(PodUpserted(pod))

    def someone_else_allocates() -> None:  # another allocator wins the claim between our read and write
        api.during_status = None
        other = copy.deepcopy(api.claims["ml/c"])
        other["status"] = {
            "allocation": {
                "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": "a", "device": "gpu-1"}]},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]}
                    ]
                },
            }
        }
        other["metadata"]["resourceVersion"] = "999"
        api.claims["ml/c"] = other

    api.during_status = someone_else_allocates
    assert state.dra_allocator.attempt(pod) == Step.RACE
    assert len(state.ledger.inventory.free_slots("a")) == 2  # the hold is given back
    assert state.dra_allocator.attempt(pod) == Step.ALREADY  # re-read: allocated by the other: only ungated
    assert api.writes[-1] == "ungate ml/p"


def test_a_template_claim_not_made_yet_waits_then_is_allocated() -> None:
    state, api = cluster(*h100_dynamic("a"))
    pod = gated_pod("p", [])
    pod["spec"]["resourceClaims"] = [{"name": "mig", "resourceClaimTemplateName": "one-mig"}]
    assert claim_names(pod) is None
    assert submit(state, api, pod) == Step.WAITING
    pod["status"]["resourceClaimStatuses"] = [{"name": "mig", "resourceClaimName": "p-mig-x8z"}]
    assert claim_names(pod) == ["ml/p-mig-x8z"]
    assert submit(state, api, pod, unallocated("p-mig-x8z", mig_request("m", "3g.40gb"))) == Step.ALLOCATED


def test_a_claim_event_wakes_only_the_pods_that_use_that_claim_or_wait_for_theirs() -> None:
    state, api = cluster(*h100_dynamic("a"))
    named, unnamed = gated_pod("named", ["mine"]), gated_pod("unnamed", [])
    unnamed["spec"]["resourceClaims"] = [{"name": "mig", "resourceClaimTemplateName": "one-mig"}]
    assert submit(state, api, named) == Step.WAITING  # its claim is not there yet
    assert submit(state, api, unnamed) == Step.WAITING
    allocator = state.dra_allocator
    assert allocator.due() == []
    state.apply(DraUpserted(unallocated("someone-elses", mig_request("m", "1g.10gb"))))
    assert allocator.due() == ["ml/unnamed"]
    state.apply(DraUpserted(unallocated("mine", mig_request("m", "1g.10gb"))))
    assert sorted(allocator.due()) == ["ml/named", "ml/unnamed"]


def test_the_pods_node_selector_and_the_nodes_taints_are_honoured() -> None:
    state, api = cluster(h100_full("a", gpus=2), h100_full("b", gpus=2), nodes=("a", "b"))
    tainted = make_node("a", product=None, cpu="64", memory="512Gi")
    tainted["spec"]["taints"] = [{"key": "team", "value": "x", "effect": "NoSchedule"}]
    state.apply(NodeUpserted(tainted))
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}
    assert submit(state, api, gated_pod("p", ["c"]), unallocated("c", request)) == Step.ALLOCATED
    assert allocation_node(api.claims["ml/c"]) == "b"
    pod = gated_pod("q", ["d"])
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "nowhere"}
    assert submit(state, api, pod, unallocated("d", request)) == Step.LEFT


def test_a_pod_whose_claim_another_pod_allocated_goes_where_that_claim_is() -> None:
    state, api = cluster(h100_full("a", gpus=2), h100_full("b", gpus=2), nodes=("a", "b"))
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}
    assert submit(state, api, gated_pod("p", ["shared"]), unallocated("shared", request)) == Step.ALLOCATED
    node = allocation_node(api.claims["ml/shared"])
    step = submit(state, api, gated_pod("q", ["shared", "own"]), unallocated("own", request))
    assert step == Step.ALLOCATED and allocation_node(api.claims["ml/own"]) == node


def test_a_pod_without_the_gate_is_not_touched() -> None:
    state, _ = cluster(h100_full("a", gpus=2))
    pod = gated_pod("p", ["c"])
    pod["spec"]["schedulingGates"] = []
    state.apply(PodUpserted(pod))
    assert state.dra_allocator.waiting() == 0


def test_static_mig_instances_are_chosen_by_their_published_placement() -> None:
    devices = [gpu_device("a", 0)]
    state, api = cluster(resource_slice("a-gpu", "a", devices))
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
    assert submit(state, api, gated_pod("p", ["c"]), unallocated("c", request)) == Step.ALLOCATED
    assert results(api, "ml/c")[0]["device"] == "gpu-0"


def test_the_worker_thread_allocates_in_arrival_order_once_the_cluster_is_listed() -> None:
    state, api = cluster(h100_full("a", gpus=2))
    listed = threading.Event()
    allocator = state.dra_allocator
    allocator.ready = listed.is_set
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}
    for name in ("first", "second", "third"):
        api.add_claim(unallocated(f"c-{name}", request))
        state.apply(PodUpserted(gated_pod(name, [f"c-{name}"])))
    allocator.start()
    try:
        time.sleep(0.3)
        assert api.writes == []  # not every DRA object listed yet: nothing is chosen
        listed.set()
        deadline = time.monotonic() + 10
        while allocator.waiting() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        allocator.stop()
    assert [w for w in api.writes if w.startswith("ungate")] == [
        "ungate ml/first",
        "ungate ml/second",
        "ungate ml/third",
    ]
    assert "status" in api.claims["ml/c-first"] and "status" in api.claims["ml/c-second"]
    assert "status" not in api.claims["ml/c-third"]  # two GPUs: the third is left to kube-scheduler
    assert allocator.steps == {Step.ALLOCATED: 2, Step.LEFT: 1}


class CountingCondition(threading.Condition):
    """The allocator's condition, counting the wake-ups it is asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.notified = 0

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)


def test_only_gated_pods_and_their_claims_wake_the_allocator_not_every_pod_event() -> None:
    """Every pod event passes through the allocator; under a burst of binds a wake-up each cost its worker a
    thread switch per bind (#32), so an event that makes nothing due wakes nothing."""
    state, api = cluster(h100_full("a", gpus=1))
    condition = CountingCondition()
    state.dra_allocator._cond = condition  # the double: the same condition, counted
    for i in range(3):  # ordinary pods: pending, then bound, then gone
        pod = make_pod(f"plain-{i}", namespace="ml", uid=f"uid-plain-{i}", requests={"cpu": "1"})
        state.apply(PodUpserted(pod))
        state.apply(PodUpserted(make_pod(f"plain-{i}", namespace="ml", uid=f"uid-plain-{i}", node="a")))
        state.apply(PodDeleted(f"ml/plain-{i}", f"uid-plain-{i}"))
    state.apply(DraUpserted(unallocated("nobody-waits")))  # a claim no gated pod names
    assert condition.notified == 0
    state.apply(PodUpserted(gated_pod("p", ["c"])))
    assert condition.notified == 1
    state.apply(DraUpserted(unallocated("c")))  # the claim it waits for
    assert condition.notified == 2
    api.add_claim(unallocated("c", {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}))
    assert state.dra_allocator.attempt(gated_pod("p", ["c"])) == Step.ALLOCATED
