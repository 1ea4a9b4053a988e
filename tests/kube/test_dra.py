"""kube/dra (#30 item 1): ResourceSlices, ResourceClaims and DeviceClasses as NVIDIA's DRA driver and
kube-scheduler write them, read into NodeFacts fields and allocated devices; garbage named, never a crash."""

from __future__ import annotations

import copy

import pytest

from gpupack.kube.dra import (
    DRIVER,
    DraError,
    DraGpus,
    dra_node_facts,
    extended_claim_of_pod,
    gpus_of_node,
    read_claim,
    read_device_class,
    read_slice,
)
from gpupack.kube.node_facts import NodeFactsError
from gpupack.kube.objects import make_node, make_pod
from gpupack.scoring.facts import GpuSlot, MigMode
from tests.kube.dra_bodies import (
    claim,
    device_class,
    gpu_device,
    gpu_uuid,
    h100_dynamic,
    h100_full,
    mig_device,
    mig_name,
    resource_slice,
    served_by,
)


def gpus(node: str, *slices: dict) -> DraGpus | None:
    """The node's GPUs from raw slices."""
    return gpus_of_node(node, [read_slice(s) for s in slices])


# --- full GPUs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
def test_full_h100s_in_every_served_version(version: str) -> None:
    read = gpus_of_node("n1", [read_slice(h100_full("n1", version=version))])
    assert read is not None
    assert (read.product, read.count, read.memory_mib, read.mig_mode) == (
        "NVIDIA-H100-80GB-HBM3",
        8,
        81559,
        MigMode.NONE,
    )
    assert read.slots[DRIVER, "n1", "gpu-3"] == GpuSlot(3)
    assert read.uuids[3] == gpu_uuid("n1", 3)
    assert read.ids == tuple(range(8))


def test_a_v1beta1_device_nests_its_fields_under_basic() -> None:
    body = h100_full("n1", gpus=1, version="v1beta1")
    assert "basic" in body["spec"]["devices"][0]
    device = read_slice(body).devices[0]
    assert (device.type, device.product, device.memory_bytes) == ("gpu", "NVIDIA H100 80GB HBM3", 85_520_809_984)


def test_qualified_attribute_names_read_as_bare_ones() -> None:
    body = h100_full("n1", gpus=1)
    device = body["spec"]["devices"][0]
    device["attributes"] = {f"{DRIVER}/{k}": v for k, v in device["attributes"].items()}
    assert read_slice(body).devices[0].uuid == gpu_uuid("n1", 0)


def test_gpu_ids_prefer_the_index_attribute_and_are_numbered_densely() -> None:
    devices = [gpu_device("n1", 1, index=True), gpu_device("n1", 5)]
    devices[0]["attributes"]["index"] = {"int": 2}  # NVML's index differs from the minor
    read = gpus("n1", resource_slice("s", "n1", devices))
    assert read is not None
    assert read.ids == (2, 5)
    assert read.slots[DRIVER, "n1", "gpu-1"] == GpuSlot(0)
    assert read.slots[DRIVER, "n1", "gpu-5"] == GpuSlot(1)


def test_only_the_newest_generation_of_a_pool_and_only_this_node_count() -> None:
    old = h100_full("n1", gpus=8, generation=1)
    new = resource_slice("n1-gpu-2", "n1", [gpu_device("n1", i) for i in range(4)], generation=2)
    other = h100_full("n2")
    read = gpus("n1", old, new, other)
    assert read is not None and read.count == 4


def test_a_node_without_gpu_slices_is_not_a_dra_node() -> None:
    other_driver = h100_full("n1")
    other_driver["spec"]["driver"] = "dra.example.com"
    assert gpus("n1", other_driver) is None
    assert gpus("n1") is None


def test_taints_that_block_scheduling_mark_their_device() -> None:
    devices = [gpu_device("n1", 0, taint="NoSchedule"), gpu_device("n1", 1, taint="PreferNoSchedule")]
    read = gpus("n1", resource_slice("s", "n1", devices))
    assert read is not None and read.tainted == {(DRIVER, "n1", "gpu-0")}


# --- MIG ------------------------------------------------------------------------------------------


def test_static_mig_instances_sit_where_their_names_say() -> None:
    devices = [
        mig_device("n1", 0, "4g.40gb", 0),
        mig_device("n1", 0, "3g.40gb", 4),
        mig_device("n1", 1, "1g.10gb+me", 0),
        gpu_device("n1", 2),
    ]
    read = gpus("n1", resource_slice("s", "n1", devices))
    assert read is not None
    assert read.mig_mode == MigMode.STATIC and read.count == 3
    assert read.layout == {0: (("4g.40gb", 0), ("3g.40gb", 4)), 1: (("1g.10gb+me", 0),)}
    assert read.slots[DRIVER, "n1", mig_name(0, "3g.40gb", 4)] == GpuSlot(0, mig="3g.40gb", start=4)
    assert read.slots[DRIVER, "n1", "gpu-2"] == GpuSlot(2)
    assert read.uuids[0] == gpu_uuid("n1", 0)  # from the instances' parentUUID


def test_static_mig_starts_from_memory_slice_capacities_or_synthesized() -> None:
    named = mig_device("n1", 0, "3g.40gb", 4)
    named["name"] = "gpu-0-mig-a"  # an older driver's name: the start comes from its memorySlice capacities
    bare = mig_device("n1", 1, "3g.40gb", 4)
    bare["name"], bare["attributes"]["parentIndex"] = "mig-b", {"int": 1}
    bare["capacity"] = {"memory": {"value": "40Gi"}}  # nothing says where it sits: gpupack places it
    read = gpus("n1", resource_slice("s", "n1", [named, bare]))
    assert read is not None
    assert read.layout == {0: (("3g.40gb", 4),), 1: (("3g.40gb", 0),)}


def test_dynamic_mig_publishes_every_profile_and_placement() -> None:
    read = gpus("n1", *h100_dynamic("n1", gpus=2))
    assert read is not None
    assert (read.mig_mode, read.count, read.layout) == (MigMode.DYNAMIC, 2, {})
    assert read.slots[DRIVER, "n1", mig_name(1, "2g.20gb", 4)] == GpuSlot(1, mig="2g.20gb", start=4)
    assert read.slots[DRIVER, "n1", "gpu-0"] == GpuSlot(0)
    assert len(read.slots) == 2 * (1 + 7 + 3 + 2 + 1)


def test_dra_node_facts_take_the_gpus_from_the_slices() -> None:
    node = make_node("n1", product=None, cpu="96", memory="1Ti", annotations={"gpupack.io/mig": "bogus"})
    read = gpus("n1", *h100_dynamic("n1", gpus=2))
    assert read is not None
    facts = dra_node_facts(node, read)
    assert (facts.gpu_product, facts.gpu_count, facts.mig_mode, facts.cpu_milli) == (
        "NVIDIA-H100-80GB-HBM3", 2, MigMode.DYNAMIC, 96_000,
    )  # fmt: skip


def test_dra_node_facts_check_the_topology_against_the_slices() -> None:
    topology = '{"nvlink": [[0, 18], [18, 0]]}'
    node = make_node("n1", product=None, annotations={"gpupack.io/gpu-topology": topology})
    read = gpus("n1", h100_full("n1", gpus=2))
    assert read is not None
    assert dra_node_facts(node, read).nvlink == ((0, 18), (18, 0))
    four = gpus("n1", h100_full("n1", gpus=4))
    assert four is not None
    with pytest.raises(NodeFactsError, match=r"node n1: gpupack\.io/gpu-topology: nvlink must be a 4x4"):
        dra_node_facts(node, four)


# --- what gpupack cannot map: the node is unusable, with the reason -----------------------------


def test_two_products_on_one_node_are_an_error() -> None:
    devices = [gpu_device("n1", 0), gpu_device("n1", 1, product="NVIDIA A100-SXM4-80GB")]
    with pytest.raises(NodeFactsError, match="node n1: ResourceSlices: GPUs of more than one product"):
        gpus("n1", resource_slice("s", "n1", devices))


def test_mig_on_a_product_without_geometry_is_an_error() -> None:
    device = mig_device("n1", 0, "3g.40gb", 0)
    device["attributes"]["productName"] = {"string": "NVIDIA L4"}
    with pytest.raises(NodeFactsError, match="MIG devices on 'NVIDIA-L4'"):
        gpus("n1", resource_slice("s", "n1", [device]))


def test_overlapping_static_instances_are_an_error() -> None:
    devices = [mig_device("n1", 0, "4g.40gb", 0), mig_device("n1", 0, "3g.40gb", 0)]
    with pytest.raises(NodeFactsError, match="node n1: ResourceSlices: static MIG devices"):
        gpus("n1", resource_slice("s", "n1", devices))


def test_more_than_sixteen_gpus_are_an_error() -> None:
    with pytest.raises(NodeFactsError, match="17 GPUs"):
        gpus("n1", h100_full("n1", gpus=17))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.pop("metadata"), r"ResourceSlice <unnamed>: metadata\.name: missing"),
        (lambda s: s["spec"].pop("driver"), r"ResourceSlice s: spec\.driver: must be a non-empty string"),
        (lambda s: s["spec"]["pool"].pop("name"), r"spec\.pool\.name: must be a non-empty string"),
        (lambda s: s["spec"]["pool"].update(generation="1"), r"spec\.pool\.generation: '1' is not an integer"),
        (lambda s: s["spec"].update(devices={}), r"spec\.devices: must be a list of objects"),
        (
            lambda s: s["spec"]["devices"][0]["attributes"].update(uuid={"string": "x", "int": 1}),
            r"spec\.devices\[0\]\.attributes\.uuid: must hold exactly one of",
        ),
        (
            lambda s: s["spec"]["devices"][0]["attributes"].update(productName={"int": 1}),
            r"spec\.devices\[0\]\.attributes\.productName: 1 is not a string",
        ),
        (
            lambda s: s["spec"]["devices"][0]["capacity"].update(memory={"value": "lots"}),
            r"spec\.devices\[0\]\.capacity\.memory: ",
        ),
        (
            lambda s: s["spec"]["devices"][0].update(name="first"),
            r"spec\.devices\[0\]\.attributes: first: no index attribute",
        ),
    ],
)
def test_a_bad_slice_names_the_slice_and_the_field(change: object, message: str) -> None:
    body = resource_slice("s", "n1", [gpu_device("n1", 0)])
    change(body)  # type: ignore[operator]
    with pytest.raises(DraError, match=message):
        read_slice(body)


# --- claims, classes, pods -----------------------------------------------------------------------


@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
def test_a_claim_names_its_devices_and_its_pods(version: str) -> None:
    read = read_claim(claim("train", [("n1", "gpu-0"), ("n1", "gpu-1")], pods=["uid-ml-a"], version=version))
    assert read.key == "ml/train" and read.allocated
    assert [(d.driver, d.pool, d.device) for d in read.devices] == [(DRIVER, "n1", "gpu-0"), (DRIVER, "n1", "gpu-1")]
    assert read.reserved_for == ("uid-ml-a",)
    assert not read.extended
    assert read_claim(claim("x", [("n1", "gpu-0")], extended=True)).extended
    assert not read_claim(claim("pending")).allocated


def test_a_bad_claim_names_the_claim_and_the_field() -> None:
    body = claim("train", [("n1", "gpu-0")])
    del body["status"]["allocation"]["devices"]["results"][0]["pool"]
    with pytest.raises(DraError, match=r"ResourceClaim ml/train: status\.allocation\.devices\.results\[0\]\.pool"):
        read_claim(body)
    body = claim("train")
    body["status"] = []
    with pytest.raises(DraError, match=r"ResourceClaim ml/train: status: must be an object"):
        read_claim(body)


def test_device_classes_and_the_claim_that_serves_a_pod() -> None:
    assert read_device_class(device_class()) == ("gpu.nvidia.com", "nvidia.com/gpu")
    assert read_device_class(device_class("mig.nvidia.com", None)) == ("mig.nvidia.com", "")
    bad = device_class()
    bad["spec"]["extendedResourceName"] = 3
    with pytest.raises(DraError, match=r"DeviceClass gpu.nvidia.com: spec\.extendedResourceName"):
        read_device_class(bad)
    pod = make_pod("a", namespace="ml", requests={"nvidia.com/gpu": 1}, node="n1")
    assert extended_claim_of_pod(pod) is None
    assert extended_claim_of_pod(served_by(copy.deepcopy(pod), "a-extended-resources-x7k2p")) == (
        "ml/a-extended-resources-x7k2p"
    )


@pytest.mark.parametrize(
    ("name", "start"),
    [
        ("gpu-0-mig-3g40gb-9-4", 4),  # the current driver: profile, GI profile id, start
        ("gpu-0-mig-1g10gb-me-20-6", 6),
        ("gpu-0-mig-9-4-4", 4),  # an earlier release: GI profile id, start, size
        ("gpu-0-mig-19-6-1", 6),
        ("gpu-0-mig-7", None),  # the oldest: no placement in the name
    ],
)
def test_a_mig_start_from_the_name_alone(name: str, start: int | None) -> None:
    device = mig_device("n1", 0, "3g.40gb", 0)
    device["name"] = name
    device["capacity"] = {"memory": {"value": "40Gi"}}
    assert read_slice(resource_slice("s", "n1", [device])).devices[0].start == start
