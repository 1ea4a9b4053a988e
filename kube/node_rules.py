"""Whether a pod may go to a node at all: its node selector, required node affinity and the node's taints.

kube-scheduler checks these itself for every pod; gpupack needs them only where it chooses a node *before*
kube-scheduler sees the pod (a DRA claim allocated for a gated pod, #30 item 2): an allocation on a node
the pod may not use would leave the pod Pending for good. The rules are the API's: `nodeSelector` labels
all equal; a node matches `requiredDuringSchedulingIgnoredDuringExecution` when any term matches, a term
when all its expressions do; taints with effect NoSchedule or NoExecute need a matching toleration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_BLOCKING = ("NoSchedule", "NoExecute")


def why_not(pod: Mapping[str, Any], node: Mapping[str, Any]) -> str | None:
    """Why the pod may not go to the node, None when it may."""
    spec = pod.get("spec") or {}
    metadata = node.get("metadata") or {}
    labels = metadata.get("labels") or {}
    name = str(metadata.get("name") or "")
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return f"node selector {key}={value} does not match"
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required and not any(_term(term, labels, name) for term in required.get("nodeSelectorTerms") or []):
        return "required node affinity does not match"
    if (node.get("spec") or {}).get("unschedulable"):
        return "node is cordoned"
    untolerated = [t for t in (node.get("spec") or {}).get("taints") or [] if _blocks(t, spec.get("tolerations"))]
    if untolerated:
        return f"untolerated taint {untolerated[0].get('key')}"
    return None


def _term(term: Mapping[str, Any], labels: Mapping[str, str], name: str) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term matches no node
    return all(_expression(e, labels) for e in expressions) and all(
        _expression(f, {"metadata.name": name}) for f in fields
    )


def _expression(expression: Mapping[str, Any], values: Mapping[str, str]) -> bool:
    key, operator = expression.get("key"), expression.get("operator")
    wanted: Sequence[str] = expression.get("values") or []
    present = key in values
    value = values.get(str(key), "")
    if operator == "In":
        return present and value in wanted
    if operator == "NotIn":
        return not present or value not in wanted
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and wanted:
        try:
            number, bound = int(value), int(wanted[0])
        except ValueError:
            return False
        return number > bound if operator == "Gt" else number < bound
    return False


def _blocks(taint: Mapping[str, Any], tolerations: object) -> bool:
    if taint.get("effect") not in _BLOCKING:
        return False
    return not any(_tolerates(t, taint) for t in tolerations or [] if isinstance(t, Mapping))  # type: ignore[attr-defined]


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    if toleration.get("operator") == "Exists":
        return not toleration.get("key") or toleration.get("key") == taint.get("key")
    return toleration.get("key") == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")


__all__ = ["why_not"]
