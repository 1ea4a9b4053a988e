"""A pod's identity and whether it still holds resources: the one home of these rules for every component."""

from __future__ import annotations

from collections.abc import Mapping
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
