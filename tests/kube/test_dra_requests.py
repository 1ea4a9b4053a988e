"""Reading what a ResourceClaim asks for (kube/dra/requests.py), writing its allocation (kube/dra/allocation.py) and
whether a pod may use a node at all (kube/node_rules.py) — the pure parts of gpupack's DRA device choice (#30)."""

from __future__ import annotations

from typing import Any

import pytest

from gpupack.kube.dra.allocation import FINALIZER, ChosenDevice, allocated, allocation_node, with_finalizer
from gpupack.kube.dra.requests import DeviceAsk, NotOurs, RequestAsk, claim_asks
from gpupack.kube.node_rules import why_not
from gpupack.scoring.request import Kind

JsonObject = dict[str, Any]
NVIDIA = "device.driver == 'gpu.nvidia.com'"
CLASSES: dict[str, JsonObject] = {
    "gpu.nvidia.com": {
        "selectors": [{"cel": {"expression": f"{NVIDIA} && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]
    },
    "mig.nvidia.com": {
        "selectors": [{"cel": {"expression": f"({NVIDIA}) && (device.attributes['gpu.nvidia.com'].type == 'mig')"}}]
    },
    "other.example.com": {"selectors": [{"cel": {"expression": "device.driver == 'other.example.com'"}}]},
}


def claim(*requests: JsonObject, **devices: Any) -> JsonObject:
    return {"metadata": {"name": "c", "namespace": "ml"}, "spec": {"devices": {"requests": list(requests), **devices}}}


def profile(name: str) -> JsonObject:
    return {"cel": {"expression": f'device.attributes["gpu.nvidia.com"].profile == "{name}"'}}


def test_whole_gpus_and_mig_profiles_are_read_from_class_and_request_selectors() -> None:
    asks = claim_asks(
        claim(
            {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}},
            {"name": "mig", "exactly": {"deviceClassName": "mig.nvidia.com", "selectors": [profile("1g.10gb.me")]}},
        ),
        CLASSES,
    )
    assert asks == (
        RequestAsk("gpus", (DeviceAsk("gpus", "gpu.nvidia.com", Kind.WHOLE, 2),)),
        RequestAsk("mig", (DeviceAsk("mig", "mig.nvidia.com", Kind.MIG, 1, "1g.10gb+me"),)),
    )


def test_first_available_entries_are_alternatives_named_request_slash_entry() -> None:
    request = {
        "name": "gpu",
        "firstAvailable": [
            {"name": "big", "deviceClassName": "mig.nvidia.com", "selectors": [profile("3g.40gb")]},
            {"name": "whole", "deviceClassName": "gpu.nvidia.com"},
        ],
    }
    (ask,) = claim_asks(claim(request), CLASSES)
    assert [(a.request, a.kind, a.profile) for a in ask.alternatives] == [
        ("gpu/big", Kind.MIG, "3g.40gb"),
        ("gpu/whole", Kind.WHOLE, ""),
    ]


def test_a_v1beta1_request_without_exactly_is_read_too() -> None:
    (ask,) = claim_asks(claim({"name": "g", "deviceClassName": "gpu.nvidia.com", "count": 3}), CLASSES)
    assert ask.alternatives[0].count == 3


@pytest.mark.parametrize(
    ("request_body", "why"),
    [
        ({"name": "g", "exactly": {"deviceClassName": "nope"}}, "is not known"),
        ({"name": "g", "exactly": {"deviceClassName": "other.example.com"}}, "not one gpupack reads"),
        ({"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}}, "allocationMode"),
        ({"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "adminAccess": True}}, "adminAccess"),
        ({"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 0}}, "positive"),
        ({"name": "g", "exactly": {"deviceClassName": "mig.nvidia.com"}}, "any profile"),
        (
            {"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": [profile("1g.10gb")]}},
            "profile on a full GPU",
        ),
        (
            {
                "name": "g",
                "exactly": {
                    "deviceClassName": "mig.nvidia.com",
                    "selectors": [
                        {"cel": {"expression": "device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('1'))"}}
                    ],
                },
            },
            "not one gpupack reads",
        ),
        (
            {
                "name": "g",
                "exactly": {
                    "deviceClassName": "mig.nvidia.com",
                    "selectors": [profile("1g.10gb"), profile("2g.20gb")],
                },
            },
            "not one gpupack reads",  # two profiles: no device matches both; kube-scheduler says so
        ),
    ],
)
def test_what_gpupack_does_not_read_is_left_to_kube_scheduler_with_why(request_body: JsonObject, why: str) -> None:
    with pytest.raises(NotOurs, match=why):
        claim_asks(claim(request_body), CLASSES)


def test_constraints_between_requests_are_left_to_kube_scheduler() -> None:
    body = claim({"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com"}}, constraints=[{"matchAttribute": "x"}])
    with pytest.raises(NotOurs, match="constraints"):
        claim_asks(body, CLASSES)


def test_the_allocation_names_devices_configs_and_the_node_as_kube_scheduler_writes_them() -> None:
    classes = {"gpu.nvidia.com": {"config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {"a": 1}}}]}}
    body = claim(
        {"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}},
        config=[{"requests": ["g"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {"b": 2}}}],
    )
    chosen = [ChosenDevice("g", "gpu.nvidia.com", "n1", "gpu-0"), ChosenDevice("g", "gpu.nvidia.com", "n1", "gpu-3")]
    written = allocated(body, chosen, "n1", classes)
    devices = written["status"]["allocation"]["devices"]
    assert [r["device"] for r in devices["results"]] == ["gpu-0", "gpu-3"]
    assert {r["pool"] for r in devices["results"]} == {"n1"}
    assert [c["source"] for c in devices["config"]] == ["FromClass", "FromClaim"]
    assert devices["config"][0]["requests"] == ["g"]
    assert allocation_node(written) == "n1" and allocation_node(body) is None
    protected = with_finalizer(body)
    assert protected is not None and protected["metadata"]["finalizers"] == [FINALIZER]
    assert with_finalizer(protected) is None and "finalizers" not in body["metadata"]


def node(labels: dict[str, str] | None = None, taints: list[JsonObject] | None = None) -> JsonObject:
    return {"metadata": {"name": "n1", "labels": labels or {}}, "spec": {"taints": taints or []}}


def pod(**spec: Any) -> JsonObject:
    return {"metadata": {"name": "p"}, "spec": spec}


def test_node_selector_affinity_and_taints_decide_whether_a_pod_may_use_a_node() -> None:
    gpu = node({"zone": "a", "gpu": "h100"}, [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists"}
    assert why_not(pod(tolerations=[toleration]), gpu) is None
    assert "untolerated taint" in (why_not(pod(), gpu) or "")
    assert why_not(pod(), node(taints=[{"key": "x", "effect": "PreferNoSchedule"}])) is None
    assert "node selector" in (why_not(pod(nodeSelector={"zone": "b"}, tolerations=[toleration]), gpu) or "")
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
                ]
            }
        }
    }
    assert why_not(pod(affinity=affinity, tolerations=[toleration]), gpu) is None  # the second term matches
    affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"].pop()
    assert "affinity" in (why_not(pod(affinity=affinity, tolerations=[toleration]), gpu) or "")
    cordoned = node()
    cordoned["spec"]["unschedulable"] = True
    assert why_not(pod(), cordoned) == "node is cordoned"
