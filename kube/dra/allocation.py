"""The `status.allocation` gpupack writes on a ResourceClaim it allocated (#30 item 2), as kube-scheduler writes it.

kube-scheduler's DynamicResources plugin does not allocate a claim whose `status.allocation` is set: it
turns the allocation's `nodeSelector` into a node filter and reserves the claim for the pod. The result
names each device (`request`, `driver`, `pool`, `device`; a firstAvailable entry as `<request>/<entry>`),
copies the configuration that applies (the DeviceClasses' first, `source: FromClass`, then the claim's,
`source: FromClaim`), selects the one node by `metadata.name` and carries `allocationTimestamp`: without
it kube-scheduler 1.37's PreBind sends `allocation: null` with the reservation, which the API server refuses
("field cannot be modified once set"), and the pod never binds (seen on the real 1.37.2). Before it is
written the claim gets the finalizer kube-scheduler adds, so it cannot be deleted while allocated (the
resourceclaim controller removes it when it deallocates).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpupack.kube.dra.objects import DRIVER

FINALIZER = "resource.kubernetes.io/delete-protection"


@dataclass(frozen=True)
class ChosenDevice:
    """One device gpupack gives a claim's request."""

    request: str  # `gpu` or `gpu/<firstAvailable entry>`
    device_class: str
    pool: str
    device: str


def with_finalizer(claim: Mapping[str, Any]) -> dict[str, Any] | None:
    """The claim with the delete-protection finalizer added; None when it has it already."""
    metadata = dict(claim.get("metadata") or {})
    finalizers = list(metadata.get("finalizers") or [])
    if FINALIZER in finalizers:
        return None
    metadata["finalizers"] = [*finalizers, FINALIZER]
    return {**claim, "metadata": metadata}


def allocated(
    claim: Mapping[str, Any],
    chosen: Sequence[ChosenDevice],
    node: str,
    classes: Mapping[str, Mapping[str, Any]],
    now: float | None = None,
) -> dict[str, Any]:
    """The claim with `status.allocation` naming `chosen` on `node` (`classes`: DeviceClass name -> raw spec),
    allocated at `now` (seconds since the epoch; default: the current time)."""
    allocation = {
        "devices": {
            "results": [{"request": c.request, "driver": DRIVER, "pool": c.pool, "device": c.device} for c in chosen],
            "config": _class_config(chosen, classes) + _claim_config(claim),
        },
        "nodeSelector": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
        },
        "allocationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
    }
    status = dict(claim.get("status") or {})
    status["allocation"] = allocation
    return {**claim, "status": status}


def _class_config(chosen: Sequence[ChosenDevice], classes: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each used class's `config` entries, for the requests that use the class."""
    by_class: dict[str, list[str]] = {}
    for c in chosen:
        requests = by_class.setdefault(c.device_class, [])
        if c.request not in requests:
            requests.append(c.request)
    return [
        {"source": "FromClass", "requests": requests, **_opaque(entry)}
        for name, requests in by_class.items()
        for entry in (classes.get(name) or {}).get("config") or []
        if isinstance(entry, Mapping)
    ]


def _claim_config(claim: Mapping[str, Any]) -> list[dict[str, Any]]:
    devices = (claim.get("spec") or {}).get("devices") or {}
    return [
        {"source": "FromClaim", **({"requests": entry["requests"]} if entry.get("requests") else {}), **_opaque(entry)}
        for entry in devices.get("config") or []
        if isinstance(entry, Mapping)
    ]


def _opaque(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {"opaque": entry["opaque"]} if "opaque" in entry else {}


def allocation_node(claim: Mapping[str, Any]) -> str | None:
    """The node an allocated claim's node selector names by `metadata.name` (None: not allocated, or another form)."""
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, Mapping):
        return None
    terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
    for term in terms:
        for field in (term or {}).get("matchFields") or []:
            values = field.get("values") or []
            if field.get("key") == "metadata.name" and field.get("operator") == "In" and len(values) == 1:
                return str(values[0])
    return None


__all__ = ["FINALIZER", "ChosenDevice", "allocated", "allocation_node", "with_finalizer"]
