"""One container's claim on the devices of one resource, and what one container asks for."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from gpupack.scoring.facts import GpuSlot

ClaimKey = tuple[str, str, str]  # (pod UID, container, resource)


@dataclass(frozen=True)
class Ask:
    """How many devices of one resource one container asks for; init containers are dealt apart."""

    amount: int
    init: bool = False  # an init container that runs to completion (not a sidecar): later ones reuse its devices


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
    def key(self) -> ClaimKey:
        """Identity in the agent's ledger of allocated claims."""
        return (self.uid, self.container, self.resource)

    bound: int = 0  # metadata.resourceVersion: for a pod not yet admitted, that of its binding
    pod_slots: tuple[GpuSlot, ...] = ()  # all the pod's slots of this resource (see `others_of_pod`)

    def others_of_pod(self, limit: int = 256) -> list[Claim]:
        """The claim with its slots replaced by each other choice of as many of its pod's slots.

        The kubelet hands a container its pod's init-container devices first, in map order (not the
        preferred ones), so a container may get any of its pod's devices rather than the ones dealt to it.
        Bounded by `limit`: a pod has a node's GPUs at most.
        """
        choices = itertools.combinations(dict.fromkeys(self.pod_slots), len(self.slots))
        others = (replace(self, slots=slots) for slots in choices if set(slots) != set(self.slots))
        return list(itertools.islice(others, limit))

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
