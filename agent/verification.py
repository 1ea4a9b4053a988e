"""Compare what the kubelet handed each pod (podresources) with the pod's `gpupack.io/assignment`.

Device IDs are turned back into the slots of an assignment with an NVML snapshot, by every registered
kind in turn (`DeviceKind.read_held`, e.g. a GPU UUID from any plugin is that whole GPU, a MIG UUID that
instance). IDs no kind reads are not GPUs the agent knows (another vendor's plugin, a stale ID) and are
only counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpupack.agent.kinds import registered
from gpupack.agent.node_gpus import NodeGpus
from gpupack.agent.podresources import HeldDevices
from gpupack.agent.pods import assigned_slots
from gpupack.kube.pods import pod_key
from gpupack.scoring.facts import GpuSlot


@dataclass(frozen=True)
class Discrepancy:
    """One pod whose held devices and assignment differ."""

    pod: str  # namespace/name
    extra: tuple[GpuSlot, ...]  # held, not named by its assignment (it has none, or names others)
    missing: tuple[GpuSlot, ...]  # named by its assignment, not held
    unknown: int  # device IDs that are not GPUs or MIG instances of this node


def compare(held: Iterable[HeldDevices], pods: Iterable[Mapping[str, Any]], gpus: NodeGpus) -> list[Discrepancy]:
    """Every pod the kubelet lists whose devices are not exactly its assignment's, by pod name."""
    assigned = {pod_key(pod): assigned_slots(pod) for pod in pods}
    out = []
    for pod in held:
        mine = assigned.get(pod.pod, ())
        slots, unknown = held_slots(pod, mine, gpus)
        if not slots and not unknown:
            continue  # holds no GPU (a CPU pod): nothing to verify
        extra = tuple(s for s in slots if not _named(s, mine))
        missing = tuple(s for s in mine if not _named(s, slots))
        if extra or missing or unknown:
            out.append(Discrepancy(pod.pod, extra, missing, unknown))
    return sorted(out, key=lambda d: d.pod)


def held_slots(pod: HeldDevices, assigned: tuple[GpuSlot, ...], gpus: NodeGpus) -> tuple[list[GpuSlot], int]:
    """The slots a pod's device IDs stand for, and how many IDs stand for nothing known."""
    rest = [device for ids in pod.devices.values() for device in ids]
    slots: list[GpuSlot] = []
    for kind in registered():
        found, rest = kind.read_held(rest, gpus, assigned)
        slots += found
    return list(dict.fromkeys(slots)), len(rest)


def _named(slot: GpuSlot, slots: Iterable[GpuSlot]) -> bool:
    """A slot is named by another list when the same; a share when any share sits on the same GPU."""
    if slot.milli:
        return any(other.milli and other.index == slot.index for other in slots)
    return slot in slots
