"""One container's claim on the devices of one resource, and what one container asks for."""

from __future__ import annotations

from dataclasses import dataclass

from gpupack.scoring.facts import GpuSlot


@dataclass(frozen=True)
class Ask:
    """How many devices of one resource one container asks for; init containers are dealt apart."""

    amount: int
    init: bool = False


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
