"""Whole GPUs, `nvidia.com/gpu`: one device per GPU with MIG off, its ID the GPU's UUID.

The container gets the UUIDs of its assigned GPUs in `NVIDIA_VISIBLE_DEVICES`. Read back from
podresources, a GPU UUID from any plugin (NVIDIA's too) is that whole GPU.
"""

from __future__ import annotations

from collections.abc import Sequence, Set

from gpupack.agent.claim import Claim
from gpupack.agent.device_kind import ContainerGrant, DeviceKind, Held, Host, on_slot_gpu, read_each, take_per_slot
from gpupack.agent.node_gpus import Device, NodeGpus
from gpupack.agent.vendor_nvidia import RESOURCE_GPU, visible_devices
from gpupack.scoring.facts import GpuSlot


class WholeGpu(DeviceKind):
    """`nvidia.com/gpu`: whole GPUs with MIG off."""

    name = "whole GPU"

    def owns(self, resource: str) -> bool:
        """`nvidia.com/gpu`."""
        return resource == RESOURCE_GPU

    def resource_of(self, slot: GpuSlot) -> str | None:
        """A slot that is neither a share nor MIG."""
        return None if slot.mig or slot.milli else RESOURCE_GPU

    def advertise(self, node: NodeGpus) -> dict[str, list[Device]]:
        """Every GPU with MIG off, by UUID."""
        return {RESOURCE_GPU: [node.device(gpu, gpu.uuid) for gpu in node.whole_gpus()]}

    def serving_ids(self, claim: Claim, devices: Sequence[Device], available: Set[str]) -> list[str] | None:
        """The assigned GPUs."""
        return take_per_slot(claim, devices, available, on_slot_gpu)

    def grant(self, claim: Claim, host: Host) -> ContainerGrant:
        """`NVIDIA_VISIBLE_DEVICES=<GPU UUIDs>`."""
        return ContainerGrant(visible_devices([host.gpus.gpus[slot.index].uuid for slot in claim.slots]))

    def read_held(self, ids: Sequence[str], gpus: NodeGpus, assigned: tuple[GpuSlot, ...]) -> Held:
        """A GPU UUID is that whole GPU."""
        by_uuid = gpus.uuid_index()
        return read_each(ids, lambda device_id: GpuSlot(by_uuid[device_id]) if device_id in by_uuid else None)
