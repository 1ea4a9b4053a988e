"""The seam between the agent and one kind of device it serves (docs/adding-a-device-kind.md).

A kind says which resources it advertises for what NVML shows, which of those devices give a claim its
assigned slots, and what the container gets. Devices, claims, Allocate, verification and the loop know
no kind: they ask every registered one (`agent.kinds`). Shared building blocks for kinds are at the end.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass
from typing import ClassVar

from gpupack.agent.blocked_slots import Blocked, Refusals
from gpupack.agent.claim import Ask, Claim
from gpupack.agent.node_gpus import Device, NodeGpus
from gpupack.agent.nvml import Nvml
from gpupack.agent.pods import PodLister
from gpupack.errors import GpupackError
from gpupack.scoring.facts import GpuSlot

Held = tuple[list[GpuSlot], list[str]]  # the slots some device IDs stand for, and the IDs left over


class AllocationError(GpupackError, RuntimeError):
    """A container whose devices cannot be matched to an assignment; the message names the pod(s)."""


@dataclass(frozen=True)
class DeviceNode:
    """A device node the container runtime makes visible in the container."""

    container_path: str
    host_path: str
    permissions: str = "rw"  # any of r, w, m


@dataclass(frozen=True)
class Mount:
    """A host path the container runtime mounts into the container."""

    container_path: str
    host_path: str
    read_only: bool = True


@dataclass(frozen=True)
class ContainerGrant:
    """What Allocate answers for one container: its environment, device nodes and mounts."""

    envs: dict[str, str]
    devices: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()


@dataclass(frozen=True)
class Host:
    """What a kind may use beyond a claim: the node, NVML and a snapshot of it, the pods, the refusals."""

    node: str
    nvml: Nvml
    gpus: NodeGpus
    pods: PodLister
    refusals: Refusals


class DeviceKind(ABC):
    """One kind of device: implement the abstract methods; the others have defaults most kinds keep."""

    name: ClassVar[str] = ""

    @abstractmethod
    def owns(self, resource: str) -> bool:
        """Whether `resource` is one of this kind's resource names (on any node)."""

    @abstractmethod
    def resource_of(self, slot: GpuSlot) -> str | None:
        """The resource this kind hands an assignment's `slot` out under; None when it does not serve it."""

    @abstractmethod
    def advertise(self, node: NodeGpus) -> dict[str, list[Device]]:
        """Resource name -> the devices this kind advertises on the node ({} where it does not apply)."""

    @abstractmethod
    def serving_ids(self, claim: Claim, devices: Sequence[Device], available: Set[str]) -> list[str] | None:
        """The IDs among `available` (of the advertised `devices`) that give the claim its slots; None if absent."""

    @abstractmethod
    def grant(self, claim: Claim, host: Host) -> ContainerGrant:
        """What the claim's container gets; AllocationError, naming the pod, when it cannot be given."""

    def split(self, slots: Sequence[GpuSlot], asks: Sequence[Ask]) -> list[tuple[GpuSlot, ...]] | None:
        """Each container's slots of a pod's `slots` of one resource; None when too few. Default: in order."""
        return deal_in_order(slots, asks)

    def read_held(self, ids: Sequence[str], gpus: NodeGpus, assigned: tuple[GpuSlot, ...]) -> Held:
        """The slots this kind's IDs among the pod's `ids` stand for, and the other IDs. Default: none."""
        return [], list(ids)

    def tidy(self, host: Host) -> list[Blocked]:
        """Every loop, under the allocation lock: set the node right; the slots to report blocked. Default: none."""
        return []


# --- building blocks for kinds


def deal_in_order(slots: Sequence[GpuSlot], asks: Sequence[Ask]) -> list[tuple[GpuSlot, ...]] | None:
    """Deal as the kubelet hands devices out, in container order; None when there are too few slots.

    A container first reuses the slots of the init containers that ran before it, then takes new ones
    in order. An init container's slots become reusable; an app container's or a sidecar's (an init
    container with `restartPolicy: Always`, which keeps running) are its own from then on. The kubelet
    picks reused devices in map order, so a container may get others of its pod's (`Claim.others_of_pod`).
    """
    fresh_from = 0
    reusable: list[GpuSlot] = []
    out: list[tuple[GpuSlot, ...]] = []
    for ask in asks:
        mine = reusable[: ask.amount]
        fresh = list(slots[fresh_from : fresh_from + ask.amount - len(mine)])
        fresh_from += len(fresh)
        mine += fresh
        if len(mine) != ask.amount:
            return None
        reusable = list(dict.fromkeys(reusable + mine)) if ask.init else [s for s in reusable if s not in mine]
        out.append(tuple(mine))
    return out


def take_per_slot(
    claim: Claim,
    devices: Sequence[Device],
    available: Set[str],
    serves: Callable[[Device, GpuSlot], bool],
    count: int = 1,
) -> list[str] | None:
    """`count` available devices that `serve` each slot of the claim, none twice; None when a slot lacks them."""
    wanted: list[str] = []
    for slot in claim.slots:
        on_slot = [d.id for d in devices if serves(d, slot) and d.id in available and d.id not in wanted]
        if len(on_slot) < count:
            return None
        wanted += on_slot[:count]
    return wanted


def on_slot_gpu(device: Device, slot: GpuSlot) -> bool:
    """The device lives on the slot's GPU."""
    return device.gpu == slot.index


def read_each(ids: Sequence[str], read: Callable[[str], GpuSlot | None]) -> Held:
    """`read_held` for kinds whose every ID alone stands for one slot (None: not one of theirs)."""
    slots: list[GpuSlot] = []
    rest: list[str] = []
    for device_id in ids:
        slot = read(device_id)
        if slot is None:
            rest.append(device_id)
        else:
            slots.append(slot)
    return slots, rest
