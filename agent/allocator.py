"""GetPreferredAllocation and Allocate: hand each container exactly the devices its assignment names.

One `Allocator` serves every resource of the node under one lock (the kubelet admits one pod at a
time anyway). For a container request of N devices of a resource, the candidates are the unallocated
claims (see `agent.claims`) asking for N. The claim whose assigned devices equal the kubelet's chosen
ones is taken (the kubelet takes the preferred allocation it was given); among several, the oldest
pod. No such claim: an `AllocationError` that names the pods — never another GPU. Which devices serve
a claim, and what its container gets, the resource's kind says (`agent.device_kind`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpupack.agent.blocked_slots import Refusals
from gpupack.agent.claim import Claim
from gpupack.agent.claims import claims_for, describe
from gpupack.agent.device_kind import AllocationError, ContainerGrant, Host
from gpupack.agent.devices import Offer, offers
from gpupack.agent.node_gpus import NodeGpus
from gpupack.agent.nvml import Nvml
from gpupack.agent.pods import PodLister


@dataclass(frozen=True)
class ContainerAllocation:
    """What the kubelet passes to the container runtime for one container, and the claim it serves."""

    grant: ContainerGrant
    claim: Claim


@dataclass
class Allocator:
    """Matches kubelet requests to assignments; lets the kind prepare the devices before answering."""

    node: str
    nvml: Nvml
    pods: PodLister
    read_gpus: Callable[[], NodeGpus]
    allocated: dict[tuple[str, str, str], tuple[str, ...]] = field(default_factory=dict)
    refusals: Refusals = field(default_factory=Refusals)  # reported to gpupack serve (devices-in-use)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def preferred(self, resource: str, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        """The oldest waiting claim's devices when they are all available; else [] (no preference)."""
        with self.lock:
            offer = offers(self.read_gpus()).get(resource)
            if offer is None:
                return []
            for claim in self._open_claims(resource, size):
                wanted = offer.kind.serving_ids(claim, offer.devices, set(available))
                if wanted is not None and set(must_include) <= set(wanted):
                    return wanted
            return []

    def allocate(self, resource: str, device_ids: Sequence[str]) -> ContainerAllocation:
        """The container's grant; AllocationError when no claim matches the kubelet's devices."""
        with self.lock:
            gpus = self.read_gpus()
            offer = offers(gpus).get(resource)
            candidates = self._open_claims(resource, len(device_ids))
            claim = _matching(offer, candidates, set(device_ids)) if offer else None
            if offer is None or claim is None:
                everything = claims_for(self.pods.pods_on_node(), self.node, resource)
                reason = _mismatch(resource, device_ids, candidates)
                raise AllocationError(reason or describe(everything, resource, len(device_ids)))
            grant = offer.kind.grant(claim, Host(self.node, self.nvml, gpus, self.pods, self.refusals))
            self.allocated[claim.key] = tuple(device_ids)
            return ContainerAllocation(grant, claim)

    def _open_claims(self, resource: str, amount: int) -> list[Claim]:
        claims = claims_for(self.pods.pods_on_node(), self.node, resource).claims
        return [c for c in claims if c.amount == amount and c.key not in self.allocated]


def _matching(offer: Offer, candidates: list[Claim], chosen: set[str]) -> Claim | None:
    """The first candidate whose devices are exactly the kubelet's chosen ones."""
    for claim in candidates:
        wanted = offer.kind.serving_ids(claim, offer.devices, chosen)
        if wanted is not None and set(wanted) == chosen:
            return claim
    return None


def _mismatch(resource: str, device_ids: Sequence[str], candidates: list[Claim]) -> str | None:
    if not candidates:
        return None
    names = ", ".join(f"{c.pod} ({c.container})" for c in candidates)
    return (
        f"the kubelet chose {len(device_ids)} {resource} device(s) {sorted(device_ids)[:4]} that are not what the "
        f"assignment of any waiting pod names; waiting: {names}. Refusing rather than handing other devices"
    )
