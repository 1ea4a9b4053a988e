"""Which group a pod belongs to, by the conventions users already have (docs/gangs.md, #29).

The first rule that applies wins: gpupack's own annotation pair, then scheduler-plugins' PodGroup label,
then Volcano's group annotation. A group is named by its rule, namespace and name, so groups of two rules
never merge. The size of a PodGroup-backed group comes from the PodGroup object (`spec.minMember`), read by
the caller; `gpupack.io/group-size` on the pod stands in when that object is missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpupack.errors import GpupackError
from gpupack.kube.keys import ANNOTATION_GROUP, ANNOTATION_GROUP_SIZE, ANNOTATION_GROUP_TOPOLOGY
from gpupack.scoring.gang import Level

LABEL_POD_GROUP = "scheduling.x-k8s.io/pod-group"  # scheduler-plugins' coscheduling
ANNOTATION_VOLCANO_GROUP = "scheduling.k8s.io/group-name"  # Volcano
MAX_GROUP_SIZE = 1000
TOPOLOGY_VALUES = {"nvlink": Level.NVLINK, "rack": Level.RACK, "zone": Level.ZONE}


class MembershipError(GpupackError, ValueError):
    """A group annotation gpupack cannot read; the message names the annotation and value."""


class Rule(StrEnum):
    """Which convention made the pod a member; PodGroup rules name the API group of their PodGroup object."""

    GPUPACK = "gpupack"
    X_K8S = "scheduling.x-k8s.io"
    VOLCANO = "scheduling.volcano.sh"


@dataclass(frozen=True)
class GroupId:
    """One group: its rule, namespace and name."""

    rule: Rule
    namespace: str
    name: str

    @property
    def key(self) -> str:
        """`namespace/name`: how reasons and explain name the group."""
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Membership:
    """A pod's group, the size the pod itself states (None: the PodGroup object's), and the widest domain."""

    group: GroupId
    size: int | None
    widest: Level


def membership(pod: Mapping[str, Any]) -> Membership | None:
    """The pod's group (None: not a member); MembershipError for an annotation that cannot be read."""
    metadata = pod.get("metadata") or {}
    annotations: Mapping[str, str] = metadata.get("annotations") or {}
    labels: Mapping[str, str] = metadata.get("labels") or {}
    namespace = metadata.get("namespace") or "default"
    for rule, name in (
        (Rule.GPUPACK, annotations.get(ANNOTATION_GROUP)),
        (Rule.X_K8S, labels.get(LABEL_POD_GROUP)),
        (Rule.VOLCANO, annotations.get(ANNOTATION_VOLCANO_GROUP)),
    ):
        if name:
            size = _size(annotations.get(ANNOTATION_GROUP_SIZE))
            if rule == Rule.GPUPACK and size is None:
                raise MembershipError(f"{ANNOTATION_GROUP}={name} needs {ANNOTATION_GROUP_SIZE} (1..{MAX_GROUP_SIZE})")
            return Membership(GroupId(rule, namespace, name), size, _widest(annotations.get(ANNOTATION_GROUP_TOPOLOGY)))
    return None


def _size(value: str | None) -> int | None:
    if value is None:
        return None
    if not value.isdigit() or not 1 <= int(value) <= MAX_GROUP_SIZE:
        raise MembershipError(f"{ANNOTATION_GROUP_SIZE}={value!r} is not an integer 1..{MAX_GROUP_SIZE}")
    return int(value)


def _widest(value: str | None) -> Level:
    if value is None:
        return Level.CLUSTER
    if value not in TOPOLOGY_VALUES:
        raise MembershipError(f"{ANNOTATION_GROUP_TOPOLOGY}={value!r}: choose one of {', '.join(TOPOLOGY_VALUES)}")
    return TOPOLOGY_VALUES[value]


def min_member(group_object: Mapping[str, Any]) -> int:
    """A PodGroup object's `spec.minMember` (absent, 0 or not an integer: 1), capped at MAX_GROUP_SIZE."""
    value = (group_object.get("spec") or {}).get("minMember")
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        return 1
    return min(value, MAX_GROUP_SIZE)
