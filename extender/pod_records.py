"""What the pod ledger (extender.pod_ledger) keeps of each bound pod, and how a pod is identified.

A `PodRecord` is the ledger's own, changed as the pod's events arrive; `BoundPod` is the copy it hands out.
`PodLife` is what preemption (#28) weighs, read afresh from every update of the pod; `PlacedBy` says which
of the ledger's rules chose the capacity a pod holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpupack.kube.pod_request import UnreadableCharge, pod_is_interruptible
from gpupack.kube.pods import pod_is_terminating, pod_labels, pod_priority, pod_started_at
from gpupack.scoring.facts import Placement
from gpupack.scoring.request import PodRequest


def identity(uid: str, key: str) -> str:
    """How a pod is tracked: its uid, or namespace/name for hand-written objects without one."""
    return uid or key


class PlacedBy(StrEnum):
    """How a bound pod's capacity was chosen (the rules of extender.pod_ledger)."""

    NOTHING = ""  # it holds nothing (yet)
    ASSIGNMENT = "assignment"  # rule 1: its own valid gpupack.io/assignment
    CPU = "cpu"  # rule 1: a CPU-only pod's CPU, memory and pod slot
    CLAIM = "claim"  # rule 4: its CPU, memory and pod slot; a ResourceClaim holds its GPUs
    RESERVATION = "reservation"  # confirmed: the filter decision it was bound with
    DEVICES_IN_USE = "devices-in-use"  # rule 2: what gpupack agent saw it hold
    FIRST_FIT = "first-fit"  # rule 2: chosen first-fit on its node
    UNREADABLE = "unreadable"  # rule 2: all it can be using there (UnreadableCharge)


@dataclass(frozen=True)
class PodLife:
    """What preemption needs to know of a bound pod (#28), read afresh on every update of the pod."""

    priority: int = 0  # spec.priority, 0 when absent
    interruptible: bool = False  # gpupack.io/interruptible: "true"
    started: float | None = None  # status.startTime, else creationTimestamp (epoch seconds)
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)  # for PodDisruptionBudget selectors
    terminating: bool = False  # metadata.deletionTimestamp is set

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> PodLife:
        """The pod's life as its object shows it."""
        return cls(
            priority=pod_priority(pod),
            interruptible=pod_is_interruptible(pod),
            started=pod_started_at(pod),
            labels=pod_labels(pod),
            terminating=pod_is_terminating(pod),
        )


@dataclass
class PodRecord:
    """A bound pod and the capacity it holds (None while it fits nowhere on its node)."""

    uid: str
    key: str
    node: str
    request: PodRequest
    annotation: str | None  # raw gpupack.io/assignment
    claimed: Placement | None  # the annotation's placement when valid for this pod and node
    placement: Placement | None = None
    how: PlacedBy = PlacedBy.NOTHING
    unreadable: UnreadableCharge | None = None  # set when the request cannot be read (then `request` is empty)
    life: PodLife = dataclasses.field(default_factory=PodLife)  # what preemption weighs (#28)
    extended_claim: str | None = None  # status.extendedResourceClaimStatus's claim (KEP-5004), namespace/name


@dataclass(frozen=True)
class BoundPod:
    """What the ledger holds for one bound pod (a copy: changing it changes nothing)."""

    uid: str
    key: str
    node: str
    placement: Placement | None
    how: PlacedBy
    claimed: Placement | None  # its own valid gpupack.io/assignment, if any
    unreadable: bool  # its request cannot be read: it is charged all it can be using
    life: PodLife = PodLife()  # priority, interruptible, start, labels, terminating (#28)
