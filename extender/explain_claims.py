"""`gpupack explain` for a pod with ResourceClaims (#30): each claim's allocation, and gpupack's plan for the rest.

Per claim the pod uses: allocated (the node its selector names and the devices, `pool/device` per request),
not allocated, or not readable (missing from the cluster, or a template's claim not made yet). For the
claims not allocated, what gpupack's DRA allocator would do now (`extender.dra_plan.plan_claims`, the very
call its worker makes, reserving nothing): the node and the device each request gets, or why it would
leave them to kube-scheduler (a claim it does not read, or no DRA node with room).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpupack.extender.dra_allocator import claim_names
from gpupack.extender.dra_plan import NoPlan, plan_claims
from gpupack.extender.state import ClusterState
from gpupack.kube.dra.allocation import allocation_node
from gpupack.kube.dra.requests import NotOurs, claim_asks

JsonObject = dict[str, Any]


def claims_section(state: ClusterState, pod: Mapping[str, Any], claims: Mapping[str, JsonObject]) -> JsonObject | None:
    """The pod's claims and gpupack's plan for the unallocated ones; None when the pod uses no claims.
    `claims`: the cluster's ResourceClaims by `namespace/name`."""
    if not (pod.get("spec") or {}).get("resourceClaims"):
        return None
    names = claim_names(pod)
    if names is None:
        return {"claims": [], "plan": None, "left_to_scheduler": "a claim of the pod's templates is not made yet"}
    entries = [claim_entry(name, claims.get(name)) for name in names]
    free = {name: claims[name] for name in names if name in claims and allocation_node(claims[name]) is None}
    section: JsonObject = {"claims": entries, "plan": None, "left_to_scheduler": None}
    if any(entry["state"] == "missing" for entry in entries):
        section["left_to_scheduler"] = "a claim the pod names is not in the cluster"
    elif free:
        nodes = {entry["node"] for entry in entries if entry["state"] == "allocated"}
        section.update(_plan(state, pod, free, next(iter(nodes), None) if len(nodes) == 1 else None))
    return section


def claims_node(section: JsonObject | None) -> str | None:
    """The one node the pod's claims hold it to: where they are allocated, else where gpupack would allocate
    them (None: no claims, or kube-scheduler chooses)."""
    if section is None:
        return None
    if section["plan"] is not None:
        return str(section["plan"]["node"])
    nodes = {entry.get("node") for entry in section["claims"] if entry["state"] == "allocated"}
    return str(nodes.pop()) if len(nodes) == 1 and None not in nodes else None


def claim_entry(name: str, claim: Mapping[str, Any] | None) -> JsonObject:
    """One claim: its state, and where it is allocated with which devices."""
    if claim is None:
        return {"claim": name, "state": "missing"}
    node = allocation_node(claim)
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    devices = {str(r.get("request", "")): f"{r.get('pool', '')}/{r.get('device', '')}" for r in results}
    if not devices:
        return {"claim": name, "state": "unallocated"}
    return {"claim": name, "state": "allocated", "node": node, "devices": devices}


def _plan(state: ClusterState, pod: Mapping[str, Any], free: Mapping[str, JsonObject], node: str | None) -> JsonObject:
    """gpupack's plan for the `free` claims (`node`: where the pod's other claims are), or why there is none."""
    classes = state.ledger.dra.class_specs
    try:
        asks = {name: claim_asks(claim, classes) for name, claim in free.items()}
    except NotOurs as exc:
        return {"left_to_scheduler": f"kube-scheduler allocates it: {exc}"}
    with state.lock:
        plan = plan_claims(state.ledger, state.decider, pod, asks, node)
    if isinstance(plan, NoPlan):
        return {"left_to_scheduler": plan.reason}
    devices = {
        claim: {chosen.request: f"{chosen.pool}/{chosen.device}" for chosen in chosen_devices}
        for claim, chosen_devices in plan.devices.items()
    }
    return {"plan": {"node": plan.node, "devices": devices}}


def claims_text(section: JsonObject | None) -> list[str]:
    """The lines of the claims section ([] when the pod uses no claims)."""
    if section is None:
        return []
    lines = ["claims:"]
    for entry in section["claims"]:
        if entry["state"] == "allocated":
            devices = ", ".join(f"{request} -> {device}" for request, device in entry["devices"].items())
            lines.append(f"  {entry['claim']}: allocated on {entry['node']}: {devices}")
        else:
            lines.append(f"  {entry['claim']}: {entry['state']}")
    plan = section["plan"]
    if plan is not None:
        lines.append(f"gpupack would allocate on {plan['node']}:")
        for claim, devices in plan["devices"].items():
            lines.append(f"  {claim}: " + ", ".join(f"{request} -> {device}" for request, device in devices.items()))
    if section["left_to_scheduler"]:
        lines.append(f"left to kube-scheduler: {section['left_to_scheduler']}")
    return lines
