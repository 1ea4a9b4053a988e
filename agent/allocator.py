"""GetPreferredAllocation and Allocate: hand each container exactly the devices its assignment names.

One `Allocator` serves every resource of the node under one lock (the kubelet admits one pod at a
time anyway). For a container request of N devices of a resource, the candidates are the unallocated
claims (see `agent.claims`) asking for N. The claim whose assigned devices equal the kubelet's chosen
ones is taken (the kubelet takes the preferred allocation it was given); among several, the oldest
pod; failing that, a claim whose pod's other slots are the kubelet's choice (it hands out an init
container's devices in map order). A claim already served (`agent.ledger`, rebuilt from podresources
after a restart) is never taken again, nor a claim naming a whole GPU or MIG instance another pod was
served. No such claim: an `AllocationError` — never another GPU. Its message reaches the refused pod's
events, so it names no other pod; the agent's log does. Which devices serve a claim, and what its
container gets, the resource's kind says (`agent.device_kind`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from gpupack.agent.blocked_slots import Refusals
from gpupack.agent.claim import Claim
from gpupack.agent.claims import claims_for, describe, describe_counts
from gpupack.agent.device_kind import AllocationError, ContainerGrant, Host
from gpupack.agent.devices import Offer, offers
from gpupack.agent.ledger import Ledger, live_uids
from gpupack.agent.node_gpus import NodeGpus
from gpupack.agent.nvml import Nvml
from gpupack.agent.podresources import HeldDevices
from gpupack.agent.pods import Pod, PodLister

log = logging.getLogger(__name__)


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
    ledger: Ledger = field(default_factory=Ledger)
    refusals: Refusals = field(default_factory=Refusals)  # reported to gpupack serve (devices-in-use)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def preferred(self, resource: str, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        """The oldest waiting claim's devices when they are all available; else [] (no preference)."""
        with self.lock:
            offer = offers(self.read_gpus()).get(resource)
            if offer is None:
                return []
            for claim in self._open_claims(resource, size, self.pods.pods_on_node()):
                wanted = offer.kind.serving_ids(claim, offer.devices, set(available))
                if wanted is not None and set(must_include) <= set(wanted):
                    return wanted
            return []

    def allocate(self, resource: str, device_ids: Sequence[str]) -> ContainerAllocation:
        """The container's grant; AllocationError when no claim matches the kubelet's devices."""
        with self.lock:
            gpus = self.read_gpus()
            offer = offers(gpus).get(resource)
            pods = self.pods.pods_on_node()
            candidates = self._open_claims(resource, len(device_ids), pods)
            claim = _matching(offer, candidates, set(device_ids)) if offer else None
            if offer is None or claim is None:
                raise self._refusal(resource, device_ids, candidates, pods)
            taken = self.ledger.taken_by_others(claim, live_uids(pods))
            if taken:
                log.warning("refused %s for pod %s: other pods were served %s", resource, claim.pod, taken)
                raise AllocationError(f"pod {claim.pod}: its assignment names {resource} devices another pod holds")
            grant = offer.kind.grant(claim, Host(self.node, self.nvml, gpus, self.pods, self.refusals))
            self.ledger.record(claim)
            return ContainerAllocation(grant, claim)

    def remember(self, held: Iterable[HeldDevices], gpus: NodeGpus) -> None:
        """Merge what podresources says the kubelet handed out into the ledger (pods listed under the lock,
        so that a claim served since the caller's own list is not taken for a gone pod)."""
        with self.lock:
            self.ledger.merge(held, self.pods.pods_on_node(), gpus)

    def _open_claims(self, resource: str, amount: int, pods: list[Pod]) -> list[Claim]:
        claims = claims_for(pods, self.node, resource).claims
        return [c for c in claims if c.amount == amount and c.key not in self.ledger]

    def _refusal(
        self, resource: str, device_ids: Sequence[str], candidates: list[Claim], pods: list[Pod]
    ) -> AllocationError:
        """The error for the kubelet (counts only), with the pods named in the agent's log."""
        everything = claims_for(pods, self.node, resource)
        detail = _mismatch(resource, device_ids, candidates) or describe(everything, resource, len(device_ids))
        log.warning("Allocate %s %s refused: %s", resource, sorted(device_ids)[:4], detail)
        if candidates:
            return AllocationError(
                f"the kubelet chose {len(device_ids)} {resource} device(s) that no waiting pod's assignment names "
                f"({len(candidates)} waiting with that amount); refusing rather than handing other devices "
                "(the gpupack agent's log names the pods)"
            )
        return AllocationError(describe_counts(everything, resource, len(device_ids)))


def _matching(offer: Offer, candidates: list[Claim], chosen: set[str]) -> Claim | None:
    """The first candidate whose devices are exactly the kubelet's chosen ones; else the first whose pod's
    other slots are (with those slots)."""
    exact = (claim for claim in candidates if _serves(offer, claim, chosen))
    others = (other for claim in candidates for other in claim.others_of_pod() if _serves(offer, other, chosen))
    return next(exact, None) or next(others, None)


def _serves(offer: Offer, claim: Claim, chosen: set[str]) -> bool:
    wanted = offer.kind.serving_ids(claim, offer.devices, chosen)
    return wanted is not None and set(wanted) == chosen


def _mismatch(resource: str, device_ids: Sequence[str], candidates: list[Claim]) -> str | None:
    if not candidates:
        return None
    names = ", ".join(f"{c.pod} ({c.container})" for c in candidates)
    return (
        f"the kubelet chose {len(device_ids)} {resource} device(s) {sorted(device_ids)[:4]} that are not what the "
        f"assignment of any waiting pod names; waiting: {names}. Refusing rather than handing other devices"
    )
