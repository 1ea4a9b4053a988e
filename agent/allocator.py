"""GetPreferredAllocation and Allocate: hand each container exactly the devices its assignment names.

One `Allocator` serves every resource of the node under one lock (the kubelet admits one pod at a
time anyway). For a container request of N devices of a resource, the candidates are the unallocated
claims (see `agent.claims`) asking for N. The claim whose assigned devices equal the kubelet's chosen
ones is taken (the kubelet takes the preferred allocation it was given); among several, the oldest
pod. No such claim: an `AllocationError` that names the pods — never another GPU.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpupack.agent.agent_metrics import MIG_CREATE_REFUSALS
from gpupack.agent.claims import Claim, claims_for, describe
from gpupack.agent.devices import Device, NodeGpus, advertised
from gpupack.agent.devices_in_use import Refusals
from gpupack.agent.mig_lifecycle import MigCreateError, ensure_instance
from gpupack.agent.nvml import MigInstance, Nvml
from gpupack.agent.pods import PodLister
from gpupack.errors import GpupackError
from gpupack.kube.keys import RESOURCE_GPU_MILLI
from gpupack.scoring.facts import GpuSlot

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"  # what NVIDIA's container toolkit reads (GPU or MIG UUIDs)


class AllocationError(GpupackError, RuntimeError):
    """A container whose devices cannot be matched to an assignment; the message names the pod(s)."""


@dataclass(frozen=True)
class ContainerAllocation:
    """What the kubelet passes to the container runtime for one container."""

    envs: dict[str, str]
    claim: Claim


@dataclass
class Allocator:
    """Matches kubelet requests to assignments; creates dynamic MIG instances before answering."""

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
            devices = advertised(self.read_gpus()).get(resource, [])
            for claim in self._open_claims(resource, size):
                wanted = expected_ids(claim, devices, set(available))
                if wanted is not None and set(must_include) <= set(wanted):
                    return wanted
            return []

    def allocate(self, resource: str, device_ids: Sequence[str]) -> ContainerAllocation:
        """The container's environment; AllocationError when no claim matches the kubelet's devices."""
        with self.lock:
            gpus = self.read_gpus()
            devices = advertised(gpus).get(resource, [])
            candidates = self._open_claims(resource, len(device_ids))
            chosen = set(device_ids)
            claim = next((c for c in candidates if _same_devices(c, devices, chosen)), None)
            if claim is None:
                everything = claims_for(self.pods.pods_on_node(), self.node, resource)
                reason = _mismatch(resource, device_ids, candidates)
                raise AllocationError(reason or describe(everything, resource, len(device_ids)))
            envs = self._envs(claim, gpus)
            self.allocated[claim.key] = tuple(device_ids)
            return ContainerAllocation(envs, claim)

    def _open_claims(self, resource: str, amount: int) -> list[Claim]:
        claims = claims_for(self.pods.pods_on_node(), self.node, resource).claims
        return [c for c in claims if c.amount == amount and c.key not in self.allocated]

    def _envs(self, claim: Claim, gpus: NodeGpus) -> dict[str, str]:
        uuids = []
        for slot in claim.slots:
            if slot.mig and gpus.dynamic_mig:
                try:
                    uuids.append(ensure_instance(self.nvml, slot).uuid)
                except MigCreateError as exc:
                    self.refusals.record(slot, str(exc))
                    MIG_CREATE_REFUSALS.inc()
                    raise AllocationError(f"pod {claim.pod} container {claim.container}: {exc}") from None
                self.refusals.created(slot)
            elif slot.mig:
                uuids.append(_static_instance(claim, slot, gpus).uuid)
            else:
                uuids.append(gpus.gpus[slot.index].uuid)
        envs = {VISIBLE_DEVICES: ",".join(uuids)}
        if claim.resource == RESOURCE_GPU_MILLI:
            envs["GPUPACK_GPU_MILLI"] = str(claim.amount)  # informational: time-slicing does not enforce it
        return envs


def expected_ids(claim: Claim, devices: list[Device], available: set[str]) -> list[str] | None:
    """Device IDs that give the claim its slots, taken from `available`; None when they are not there."""
    wanted: list[str] = []
    for slot in claim.slots:
        count = claim.amount if slot.milli else 1
        on_slot = [d.id for d in devices if _device_serves(d, slot) and d.id in available and d.id not in wanted]
        if len(on_slot) < count:
            return None
        wanted += on_slot[:count]
    return wanted


def _device_serves(device: Device, slot: GpuSlot) -> bool:
    if device.gpu != slot.index:
        return False
    if device.instance is not None:  # static MIG: that very instance
        return (device.instance.profile, device.instance.start) == (slot.mig, slot.start)
    return True  # a GPU, a milli unit of it, or a dynamic-MIG device of the slot's profile on it


def _same_devices(claim: Claim, devices: list[Device], chosen: set[str]) -> bool:
    wanted = expected_ids(claim, devices, chosen)
    return wanted is not None and set(wanted) == chosen


def _static_instance(claim: Claim, slot: GpuSlot, gpus: NodeGpus) -> MigInstance:
    for instance in gpus.instances[slot.index]:
        if (instance.profile, instance.start) == (slot.mig, slot.start):
            return instance
    raise AllocationError(f"pod {claim.pod}: no MIG instance {slot.mig}@{slot.start} on GPU {slot.index}")


def _mismatch(resource: str, device_ids: Sequence[str], candidates: list[Claim]) -> str | None:
    if not candidates:
        return None
    names = ", ".join(f"{c.pod} ({c.container})" for c in candidates)
    return (
        f"the kubelet chose {len(device_ids)} {resource} device(s) {sorted(device_ids)[:4]} that are not what the "
        f"assignment of any waiting pod names; waiting: {names}. Refusing rather than handing other devices"
    )
