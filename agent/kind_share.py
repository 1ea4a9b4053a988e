"""Shares, `gpupack.io/gpu-milli`: 1000 devices per GPU with MIG off, `<GPU UUID>/milli-<k>`.

A share container is handed the whole assigned GPU (CUDA time-slicing; no memory isolation, docs/agent.md)
and its milli amount in `GPUPACK_GPU_MILLI`, informational. Every container of a pod that asks for milli
gets the pod's one share slot, each with its own amount. Read back from podresources, the milli IDs of
a GPU are a share of that GPU, milli = how many (1000 or more: the whole GPU).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence, Set

from gpupack.agent.claim import Ask, Claim
from gpupack.agent.device_kind import ContainerGrant, DeviceKind, Held, Host, on_slot_gpu, take_per_slot
from gpupack.agent.node_gpus import Device, NodeGpus
from gpupack.agent.vendor_nvidia import visible_devices
from gpupack.kube.keys import RESOURCE_GPU_MILLI
from gpupack.scoring.facts import GpuSlot
from gpupack.scoring.request import MILLI_PER_GPU

MILLI_MARK = "milli-"
MILLI_ENV = "GPUPACK_GPU_MILLI"  # informational: time-slicing does not enforce it


def milli_id(gpu_uuid: str, k: int) -> str:
    """The k-th milli device of a GPU."""
    return f"{gpu_uuid}/{MILLI_MARK}{k}"


class Share(DeviceKind):
    """`gpupack.io/gpu-milli`: thousandths of a GPU with MIG off, time-sliced."""

    name = "share"

    def owns(self, resource: str) -> bool:
        """`gpupack.io/gpu-milli`."""
        return resource == RESOURCE_GPU_MILLI

    def resource_of(self, slot: GpuSlot) -> str | None:
        """A slot with milli."""
        return RESOURCE_GPU_MILLI if slot.milli and not slot.mig else None

    def advertise(self, node: NodeGpus) -> dict[str, list[Device]]:
        """1000 devices per GPU with MIG off."""
        devices = [node.device(gpu, milli_id(gpu.uuid, k)) for gpu in node.whole_gpus() for k in range(MILLI_PER_GPU)]
        return {RESOURCE_GPU_MILLI: devices}

    def serving_ids(self, claim: Claim, devices: Sequence[Device], available: Set[str]) -> list[str] | None:
        """As many milli devices of the assigned GPU as the container asks for."""
        return take_per_slot(claim, devices, available, on_slot_gpu, count=claim.amount)

    def grant(self, claim: Claim, host: Host) -> ContainerGrant:
        """The whole GPU's UUID, and the milli amount."""
        uuids = [host.gpus.gpus[slot.index].uuid for slot in claim.slots]
        return ContainerGrant(visible_devices(uuids) | {MILLI_ENV: str(claim.amount)})

    def split(self, slots: Sequence[GpuSlot], asks: Sequence[Ask]) -> list[tuple[GpuSlot, ...]] | None:
        """Every container gets the one share slot."""
        return [tuple(slots[:1]) for _ in asks]

    def read_held(self, ids: Sequence[str], gpus: NodeGpus, assigned: tuple[GpuSlot, ...]) -> Held:
        """Milli IDs summed per GPU: a share of that GPU, or the whole GPU from 1000 on."""
        by_uuid = gpus.uuid_index()
        milli: Counter[int] = Counter()
        rest: list[str] = []
        for device_id in ids:
            gpu_uuid, _, unit = device_id.partition("/")
            if gpu_uuid in by_uuid and unit.startswith(MILLI_MARK):
                milli[by_uuid[gpu_uuid]] += 1
            else:
                rest.append(device_id)
        slots = [GpuSlot(g) if n >= MILLI_PER_GPU else GpuSlot(g, milli=n) for g, n in sorted(milli.items())]
        return slots, rest
