"""ResourceSlice, ResourceClaim and DeviceClass bodies in the shape NVIDIA's DRA driver (`gpu.nvidia.com`) and
kube-scheduler write them for H100 nodes: full GPUs, static MIG, DynamicMIG with shared counters (#30).

Written for gpupack's tests from the published API types and the driver's documented device model
(docs/dra.md); every value is made up.
"""

from __future__ import annotations

from typing import Any

from gpupack.kube.dra import DRIVER

JsonObject = dict[str, Any]
H100 = "NVIDIA H100 80GB HBM3"
H100_BYTES = 85_520_809_984  # 81559 MiB
GI_PROFILE_ID = {
    "1g.10gb": 19,
    "1g.10gb+me": 20,
    "1g.20gb": 15,
    "2g.20gb": 14,
    "3g.40gb": 9,
    "4g.40gb": 5,
    "7g.80gb": 0,
}
SLICES = {"1g.10gb": 1, "1g.10gb+me": 1, "1g.20gb": 2, "2g.20gb": 2, "3g.40gb": 4, "4g.40gb": 4, "7g.80gb": 8}
COMPUTE = {"1g.10gb": 1, "1g.10gb+me": 1, "1g.20gb": 1, "2g.20gb": 2, "3g.40gb": 3, "4g.40gb": 4, "7g.80gb": 7}


def gpu_uuid(node: str, minor: int) -> str:
    """A made-up GPU UUID, one per node and minor."""
    return f"GPU-{node}-0000-4000-8000-{minor:012d}"


def _common(product: str = H100) -> JsonObject:
    return {
        "productName": {"string": product},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "570.124.6"},
        "cudaDriverVersion": {"version": "12.8.0"},
    }


def gpu_device(
    node: str, minor: int, *, product: str = H100, counters: bool = False, index: bool = False, taint: str = ""
) -> JsonObject:
    """A full GPU, `gpu-<minor>`; `counters`: as DynamicMIG publishes it (it consumes its whole counter set);
    `index`: with the `index`/`minor` attributes older drivers published."""
    attributes = {"type": {"string": "gpu"}, "uuid": {"string": gpu_uuid(node, minor)}, **_common(product)}
    if index:
        attributes |= {"index": {"int": minor}, "minor": {"int": minor}}
    device: JsonObject = {
        "name": f"gpu-{minor}",
        "attributes": attributes,
        "capacity": {"memory": {"value": f"{H100_BYTES}"}},
    }
    if counters:
        device["consumesCounters"] = [
            {
                "counterSet": f"gpu-{minor}-counter-set",
                "counters": _counters("7g.80gb", 0) | {"memory": {"value": "80Gi"}},
            }
        ]
    if taint:
        device["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": taint}]
    return device


def _counters(profile: str, start: int) -> JsonObject:
    counters: JsonObject = {"multiprocessors": {"value": str(COMPUTE[profile] * 16)}}
    for i in range(start, start + SLICES[profile]):
        counters[f"memory-slice-{i}"] = {"value": "1"}
    return counters


def mig_name(minor: int, profile: str, start: int) -> str:
    """The driver's canonical MIG device name: `gpu-<minor>-mig-<profile>-<profile id>-<start>`."""
    spelled = profile.replace(".", "").replace("+", "-")
    return f"gpu-{minor}-mig-{spelled}-{GI_PROFILE_ID[profile]}-{start}"


def mig_device(node: str, minor: int, profile: str, start: int, *, dynamic: bool = False) -> JsonObject:
    """A MIG device: static (an instance that exists, with its UUID and memory slices as capacity) or
    DynamicMIG (a profile × placement that consumes its GPU's counters)."""
    attributes = {
        "type": {"string": "mig"},
        "profile": {"string": profile},
        "parentUUID": {"string": gpu_uuid(node, minor)},
        **_common(),
    }
    capacity: JsonObject = {"multiprocessors": {"value": str(COMPUTE[profile] * 16)}, "memory": {"value": "10Gi"}}
    device: JsonObject = {"name": mig_name(minor, profile, start), "attributes": attributes, "capacity": capacity}
    if dynamic:
        device["consumesCounters"] = [{"counterSet": f"gpu-{minor}-counter-set", "counters": _counters(profile, start)}]
    else:
        attributes["uuid"] = {"string": f"MIG-{minor}-{start}-{profile}"}
        capacity |= {f"memorySlice{i}": {"value": "1"} for i in range(start, start + SLICES[profile])}
    return device


def resource_slice(
    name: str,
    node: str,
    devices: list[JsonObject] | None = None,
    *,
    pool: str | None = None,
    generation: int = 1,
    count: int = 1,
    version: str = "v1",
    counter_sets: list[str] = (),  # type: ignore[assignment]
    rv: str = "1",
) -> JsonObject:
    """A ResourceSlice of `gpu.nvidia.com` for `node` in `version`'s shape (v1beta1: device fields under `basic`)."""
    spec: JsonObject = {
        "driver": DRIVER,
        "nodeName": node,
        "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": count},
    }
    if devices is not None:
        spec["devices"] = [_in_version(device, version) for device in devices]
    if counter_sets:
        spec["sharedCounters"] = [
            {"name": s, "counters": _counters("7g.80gb", 0) | {"memory": {"value": "80Gi"}}} for s in counter_sets
        ]
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceSlice",
        "metadata": {"name": name, "uid": f"uid-slice-{name}", "resourceVersion": rv},
        "spec": spec,
    }


def _in_version(device: JsonObject, version: str) -> JsonObject:
    if version != "v1beta1":
        return device
    return {"name": device["name"], "basic": {k: v for k, v in device.items() if k != "name"}}


def h100_full(node: str, gpus: int = 8, **kwargs: Any) -> JsonObject:
    """One slice with `gpus` full H100s, as the driver publishes a node with MIG off."""
    return resource_slice(f"{node}-gpu", node, [gpu_device(node, i) for i in range(gpus)], **kwargs)


# Every MIG profile of an H100 and its placements (start memory slices), as NVML lists them.
H100_PLACEMENTS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("1g.10gb", (0, 1, 2, 3, 4, 5, 6)),
    ("1g.20gb", (0, 2, 4, 6)),
    ("2g.20gb", (0, 2, 4)),
    ("3g.40gb", (0, 4)),
    ("4g.40gb", (0,)),
    ("7g.80gb", (0,)),
)
# What h100_dynamic publishes unless told otherwise (the unit tests' nodes).
DYNAMIC_PLACEMENTS = tuple((p, s) for p, s in H100_PLACEMENTS if p in ("1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"))


GPUS_PER_SLICE = 3  # DynamicMIG devices of at most this many GPUs in one slice (19 each, the API's limit 64)


def h100_dynamic(
    node: str, gpus: int = 2, placements: tuple[tuple[str, tuple[int, ...]], ...] = DYNAMIC_PLACEMENTS
) -> list[JsonObject]:
    """DynamicMIG: one slice of counter sets, then the devices (each full GPU and every profile × placement of
    `placements`; H100_PLACEMENTS for all of them), GPUS_PER_SLICE GPUs a slice: the API allows at most 64
    devices that consume counters in one slice, and an H100 publishes 19."""
    per_gpu = []
    for minor in range(gpus):
        devices = [gpu_device(node, minor, counters=True)]
        for profile, starts in placements:
            devices.extend(mig_device(node, minor, profile, start, dynamic=True) for start in starts)
        per_gpu.append(devices)
    groups = [per_gpu[i : i + GPUS_PER_SLICE] for i in range(0, gpus, GPUS_PER_SLICE)]
    count = 1 + len(groups)
    sets = [f"gpu-{minor}-counter-set" for minor in range(gpus)]
    return [
        resource_slice(f"{node}-counters", node, None, count=count, counter_sets=sets),
        *(
            resource_slice(f"{node}-devices" + (f"-{i}" if i else ""), node, [d for g in group for d in g], count=count)
            for i, group in enumerate(groups)
        ),
    ]


def claim(
    name: str,
    devices: list[tuple[str, str]] = (),  # type: ignore[assignment]
    *,
    namespace: str = "ml",
    pods: list[str] = (),  # type: ignore[assignment]
    extended: bool = False,
    version: str = "v1",
    rv: str = "1",
) -> JsonObject:
    """A ResourceClaim allocated `devices` ((pool, device) of gpu.nvidia.com), reserved for pods by uid."""
    metadata: JsonObject = {"name": name, "namespace": namespace, "uid": f"uid-claim-{name}", "resourceVersion": rv}
    if extended:
        metadata["annotations"] = {"resource.kubernetes.io/extended-resource-claim": "true"}
    status: JsonObject = {}
    if devices:
        results = [
            {"request": "gpu" if not extended else "container-0-request-0", "driver": DRIVER, "pool": p, "device": d}
            for p, d in devices
        ]
        status["allocation"] = {"devices": {"results": results}}
    if pods:
        status["reservedFor"] = [{"resource": "pods", "name": uid.removeprefix("uid-"), "uid": uid} for uid in pods]
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": max(1, len(devices))}}
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": {"devices": {"requests": [request]}},
        "status": status,
    }


def device_class(name: str = "gpu.nvidia.com", extended: str | None = "nvidia.com/gpu") -> JsonObject:
    """A DeviceClass of the driver's GPUs; `extended`: the extended resource it backs (KEP-5004)."""
    spec: JsonObject = {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}
    if extended:
        spec["extendedResourceName"] = extended
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name, "uid": f"uid-class-{name}", "resourceVersion": "1"},
        "spec": spec,
    }


def served_by(pod: JsonObject, claim_name: str) -> JsonObject:
    """The pod with the status kube-scheduler writes when a claim serves its extended resources (KEP-5004)."""
    mapping = {"containerName": "main", "resourceName": "nvidia.com/gpu", "requestName": "container-0-request-0"}
    pod.setdefault("status", {})["extendedResourceClaimStatus"] = {
        "resourceClaimName": claim_name,
        "requestMappings": [mapping],
    }
    return pod
