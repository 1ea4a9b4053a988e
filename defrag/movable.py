"""Which pods defrag may move (#31 item 2), and the cluster as the planner reads it.

A pod may move only when all of these hold; otherwise the first that fails is its reason:

- it is not a DaemonSet's pod (it stays with its node) nor a static pod (the kubelet owns it);
- it opted in: the label `gpupack.io/movable: "true"`;
- a controller that recreates it owns it: a ReplicaSet (a Deployment's pods), a StatefulSet or a Job.
  A bare pod would simply be gone;
- it is not terminating already;
- no PodDisruptionBudget that selects it allows no disruption now (`extender.budgets`, as preemption reads
  them; the Eviction API enforces the same budgets when the move is carried out).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from gpupack.extender.pod_records import PodRecord
from gpupack.kube.keys import LABEL_MOVABLE
from gpupack.kube.pods import is_daemon_pod, pod_controller_kind
from gpupack.report.snapshot import ClusterSnapshot
from gpupack.scoring.cost import placement_gpus
from gpupack.scoring.defrag import Pending, Resident

RECREATING_OWNERS = frozenset({"ReplicaSet", "StatefulSet", "Job"})
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"  # the kubelet's mirror of a static pod


def why_unmovable(pod: Mapping[str, Any], breaks_budget: bool) -> str:
    """Why the pod may not move ("" : it may), by the rules of the module docstring, first failing rule."""
    metadata = pod.get("metadata") or {}
    owner = pod_controller_kind(pod)
    if owner == "DaemonSet":
        return "a DaemonSet's pod stays with its node"
    if MIRROR_ANNOTATION in (metadata.get("annotations") or {}):
        return "a static pod: its kubelet owns it"
    if (metadata.get("labels") or {}).get(LABEL_MOVABLE) != "true":
        return f'not labelled {LABEL_MOVABLE}: "true"'
    if owner is None:
        return "a bare pod: no controller would recreate it"
    if owner not in RECREATING_OWNERS:
        return f"owned by a {owner}, not one of {', '.join(sorted(RECREATING_OWNERS))}"
    if metadata.get("deletionTimestamp"):
        return "terminating already"
    if breaks_budget:
        return "a PodDisruptionBudget allows no disruption now"
    return ""


def residents(snapshot: ClusterSnapshot, namespace: str | None = None, now: float | None = None) -> list[Resident]:
    """Every bound pod that holds capacity, with why it may not move and the GPU-time a restart loses; with
    `namespace`, pods of other namespaces never move."""
    state = snapshot.state
    at = time.time() if now is None else now
    out: list[Resident] = []
    for ident, pod in snapshot.pods.items():
        record = state.ledger.bound(ident)
        if record is None or record.placement is None:
            continue
        daemon = is_daemon_pod(pod)
        request = None if record.unreadable is not None else record.request
        unmovable = why_unmovable(pod, state.budgets.breaks(record))
        if namespace is not None and not record.key.startswith(f"{namespace}/"):
            unmovable = f"not in namespace {namespace}"
        if not unmovable and request is None:
            unmovable = "its request cannot be read"
        seconds = _gpu_seconds(snapshot, record, at)
        out.append(Resident(record.key, record.placement, request, unmovable, seconds, daemon))
    return sorted(out, key=lambda r: r.key)


def pending(snapshot: ClusterSnapshot, namespace: str | None = None) -> list[Pending]:
    """Every unbound GPU pod gpupack would place (of `namespace` only, when given)."""
    found = [snapshot.state.ledger.pending(ident) for ident in snapshot.pods]
    return sorted(
        (Pending(key, request) for key, request in (f for f in found if f is not None)
         if namespace is None or key.startswith(f"{namespace}/")),
        key=lambda p: p.key,
    )  # fmt: skip


def _gpu_seconds(snapshot: ClusterSnapshot, record: PodRecord, now: float) -> float:
    assert record.placement is not None
    started = record.life.started
    ran = max(0.0, now - started) if started is not None else 0.0
    return placement_gpus(snapshot.state.inventory, record.placement) * ran


__all__ = ["RECREATING_OWNERS", "pending", "residents", "why_unmovable"]
