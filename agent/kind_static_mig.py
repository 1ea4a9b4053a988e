"""Static MIG, `nvidia.com/mig-<profile>` on nodes not annotated `gpupack.io/mig: dynamic`.

The operator made the instances; each one that exists is advertised by its MIG UUID, and a claim gets the
very instance at its slot's placement (profile@start). Read back from podresources, a MIG UUID from any
plugin is that instance. A GPU whose MIG mode is on with no instance on it is reported blocked: nothing on
it can be handed out, and `gpupack serve` would otherwise count it a whole GPU.
"""

from __future__ import annotations

from collections.abc import Sequence, Set

from gpupack.agent.blocked_slots import Blocked
from gpupack.agent.claim import Claim
from gpupack.agent.device_kind import (
    AllocationError,
    ContainerGrant,
    Held,
    Host,
    read_each,
    take_per_slot,
)
from gpupack.agent.kind_mig import MigKind
from gpupack.agent.node_gpus import Device, NodeGpus
from gpupack.agent.nvml import MigInstance
from gpupack.agent.vendor_nvidia import mig_resource, visible_devices
from gpupack.scoring.facts import GpuSlot

EMPTY_MIG_GPU = "MIG mode is on and the GPU holds no MIG instance: nothing on it can be handed out"


class StaticMig(MigKind):
    """MIG instances an operator made, by their UUID."""

    name = "static MIG"

    def advertise(self, node: NodeGpus) -> dict[str, list[Device]]:
        """Every instance that exists, by its UUID (none on a dynamic-MIG node)."""
        out: dict[str, list[Device]] = {}
        if node.dynamic_mig:
            return out
        for gpu, mig, instances in zip(node.gpus, node.mig_enabled, node.instances, strict=True):
            if not mig:
                continue
            for instance in instances:
                out.setdefault(mig_resource(instance.profile), []).append(node.device(gpu, instance.uuid, instance))
        return out

    def serving_ids(self, claim: Claim, devices: Sequence[Device], available: Set[str]) -> list[str] | None:
        """The instance at each slot's placement."""
        return take_per_slot(claim, devices, available, _is_instance)

    def grant(self, claim: Claim, host: Host) -> ContainerGrant:
        """`NVIDIA_VISIBLE_DEVICES=<MIG UUIDs>`."""
        return ContainerGrant(visible_devices([_instance(claim, slot, host.gpus).uuid for slot in claim.slots]))

    def read_held(self, ids: Sequence[str], gpus: NodeGpus, assigned: tuple[GpuSlot, ...]) -> Held:
        """A MIG UUID is that instance, profile@start, wherever it came from."""
        by_uuid = {i.uuid: GpuSlot(i.gpu, mig=i.profile, start=i.start) for row in gpus.instances for i in row}
        return read_each(ids, by_uuid.get)

    def tidy(self, host: Host) -> list[Blocked]:
        """Whole-GPU blocks for the MIG-enabled GPUs without instances (not on a dynamic-MIG node)."""
        gpus = host.gpus
        if gpus.dynamic_mig:
            return []
        return [
            Blocked(GpuSlot(gpu.index), EMPTY_MIG_GPU)
            for gpu in gpus.gpus
            if gpus.mig_enabled[gpu.index] and not gpus.instances[gpu.index]
        ]


def _is_instance(device: Device, slot: GpuSlot) -> bool:
    at = device.instance
    return at is not None and (device.gpu, at.profile, at.start) == (slot.index, slot.mig, slot.start)


def _instance(claim: Claim, slot: GpuSlot, gpus: NodeGpus) -> MigInstance:
    for instance in gpus.instances[slot.index]:
        if (instance.profile, instance.start) == (slot.mig, slot.start):
            return instance
    raise AllocationError(f"pod {claim.pod}: no MIG instance {slot.mig}@{slot.start} on GPU {slot.index}")
