"""A pod's identity and whether it still holds resources: the one home of these rules for every component."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

# a pod in one of these phases has finished: kubelet has released what it held
TERMINAL_POD_PHASES = frozenset({"Succeeded", "Failed"})


def pod_key(pod: Mapping[str, Any]) -> str:
    """`namespace/name` of a pod (namespace "default" when absent, as in a hand-written file)."""
    metadata = pod.get("metadata") or {}
    return f"{metadata.get('namespace') or 'default'}/{metadata.get('name') or ''}"


def pod_uid(pod: Mapping[str, Any]) -> str:
    """The pod's metadata.uid ("" when absent)."""
    return str((pod.get("metadata") or {}).get("uid") or "")


def pod_is_terminal(pod: Mapping[str, Any]) -> bool:
    """True when the pod's phase is Succeeded or Failed: it holds no resources any more."""
    return (pod.get("status") or {}).get("phase") in TERMINAL_POD_PHASES


def pod_controller_kind(pod: Mapping[str, Any]) -> str | None:
    """The kind of the pod's controlling owner (`controller: true`), None when it has none."""
    for owner in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(owner, Mapping) and owner.get("controller") is True:
            return str(owner.get("kind") or "")
    return None


def is_daemon_pod(pod: Mapping[str, Any]) -> bool:
    """Whether a DaemonSet controls the pod: it stays with its node and leaves with it."""
    return pod_controller_kind(pod) == "DaemonSet"


def pod_priority(pod: Mapping[str, Any]) -> int:
    """The pod's spec.priority (0 when absent or not an integer, as kube-scheduler reads a pod without one)."""
    value = (pod.get("spec") or {}).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def pod_is_terminating(pod: Mapping[str, Any]) -> bool:
    """True once the pod's deletion has begun (metadata.deletionTimestamp is set): it is on its way out."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def pod_labels(pod: Mapping[str, Any]) -> dict[str, str]:
    """metadata.labels with string values only (what a label selector can match)."""
    labels = (pod.get("metadata") or {}).get("labels")
    if not isinstance(labels, Mapping):
        return {}
    return {str(key): value for key, value in labels.items() if isinstance(value, str)}


def pod_started_at(pod: Mapping[str, Any]) -> float | None:
    """When the pod started, in seconds since the epoch: status.startTime, else metadata.creationTimestamp
    (None when neither reads as an RFC 3339 time)."""
    for stamp in ((pod.get("status") or {}).get("startTime"), (pod.get("metadata") or {}).get("creationTimestamp")):
        seconds = _epoch_seconds(stamp)
        if seconds is not None:
            return seconds
    return None


def _epoch_seconds(stamp: object) -> float | None:
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        moment = datetime.fromisoformat(stamp.replace("Z", "+00:00") if stamp.endswith("Z") else stamp)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
