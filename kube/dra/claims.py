"""ResourceClaims (what is allocated, to whom), DeviceClasses (which extended resource they back) and the
claim a pod's extended resources were served by (KEP-5004), read from raw objects of any served version."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupack.kube.dra.objects import DraError, mapping, object_ref, objects, string

# set by kube-scheduler on the claim it creates for a pod's extended resources (KEP-5004)
EXTENDED_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"


@dataclass(frozen=True)
class AllocatedDevice:
    """One device of a claim's allocation (`status.allocation.devices.results[]`)."""

    request: str
    driver: str
    pool: str
    device: str


@dataclass(frozen=True)
class ClaimInfo:
    """What gpupack reads of one ResourceClaim."""

    key: str  # namespace/name
    uid: str
    devices: tuple[AllocatedDevice, ...]  # empty while not allocated
    reserved_for: tuple[str, ...]  # uids (else names) of the pods status.reservedFor names
    extended: bool  # created by kube-scheduler for a pod's extended resources (KEP-5004)

    @property
    def allocated(self) -> bool:
        """The claim holds devices (allocated claims hold them until deallocated, reserved or not)."""
        return bool(self.devices)


def read_claim(obj: Mapping[str, Any]) -> ClaimInfo:
    """The allocation of a raw ResourceClaim; DraError naming claim and field on garbage."""
    ref = object_ref("ResourceClaim", obj)
    metadata = mapping(ref, "metadata", obj.get("metadata"))
    annotations = mapping(ref, "metadata.annotations", metadata.get("annotations"))
    status = mapping(ref, "status", obj.get("status"))
    allocation = mapping(ref, "status.allocation", status.get("allocation"))
    devices = mapping(ref, "status.allocation.devices", allocation.get("devices"))
    results = objects(ref, "status.allocation.devices.results", devices.get("results"))
    reserved = objects(ref, "status.reservedFor", status.get("reservedFor"))
    return ClaimInfo(
        key=ref.partition(" ")[2],
        uid=string(ref, "metadata.uid", metadata.get("uid"), required=False),
        devices=tuple(_result(ref, f"status.allocation.devices.results[{i}]", r) for i, r in enumerate(results)),
        reserved_for=tuple(
            string(ref, f"status.reservedFor[{i}]", c.get("uid") or c.get("name")) for i, c in enumerate(reserved)
        ),
        extended=annotations.get(EXTENDED_CLAIM_ANNOTATION) == "true",
    )


def _result(ref: str, field: str, result: Mapping[str, Any]) -> AllocatedDevice:
    return AllocatedDevice(
        request=string(ref, f"{field}.request", result.get("request"), required=False),
        driver=string(ref, f"{field}.driver", result.get("driver")),
        pool=string(ref, f"{field}.pool", result.get("pool")),
        device=string(ref, f"{field}.device", result.get("device")),
    )


def read_device_class(obj: Mapping[str, Any]) -> tuple[str, str]:
    """(class name, `spec.extendedResourceName` or "") of a raw DeviceClass; DraError on garbage."""
    ref = object_ref("DeviceClass", obj)
    spec = mapping(ref, "spec", obj.get("spec"))
    return ref.partition(" ")[2], string(
        ref, "spec.extendedResourceName", spec.get("extendedResourceName"), required=False
    )


def extended_claim_of_pod(pod: Mapping[str, Any]) -> str | None:
    """`namespace/name` of the claim kube-scheduler made for the pod's extended resources
    (`status.extendedResourceClaimStatus.resourceClaimName`), None when there is none."""
    status = pod.get("status")
    claim = status.get("extendedResourceClaimStatus") if isinstance(status, Mapping) else None
    name = claim.get("resourceClaimName") if isinstance(claim, Mapping) else None
    if not isinstance(name, str) or not name:
        return None
    namespace = (pod.get("metadata") or {}).get("namespace") or "default"
    return f"{namespace}/{name}"


__all__ = ["AllocatedDevice", "ClaimInfo", "DraError", "extended_claim_of_pod", "read_claim", "read_device_class"]
