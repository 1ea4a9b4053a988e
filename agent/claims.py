"""Which container of which pod an Allocate is for, and which slots of its assignment it gets.

A *claim* is one container's share of its pod's `gpupack.io/assignment` for one resource. Candidates
are the pods bound to this node that are not running yet (phase Pending, not being deleted). The kind
that the resource is a name of (`agent.kinds`) picks the pod's slots of that resource and deals them to
the containers (`DeviceKind.split`): by default in container order, as the kubelet hands devices out
(`device_kind.deal_in_order`: later containers reuse an init container's devices, not a sidecar's); a
share slot goes to every container that asks for milli, each with its own amount. See
docs/agent.md for how two candidates with the same request are told apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpupack.agent.claim import Ask, Claim
from gpupack.agent.kinds import kind_named
from gpupack.kube.pod_request import AssignmentError, assignment_from_pod, container_amounts
from gpupack.kube.pods import TERMINAL_POD_PHASES, pod_key, pod_uid
from gpupack.kube.quantity import QuantityError, parse_count
from gpupack.scoring.request import RequestError

# a pod past Pending has had its containers' devices allocated already (or has finished)
_DONE_PHASES = frozenset({"Running", *TERMINAL_POD_PHASES})


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
        (container, Ask(_asked(container, role, resource), role == "init container" and not _sidecar(container)))
        for key, role in (("initContainers", "init container"), ("containers", "container"))
        for container in spec.get(key) or []
    ]
    asks = [(container, ask) for container, ask in asks if ask.amount > 0]
    if not asks:
        return []
    key = pod_key(pod)
    placement = assignment_from_pod(pod)
    if placement is None:
        raise AssignmentError(f"pod {key} asks for {resource} but has no gpupack.io/assignment")
    kind = kind_named(resource)
    if kind is None:
        return []
    slots = [slot for slot in placement.slots if kind.resource_of(slot) == resource]
    dealt = kind.split(slots, [ask for _, ask in asks])
    if dealt is None:
        raise AssignmentError(f"pod {key}: the assignment has too few {resource} slots for its containers")
    metadata = pod.get("metadata") or {}
    created = str(metadata.get("creationTimestamp") or "")
    version = str(metadata.get("resourceVersion") or "")
    bound = int(version) if version.isdigit() else 0
    uid, pod_slots = pod_uid(pod), tuple(slots)
    return [
        Claim(key, uid, str(container.get("name")), created, resource, ask.amount, mine, bound, pod_slots)
        for (container, ask), mine in zip(asks, dealt, strict=True)
    ]


def _sidecar(container: Mapping[str, Any]) -> bool:
    """An init container that keeps running beside the app containers; the kubelet does not reuse its devices."""
    return container.get("restartPolicy") == "Always"


def _asked(container: Mapping[str, Any], role: str, resource: str) -> int:
    """How many devices of `resource` a container asks for: as `gpupack serve` counts its own resources, and
    for another kind's resource the limit (a whole number, as Kubernetes requires of extended resources)."""
    amounts = container_amounts(container, role)
    if resource in amounts:
        return amounts[resource]
    resources = container.get("resources") or {}
    value = (resources.get("limits") or {}).get(resource, (resources.get("requests") or {}).get(resource))
    try:
        return 0 if value is None else parse_count(value)
    except QuantityError as exc:
        raise RequestError(f'{role} "{container.get("name", "?")}" {resource}: {exc}') from None


def _no_claim(resource: str, amount: int) -> str:
    return f"no pod bound to this node and not yet running holds a gpupack.io/assignment for {amount} {resource}"


def describe(claims: Claims, resource: str, amount: int) -> str:
    """Why no claim fits, naming the waiting pods, for the agent's log."""
    waiting_pods = ", ".join(f"{c.pod} ({c.container}: {c.amount})" for c in claims.claims) or "none"
    problems = "; ".join(claims.problems)
    return f"{_no_claim(resource, amount)} in one container; waiting claims: {waiting_pods}" + (
        f"; {problems}" if problems else ""
    )


def describe_counts(claims: Claims, resource: str, amount: int) -> str:
    """Why no claim fits, for the refused pod's events: counts only, since other tenants' pods wait too."""
    unread = f"; {len(claims.problems)} with a missing or unreadable one" if claims.problems else ""
    return (
        f"{_no_claim(resource, amount)} in one container ({len(claims.claims)} waiting claim(s) for {resource}"
        f"{unread}; the gpupack agent's log names them)"
    )

