"""Compare what the kubelet handed each pod (podresources) with the pod's `gpupack.io/assignment`.

Device IDs are turned back into the slots of an assignment with an NVML snapshot:
- a GPU UUID (from any plugin, e.g. NVIDIA's) is that whole GPU;
- `<GPU UUID>/milli-<k>` IDs (the agent's shares) are a share of that GPU, milli = how many;
- a MIG UUID is that instance, profile@start, wherever it came from;
- `<GPU UUID>/<profile>/<k>` (the agent's dynamic MIG) is the pod's own assigned instance of that profile
  on that GPU; with no such slot in its assignment, its placement cannot be known (counted as unknown).
Other IDs are not GPUs the agent knows (another vendor's plugin, a stale ID) and are only counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpupack.agent.devices import MILLI_PER_GPU, NodeGpus
from gpupack.agent.podresources import HeldDevices
from gpupack.kube.pod_request import AssignmentError, assignment_from_pod, pod_key
from gpupack.scoring.facts import GpuSlot
from gpupack.scoring.geometry import canonical_profile
from gpupack.scoring.request import RequestError

MILLI_MARK = "/milli-"


@dataclass(frozen=True)
class Discrepancy:
    """One pod whose held devices and assignment differ."""

    pod: str  # namespace/name
    extra: tuple[GpuSlot, ...]  # held, not named by its assignment (it has none, or names others)
    missing: tuple[GpuSlot, ...]  # named by its assignment, not held
    unknown: int  # device IDs that are not GPUs or MIG instances of this node


def compare(held: Iterable[HeldDevices], pods: Iterable[Mapping[str, Any]], gpus: NodeGpus) -> list[Discrepancy]:
    """Every pod the kubelet lists whose devices are not exactly its assignment's, by pod name."""
    assigned = {pod_key(pod): _assigned_slots(pod) for pod in pods}
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
    by_uuid = {gpu.uuid: GpuSlot(gpu.index) for gpu in gpus.gpus}
    by_uuid |= {i.uuid: GpuSlot(i.gpu, mig=i.profile, start=i.start) for row in gpus.instances for i in row}
    slots: list[GpuSlot] = []
    milli: Counter[int] = Counter()
    unknown = 0
    for device in (d for ids in pod.devices.values() for d in ids):
        gpu_uuid, _, rest = device.partition("/")
        if device in by_uuid:
            slots.append(by_uuid[device])
        elif gpu_uuid in by_uuid and rest.startswith(MILLI_MARK[1:]):
            milli[by_uuid[gpu_uuid].index] += 1
        elif gpu_uuid in by_uuid and rest.count("/") == 1:
            slot = _dynamic_instance(by_uuid[gpu_uuid].index, rest.split("/")[0], assigned, slots)
            unknown += slot is None
            slots += [slot] if slot else []
        else:
            unknown += 1
    slots += [GpuSlot(g) if n >= MILLI_PER_GPU else GpuSlot(g, milli=n) for g, n in sorted(milli.items())]
    return list(dict.fromkeys(slots)), unknown


def _dynamic_instance(gpu: int, profile: str, assigned: tuple[GpuSlot, ...], taken: list[GpuSlot]) -> GpuSlot | None:
    profile = canonical_profile(profile)
    return next((s for s in assigned if (s.index, s.mig) == (gpu, profile) and s not in taken), None)


def _named(slot: GpuSlot, slots: Iterable[GpuSlot]) -> bool:
    """A slot is named by another list when the same; a share when any share sits on the same GPU."""
    if slot.milli:
        return any(other.milli and other.index == slot.index for other in slots)
    return slot in slots


def _assigned_slots(pod: Mapping[str, Any]) -> tuple[GpuSlot, ...]:
    try:
        placement = assignment_from_pod(pod)
    except (AssignmentError, RequestError):
        return ()  # unreadable: as if it had none (Allocate refused it anyway)
    return placement.slots if placement else ()
