"""The Node and Pod builders make objects that gpupack's own readers take back as asked (kube/objects.py)."""

from __future__ import annotations

import pytest
from kubernetes import client

from gpupack.kube.node_facts import facts_from_node
from gpupack.kube.objects import make_node, make_pod
from gpupack.kube.pod_request import request_from_pod
from gpupack.kube.pods import pod_is_terminal, pod_key, pod_uid
from gpupack.kube.sources.events import resource_version
from gpupack.scoring.facts import MigMode
from gpupack.scoring.request import Kind

L4 = "NVIDIA-L4"


def test_a_default_node_is_an_on_label_h100_node_with_eight_gpus() -> None:
    obj = make_node("n1")
    facts = facts_from_node(obj)
    assert (facts.name, facts.gpu_product, facts.gpu_count) == ("n1", "NVIDIA-H100-80GB-HBM3", 8)
    assert (facts.cpu_milli, facts.memory_bytes, facts.pods) == (192_000, 2 << 40, 110)
    assert (facts.mig_mode, facts.spot) == (MigMode.NONE, False)
    assert obj["metadata"]["labels"]["nvidia.com/gpu.count"] == "8"
    assert obj["status"]["capacity"] == obj["status"]["allocatable"]
    assert obj["metadata"]["uid"] == "uid-n1"
    assert resource_version(obj) is None


def test_node_options_reach_the_facts() -> None:
    obj = make_node(
        "l4-1",
        gpus=4,
        product=L4,
        cpu="48",
        memory="192Gi",
        spot=True,
        labels={"node.kubernetes.io/instance-type": "g6.12xlarge"},
        annotations={"gpupack.io/hourly-cost": "1.5"},
        uid="u-7",
        resource_version="42",
    )
    facts = facts_from_node(obj)
    assert (facts.gpu_product, facts.gpu_count, facts.cpu_milli, facts.memory_bytes) == (L4, 4, 48_000, 192 << 30)
    assert facts.spot and facts.hourly_cost == 1.5
    assert facts.labels["node.kubernetes.io/instance-type"] == "g6.12xlarge"
    assert (obj["metadata"]["uid"], resource_version(obj)) == ("u-7", "42")
    assert make_node("od", spot=False)["metadata"]["labels"]["karpenter.sh/capacity-type"] == "on-demand"


def test_none_removes_a_default_label_or_resource() -> None:
    obj = make_node("n1", labels={"nvidia.com/gpu.count": None}, allocatable={"pods": None, "nvidia.com/gpu": "2"})
    assert "nvidia.com/gpu.count" not in obj["metadata"]["labels"]
    assert "pods" not in obj["status"]["allocatable"]
    assert facts_from_node(obj).gpu_count == 2


def test_allocatable_mig_instances_make_a_static_mig_node() -> None:
    allocatable = {"nvidia.com/gpu": 6, "nvidia.com/mig-1g.10gb": 7}
    obj = make_node("a100", product="NVIDIA-A100-SXM4-80GB", allocatable=allocatable)
    facts = facts_from_node(obj)
    assert facts.mig_mode == MigMode.STATIC and facts.gpu_count == 8
    assert len(facts.mig_layout[0]) == 7


def test_a_node_without_product_has_no_gpus() -> None:
    obj = make_node("cpu-1", product=None)
    assert "nvidia.com/gpu" not in obj["status"]["allocatable"]
    assert obj["metadata"]["labels"] == {}
    assert facts_from_node(obj).gpu_count == 0


def test_a_default_pod_is_pending_for_gpupack_asking_for_cpu_only() -> None:
    obj = make_pod("p")
    assert (pod_key(obj), pod_uid(obj)) == ("default/p", "uid-default-p")
    assert obj["spec"]["schedulerName"] == "gpupack" and "nodeName" not in obj["spec"]
    assert "annotations" not in obj["metadata"]
    assert obj["status"]["phase"] == "Pending"
    request = request_from_pod(obj)
    assert (request.kind, request.cpu_milli, request.memory_bytes) == (Kind.NONE, 1000, 1 << 30)


def test_pod_requests_become_limits_and_requests() -> None:
    obj = make_pod("train", namespace="ml", requests={"nvidia.com/gpu": 2, "cpu": "4", "memory": "16Gi"}, node="n1")
    (container,) = obj["spec"]["containers"]
    assert container["name"] == "main"
    assert container["resources"]["limits"] == container["resources"]["requests"] == {
        "nvidia.com/gpu": "2",
        "cpu": "4",
        "memory": "16Gi",
    }
    assert (obj["spec"]["nodeName"], obj["status"]["phase"]) == ("n1", "Running")
    request = request_from_pod(obj)
    assert (request.kind, request.gpus, request.cpu_milli) == (Kind.WHOLE, 2, 4000)


def test_several_containers_and_init_containers() -> None:
    obj = make_pod(
        "multi",
        containers=[{"nvidia.com/gpu": 1}, {"nvidia.com/gpu": 2}],
        init_containers=[{"nvidia.com/gpu": 1}],
        scheduler=None,
        created="2026-01-01T00:00:00Z",
        phase="Succeeded",
        node="n1",
    )
    assert [c["name"] for c in obj["spec"]["containers"]] == ["c0", "c1"]
    assert [c["name"] for c in obj["spec"]["initContainers"]] == ["init0"]
    assert "schedulerName" not in obj["spec"]
    assert obj["metadata"]["creationTimestamp"] == "2026-01-01T00:00:00Z"
    assert pod_is_terminal(obj)
    assert request_from_pod(obj).gpus == 3  # the containers' sum; the init container runs before them


def test_requests_and_containers_together_are_refused() -> None:
    with pytest.raises(ValueError, match="not both"):
        make_pod("p", requests={"cpu": "1"}, containers=[{"cpu": "1"}])


def test_a_node_is_what_the_official_clients_model_sends() -> None:
    """Every key is one the API defines, spelled as the server sends it (camelCase)."""
    resources = {"cpu": "192", "memory": "2Ti", "pods": "110", "nvidia.com/gpu": "8"}
    model = client.V1Node(
        api_version="v1",
        kind="Node",
        metadata=client.V1ObjectMeta(
            name="n1",
            uid="uid-n1",
            resource_version="3",
            labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"},
            annotations={"gpupack.io/mig": "dynamic"},
        ),
        spec=client.V1NodeSpec(),
        status=client.V1NodeStatus(allocatable=resources, capacity=resources),
    )
    obj = make_node("n1", annotations={"gpupack.io/mig": "dynamic"}, resource_version="3")
    assert client.ApiClient().sanitize_for_serialization(model) == obj


def test_a_pod_is_what_the_official_clients_model_sends() -> None:
    asks = {"nvidia.com/gpu": "1"}
    resources = client.V1ResourceRequirements(limits=asks, requests=asks)
    model = client.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=client.V1ObjectMeta(name="p", namespace="ml", uid="uid-ml-p", resource_version="9"),
        spec=client.V1PodSpec(
            scheduler_name="gpupack",
            node_name="n1",
            containers=[client.V1Container(name="main", image="x", resources=resources)],
        ),
        status=client.V1PodStatus(phase="Running"),
    )
    obj = make_pod("p", namespace="ml", requests=asks, node="n1", resource_version="9")
    assert client.ApiClient().sanitize_for_serialization(model) == obj
