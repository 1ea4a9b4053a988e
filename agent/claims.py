"""Which container of which pod an Allocate is for, and which slots of its assignment it gets.

A *claim* is one container's share of its pod's `gpupack.io/assignment` for one resource. Candidates
are the pods bound to this node that are not running yet (phase Pending, not being deleted). The slots
of the resource's kind are dealt to the pod's containers in `spec.containers` order, each taking as
many as it asks for; an init container takes the first ones (the kubelet lets later containers reuse
an init container's devices). A share slot goes to every container that asks for milli, each with
its own amount. See docs/agent.md for how two candidates with the same request are told apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpupack.agent.devices import mig_resource
from gpupack.kube.keys import RESOURCE_GPU, RESOURCE_GPU_MILLI
from gpupack.kube.pod_request import AssignmentError, assignment_from_pod, container_amounts, pod_key, pod_uid
from gpupack.scoring.facts import GpuSlot
from gpupack.scoring.geometry import canonical_profile
from gpupack.scoring.request import RequestError

_DONE_PHASES = ("Running", "Succeeded", "Failed")


@dataclass(frozen=True)
class Claim:
    """One container's devices of one resource, as its pod's assignment names them."""

    pod: str  # namespace/name
    uid: str
    container: str
    created: str  # metadata.creationTimestamp (RFC 3339 sorts as text)
    resource: str
    amount: int  # what the container asks the kubelet for
    slots: tuple[GpuSlot, ...]

    @property
    def key(self) -> tuple[str, str, str]:
        """Identity in the agent's ledger of allocated claims."""
        return (self.uid, self.container, self.resource)

    bound: int = 0  # metadata.resourceVersion: for a pod not yet admitted, that of its binding

    @property
    def order(self) -> tuple[str, int, str]:
        """The order the kubelet admits pods in: creation time (whole seconds), then binding order.

        The kubelet sorts the pods it receives by creationTimestamp, which has whole seconds, and keeps
        the order they arrived in (binding order, as its watch delivers them) among equal ones. Until
        the kubelet admits it, the last write to a bound pod is its binding, so the resourceVersion
        (an etcd revision, increasing) gives that order; by name only as a last resort. Found on a
        real kubelet: two 1-GPU pods created in one second were told apart by name and each got the
        other's GPU.
        """
        return (self.created, self.bound, self.pod)


@dataclass(frozen=True)
class Claims:
    """The claims for one resource on this node, and why other waiting pods have none."""

    claims: tuple[Claim, ...]
    problems: tuple[str, ...]  # "pod ns/x asks for nvidia.com/gpu but has no gpupack.io/assignment"


def waiting(pod: Mapping[str, Any], node: str) -> bool:
    """Bound to `node`, not yet running, not being deleted."""
    metadata = pod.get("metadata") or {}
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    return (pod.get("spec") or {}).get("nodeName") == node and phase not in _DONE_PHASES and not metadata.get(
        "deletionTimestamp"
    )


def claims_for(pods: Iterable[Mapping[str, Any]], node: str, resource: str) -> Claims:
    """Every waiting pod's claims on `resource`; pods whose claim cannot be read become problems."""
    claims: list[Claim] = []
    problems: list[str] = []
    for pod in pods:
        if not waiting(pod, node):
            continue
        try:
            claims += _pod_claims(pod, resource)
        except (AssignmentError, RequestError) as exc:
            problems.append(str(exc))
    return Claims(tuple(sorted(claims, key=lambda c: c.order)), tuple(problems))


def _pod_claims(pod: Mapping[str, Any], resource: str) -> list[Claim]:
    spec = pod.get("spec") or {}
    asks = [
        (container, container_amounts(container, role).get(resource, 0), role == "init container")
        for key, role in (("initContainers", "init container"), ("containers", "container"))
        for container in spec.get(key) or []
    ]
    asks = [(container, amount, init) for container, amount, init in asks if amount > 0]
    if not asks:
        return []
    key = pod_key(pod)
    placement = assignment_from_pod(pod)
    if placement is None:
        raise AssignmentError(f"pod {key} asks for {resource} but has no gpupack.io/assignment")
    slots = [slot for slot in placement.slots if slot_resource(slot) == resource]
    metadata = pod.get("metadata") or {}
    created = str(metadata.get("creationTimestamp") or "")
    version = str(metadata.get("resourceVersion") or "")
    bound = int(version) if version.isdigit() else 0
    claims, dealt = [], 0
    for container, amount, init in asks:
        if resource == RESOURCE_GPU_MILLI:
            mine = tuple(slots[:1])
        else:
            first = 0 if init else dealt
            mine = tuple(slots[first : first + amount])
            dealt += 0 if init else amount
            if len(mine) != amount:
                raise AssignmentError(f"pod {key}: the assignment has too few {resource} slots for its containers")
        claims.append(Claim(key, pod_uid(pod), str(container.get("name")), created, resource, amount, mine, bound))
    return claims


def slot_resource(slot: GpuSlot) -> str:
    """The resource name a slot of an assignment is counted under."""
    if slot.mig:
        return mig_resource(canonical_profile(slot.mig))
    return RESOURCE_GPU_MILLI if slot.milli else RESOURCE_GPU


def describe(claims: Claims, resource: str, amount: int) -> str:
    """Why no claim fits, naming the waiting pods, for an allocation error."""
    waiting_pods = ", ".join(f"{c.pod} ({c.container}: {c.amount})" for c in claims.claims) or "none"
    reason = f"no pod bound to this node and not yet running holds a gpupack.io/assignment for {amount} {resource}"
    problems = "; ".join(claims.problems)
    return f"{reason} in one container; waiting claims: {waiting_pods}" + (f"; {problems}" if problems else "")

