"""PodRequest and assignments from v1.Pod dicts (docs/contracts.md#pod-resources, #assignment)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpupack.kube.pod_request import (
    AssignmentError,
    allowed_products,
    assignment_from_pod,
    request_from_pod,
)
from gpupack.kube.pods import pod_key, pod_uid
from gpupack.scoring.facts import GpuSlot, Placement
from gpupack.scoring.request import Kind, RequestError
from tests.wire_captures import args_files, load

GI = 2**30
PRODUCT = "nvidia.com/gpu.product"


def container(name: str = "main", limits: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """A container with the given limits (and `requests=` if passed)."""
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if "requests" in extra:
        resources["requests"] = extra.pop("requests")
    return {"name": name, "image": "x", "resources": resources, **extra}


def pod(
    *containers: dict[str, Any], annotations: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    """A pod with the given containers; keyword arguments go into spec."""
    metadata: dict[str, Any] = {"name": "p", "namespace": "team", "uid": "u-1"}
    if annotations is not None:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": {"containers": list(containers), **spec}}


def gpu_pod(**spec: Any) -> dict[str, Any]:
    return pod(container(limits={"nvidia.com/gpu": "1"}), **spec)


# ----------------------------------------------------------------- captured pods


@pytest.mark.parametrize("path", args_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_captured_pod_converts(path: Path) -> None:
    body = load(path)
    request = request_from_pod(body["Pod"])
    assert request.cpu_milli == 1000
    assert request.memory_bytes == GI
    assert request.allowed_products is None
    assert not request.interruptible
    name = body["Pod"]["metadata"]["name"]
    if name.startswith("mig"):
        assert (request.kind, request.mig) == (Kind.MIG, (("1g.10gb", 1),))
    else:
        assert (request.kind, request.gpus) == (Kind.WHOLE, 4 if name.startswith("gpu4") else 1)
    assert pod_key(body["Pod"]) == f"default/{name}"
    assert pod_uid(body["Pod"]) == body["Pod"]["metadata"]["uid"]


# ----------------------------------------------------------------- resources


def test_limits_and_requests() -> None:
    request = request_from_pod(
        pod(
            container(
                limits={"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "2"},
                requests={"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": "2"},
            )
        )
    )
    # cpu and memory: requests are what the scheduler reserves; GPUs: limits
    assert (request.cpu_milli, request.memory_bytes, request.gpus) == (500, GI, 2)


def test_missing_request_falls_back_to_limit_and_vice_versa() -> None:
    request = request_from_pod(
        pod(
            container("a", limits={"cpu": "2", "memory": "1Gi"}),
            container("b", requests={"cpu": "1", "nvidia.com/gpu": "3"}),
        )
    )
    assert (request.cpu_milli, request.memory_bytes, request.kind, request.gpus) == (3000, GI, Kind.WHOLE, 3)


def test_containers_are_summed() -> None:
    request = request_from_pod(
        pod(
            container("a", limits={"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}),
            container("b", limits={"cpu": "250m", "memory": "512Mi", "nvidia.com/gpu": "2"}),
        )
    )
    assert (request.cpu_milli, request.memory_bytes, request.gpus) == (1250, GI + GI // 2, 3)


def test_init_containers_follow_the_max_rule_per_resource() -> None:
    spec_pod = pod(
        container("a", limits={"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": "1"}),
        container("b", limits={"cpu": "1", "memory": "1Gi"}),
        initContainers=[
            container("init-cpu", limits={"cpu": "3", "memory": "1Gi"}),
            container("init-gpu", limits={"cpu": "1", "nvidia.com/gpu": "2"}),
        ],
    )
    request = request_from_pod(spec_pod)
    assert request.cpu_milli == 3000  # the largest init container beats the sum of 2
    assert request.memory_bytes == 3 * GI  # the sum beats every init container
    assert request.gpus == 2  # the GPU init container needs 2 at once


def test_sidecar_init_containers_add_to_everything_after_them() -> None:
    request = request_from_pod(
        pod(
            container("main", limits={"cpu": "1", "nvidia.com/gpu": "1"}),
            initContainers=[
                container("sidecar", limits={"cpu": "500m"}, restartPolicy="Always"),
                container("setup", limits={"cpu": "2"}),
            ],
        )
    )
    assert request.cpu_milli == 2500  # setup runs beside the sidecar: 2 + 0.5 > 1 + 0.5


def test_overhead_adds_cpu_and_memory() -> None:
    request = request_from_pod(
        pod(
            container(limits={"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}),
            overhead={"cpu": "250m", "memory": "120Mi"},
        )
    )
    assert (request.cpu_milli, request.memory_bytes) == (1250, GI + 120 * 2**20)


def test_other_resources_are_ignored() -> None:
    request = request_from_pod(
        pod(
            container(limits={"ephemeral-storage": "garbage", "example.com/fpga": "1", "nvidia.com/gpu": "1"})
        )
    )
    assert request.gpus == 1


def test_share_and_mig_kinds() -> None:
    share = request_from_pod(pod(container(limits={"gpupack.io/gpu-milli": "250"})))
    assert (share.kind, share.milli) == (Kind.SHARE, 250)
    mig = request_from_pod(
        pod(
            container("a", limits={"nvidia.com/mig-3g.40gb": "1", "nvidia.com/mig-1g.10gb": "2"}),
            container("b", limits={"nvidia.com/mig-1g.10gb": "1", "nvidia.com/mig-2g.20gb": "0"}),
        )
    )
    assert mig.kind == Kind.MIG
    assert mig.mig == (("1g.10gb", 3), ("3g.40gb", 1))


def test_media_extension_profiles_are_requested_as_dot_me() -> None:
    """Resource names spell `+me` as `.me` (docs/contracts.md#mig-geometry); gpupack keeps nvidia-smi's name inside."""
    mig = request_from_pod(pod(container(limits={"nvidia.com/mig-1g.10gb.me": "1", "nvidia.com/mig-3g.40gb": "1"})))
    assert mig.mig == (("1g.10gb+me", 1), ("3g.40gb", 1))
    with pytest.raises(RequestError, match=r"cannot hold '\+'; ask for nvidia.com/mig-1g.10gb.me"):
        request_from_pod(pod(container(limits={"nvidia.com/mig-1g.10gb+me": "1"})))
    with pytest.raises(RequestError, match=r"MIG profile '1g\.10gb\.mx' exists on no GPU"):
        request_from_pod(pod(container(limits={"nvidia.com/mig-1g.10gb.mx": "1"})))


def test_no_gpu_is_kind_none() -> None:
    request = request_from_pod(pod(container(limits={"cpu": "1"})))
    assert (request.kind, request.gpus, request.mig) == (Kind.NONE, 0, ())


def test_mixed_kinds_are_rejected() -> None:
    with pytest.raises(RequestError, match="mixes GPU request kinds"):
        request_from_pod(
            pod(
                container("a", limits={"nvidia.com/gpu": "1"}),
                container("b", limits={"nvidia.com/mig-1g.10gb": "1"}),
            )
        )


def test_fractional_gpu_names_container_and_resource() -> None:
    with pytest.raises(RequestError, match=r'container "trainer" nvidia.com/gpu: .*1\.5.*whole number'):
        request_from_pod(pod(container("trainer", limits={"nvidia.com/gpu": "1.5"})))


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        ({"cpu": "lots"}, r'container "main" cpu: invalid quantity \'lots\''),
        ({"memory": "-1Gi"}, r'container "main" memory: .*negative'),
        ({"gpupack.io/gpu-milli": "0.5"}, r"gpupack.io/gpu-milli: .*whole number"),
        ({"gpupack.io/gpu-milli": "1000"}, r"gpu-milli: 1000 is out of range 1..999"),
        ({"nvidia.com/gpu": "17"}, r"out of range 1..16"),
        ({"nvidia.com/mig-9g.99gb": "1"}, r"MIG profile '9g.99gb' exists on no GPU"),
        ({"cpu": 1e300}, r"cpu: .*absurdly large|cpu: .*exponent"),
    ],
)
def test_bad_resources(resources: dict[str, Any], message: str) -> None:
    with pytest.raises(RequestError, match=message):
        request_from_pod(pod(container(limits=resources)))


def test_bad_init_container_is_named() -> None:
    with pytest.raises(RequestError, match=r'init container "setup" nvidia.com/gpu'):
        request_from_pod(
            pod(container(), initContainers=[container("setup", limits={"nvidia.com/gpu": "x"})])
        )


@pytest.mark.parametrize("spec", [{"containers": "nope"}, {"containers": [], "overhead": []}])
def test_malformed_spec(spec: dict[str, Any]) -> None:
    with pytest.raises(RequestError, match="spec"):
        request_from_pod({"metadata": {"name": "p"}, "spec": spec})


# ----------------------------------------------------------------- preferences


@pytest.mark.parametrize(
    ("value", "expected"), [("true", True), ("True", True), ("TRUE", True), ("yes", False)]
)
def test_interruptible(value: str, expected: bool) -> None:
    request = request_from_pod(
        pod(container(limits={"nvidia.com/gpu": "1"}), annotations={"gpupack.io/interruptible": value})
    )
    assert request.interruptible is expected


def required(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    """A required node affinity with the given terms (each a list of match expressions)."""
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": term} for term in terms]
            }
        }
    }


def expr(operator: str, *values: str, key: str = PRODUCT) -> dict[str, Any]:
    return (
        {"key": key, "operator": operator, "values": list(values)}
        if values
        else {"key": key, "operator": operator}
    )


H100, A100, A30 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "NVIDIA-A30"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, None),
        ({"nodeSelector": {PRODUCT: H100}}, {H100}),
        ({"nodeSelector": {"other": "x"}}, None),
        ({"affinity": required([expr("In", H100, A100)])}, {H100, A100}),
        ({"affinity": required([expr("In", H100, A100), expr("In", A100, A30)])}, {A100}),  # ANDed
        ({"affinity": required([expr("In", H100)], [expr("In", A30)])}, {H100, A30}),  # ORed
        ({"affinity": required([expr("In", H100, A100), expr("NotIn", H100)])}, {A100}),
        ({"affinity": required([expr("In", H100, A100), expr("In", "x", key="zone")])}, {H100, A100}),
        # not expressible as a set: kube-scheduler enforces these itself
        ({"affinity": required([expr("NotIn", H100)])}, None),
        ({"affinity": required([expr("Exists")])}, None),
        ({"affinity": required([expr("In", H100)], [expr("In", "x", key="zone")])}, None),
        ({"nodeSelector": {PRODUCT: H100}, "affinity": required([expr("NotIn", A30)])}, {H100}),
        ({"nodeSelector": {PRODUCT: H100}, "affinity": required([expr("In", H100, A100)])}, {H100}),
    ],
)
def test_allowed_products(spec: dict[str, Any], expected: set[str] | None) -> None:
    products = allowed_products(spec)
    assert products == (None if expected is None else frozenset(expected))
    assert request_from_pod(gpu_pod(**spec)).allowed_products == products


def test_contradictory_product_constraint_is_rejected() -> None:
    with pytest.raises(RequestError, match="allows no product"):
        request_from_pod(gpu_pod(nodeSelector={PRODUCT: A30}, affinity=required([expr("In", H100)])))


def test_pod_key_defaults_namespace() -> None:
    assert pod_key({"metadata": {"name": "x"}}) == "default/x"
    assert pod_key(pod(container())) == "team/p"
    assert pod_uid({"metadata": {}}) == ""


# ----------------------------------------------------------------- assignments


def assigned(limits: dict[str, str], assignment: object, node_name: str | None = None) -> dict[str, Any]:
    text = assignment if isinstance(assignment, str) else json.dumps(assignment)
    result = pod(
        container(limits={"cpu": "2", "memory": "1Gi", **limits}), annotations={"gpupack.io/assignment": text}
    )
    if node_name:
        result["spec"]["nodeName"] = node_name
    return result


def test_no_assignment() -> None:
    assert assignment_from_pod(gpu_pod()) is None


@pytest.mark.parametrize(
    ("limits", "slots"),
    [
        ({"nvidia.com/gpu": "2"}, (GpuSlot(0), GpuSlot(5))),
        ({"gpupack.io/gpu-milli": "250"}, (GpuSlot(2, milli=250),)),
        (
            {"nvidia.com/mig-3g.40gb": "1", "nvidia.com/mig-1g.10gb": "1"},
            (GpuSlot(3, mig="3g.40gb", start=4), GpuSlot(1, mig="1g.10gb", start=6)),
        ),
        ({}, ()),
    ],
)
def test_assignment_round_trip(limits: dict[str, str], slots: tuple[GpuSlot, ...]) -> None:
    placement = Placement("gpu-node-7", slots, cpu_milli=2000, memory_bytes=GI)
    the_pod = assigned(limits, placement.to_assignment(), node_name="gpu-node-7")
    assert assignment_from_pod(the_pod) == placement
    assert assignment_from_pod(the_pod, request_from_pod(the_pod)) == placement


@pytest.mark.parametrize("spelling", ["1g.10gb+me", "1g.10gb.me"])
def test_assignment_accepts_both_media_extension_spellings(spelling: str) -> None:
    assignment = {"node": "n", "gpus": [{"index": 0, "mig": spelling, "start": 3}]}
    the_pod = assigned({"nvidia.com/mig-1g.10gb.me": "1"}, assignment, node_name="n")
    placement = assignment_from_pod(the_pod)
    assert placement is not None
    assert placement.slots == (GpuSlot(0, mig="1g.10gb+me", start=3),)
    assert placement.to_assignment()["gpus"] == [{"index": 0, "mig": "1g.10gb+me", "start": 3}]


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("{not json", "malformed JSON"),
        ("[]", 'exactly the keys "node" and "gpus"'),
        ({"node": "n", "gpus": [{"index": 0}], "extra": 1}, 'exactly the keys "node" and "gpus"'),
        ({"node": "", "gpus": [{"index": 0}]}, "node must be a non-empty string"),
        ({"node": 7, "gpus": [{"index": 0}]}, "node must be a non-empty string"),
        ({"node": "n", "gpus": {"index": 0}}, "gpus must be a list"),
        ({"node": "n", "gpus": [{"index": True}]}, r"gpus\[0\].index must be an integer in 0..15"),
        ({"node": "n", "gpus": [{"index": "0"}]}, r"gpus\[0\].index must be an integer"),
        ({"node": "n", "gpus": [{"index": 16}]}, r"gpus\[0\].index must be an integer in 0..15"),
        ({"node": "n", "gpus": [{"index": 0, "gpu": 1}]}, r"gpus\[0\]: expected"),
        ({"node": "n", "gpus": [{"index": 0, "mig": "1g.10gb"}]}, r"gpus\[0\]: expected"),
        ({"node": "n", "gpus": [{"index": 0}, {"index": 0}]}, "do not match the pod's request"),
        ({"node": "n", "gpus": [{"index": 0}]}, r"do not match the pod's request \(nvidia.com/gpu: 2\)"),
        ({"node": "n", "gpus": [{"index": 0}, {"index": 1, "milli": 5}]}, "do not match"),
        (
            {"node": "other", "gpus": [{"index": 0}, {"index": 1}]},
            "names node 'other' but the pod is bound to 'n'",
        ),
    ],
)
def test_bad_assignments(assignment: object, message: str) -> None:
    with pytest.raises(AssignmentError, match=message) as caught:
        assignment_from_pod(assigned({"nvidia.com/gpu": "2"}, assignment, node_name="n"))
    assert str(caught.value).startswith("pod team/p: gpupack.io/assignment: ")


@pytest.mark.parametrize(
    ("limits", "gpus"),
    [
        ({"gpupack.io/gpu-milli": "250"}, [{"index": 0, "milli": 500}]),
        ({"gpupack.io/gpu-milli": "250"}, [{"index": 0, "milli": 250}, {"index": 1, "milli": 250}]),
        ({"nvidia.com/mig-1g.10gb": "1"}, [{"index": 0, "mig": "2g.20gb", "start": 0}]),
        ({"nvidia.com/mig-1g.10gb": "1"}, [{"index": 0, "mig": "1g.10gb", "start": 9}]),
        ({}, [{"index": 0}]),
    ],
)
def test_assignment_must_match_request_kind(limits: dict[str, str], gpus: list[dict[str, Any]]) -> None:
    with pytest.raises(AssignmentError):
        assignment_from_pod(assigned(limits, {"node": "n", "gpus": gpus}))
