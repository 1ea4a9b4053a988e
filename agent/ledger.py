"""The ledger of claims already served on this node, and the slots each live pod holds through them.

Allocate records every claim it serves. That alone is lost with the process: after an agent restart
(DaemonSet rollout, OOM kill), a pod the kubelet admitted that is still Pending (pulling its image) would
look unserved, and the next pod's Allocate could be matched to it and handed its instance or GPU. So the
ledger is also rebuilt from the kubelet's podresources API, which lists every container it handed
devices to: the agent registers its plugins only once that has been read (`rebuilt`), and merges it
again every loop. Entries of pods that are gone or finished are dropped then, so the ledger stays the
size of the node's pods.

The ledger also answers which exclusive slots (a whole GPU, a MIG instance) other live pods hold, so
that Allocate never deals one twice: the kubelet keeps whole GPUs and static MIG instances apart by
device ID, but a dynamic-MIG device ID only names a profile on a GPU, and a pod whose assignment was
forged to name another pod's instance would otherwise get it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field
from typing import Any

from gpupack.agent.claim import Claim, ClaimKey
from gpupack.agent.kinds import kind_named
from gpupack.agent.node_gpus import NodeGpus
from gpupack.agent.podresources import HeldDevices
from gpupack.agent.pods import assigned_slots
from gpupack.kube.pods import pod_is_terminal, pod_key, pod_uid
from gpupack.scoring.facts import GpuSlot


@dataclass(frozen=True)
class Served:
    """One served claim: whose it is and the slots its container was given."""

    pod: str  # namespace/name
    slots: tuple[GpuSlot, ...]


@dataclass
class Ledger:
    """Claims served on this node (by this process, or by an earlier one as podresources shows)."""

    served: dict[ClaimKey, Served] = field(default_factory=dict)
    rebuilt: bool = False  # podresources has been read at least once

    def __contains__(self, key: ClaimKey) -> bool:
        return key in self.served

    def __len__(self) -> int:
        return len(self.served)

    def record(self, claim: Claim) -> None:
        """Allocate served `claim`."""
        self.served[claim.key] = Served(claim.pod, claim.slots)

    def merge(self, held: Iterable[HeldDevices], pods: Iterable[Mapping[str, Any]], gpus: NodeGpus) -> None:
        """Add what the kubelet says each live pod's containers hold; drop the entries of pods not live."""
        live = {pod_key(pod): pod for pod in pods if not pod_is_terminal(pod)}
        uids = live_uids(live.values())
        self.served = {key: served for key, served in self.served.items() if key[0] in uids}
        for pod in held:
            if pod.pod in live:
                self._add_containers(pod, live[pod.pod], gpus)
        self.rebuilt = True

    def taken_by_others(self, claim: Claim, live: Set[str]) -> list[GpuSlot]:
        """The claim's exclusive slots (not shares) that the served claims of another of the `live` pods (UIDs)
        hold; a pod gone or finished holds nothing any more, though the next merge has not dropped it yet."""
        others = {
            slot for (uid, _, _), served in self.served.items() if uid != claim.uid and uid in live
            for slot in served.slots
        }  # fmt: skip
        return [slot for slot in claim.slots if not slot.milli and slot in others]

    def _add_containers(self, held: HeldDevices, pod: Mapping[str, Any], gpus: NodeGpus) -> None:
        assigned = assigned_slots(pod)
        for container, devices in held.containers.items():
            for resource, ids in devices.items():
                kind = kind_named(resource)
                key = (pod_uid(pod), container, resource)
                if kind is None or key in self.served:
                    continue
                slots, _ = kind.read_held(ids, gpus, assigned)
                self.served[key] = Served(held.pod, tuple(slots))


def live_uids(pods: Iterable[Mapping[str, Any]]) -> set[str]:
    """The UIDs of the pods that have not finished: the kubelet frees a finished pod's devices."""
    return {pod_uid(pod) for pod in pods if not pod_is_terminal(pod)}
