"""Dynamic MIG, `nvidia.com/mig-<profile>` on nodes annotated `gpupack.io/mig: dynamic`.

Every profile of a MIG GPU's family is advertised with its upper bound, `<GPU UUID>/<profile>/<k>`, k below
the profile's instances per empty GPU (`.me` profiles: one); gpupack enforces the real geometry. Before
Allocate answers, the instance at the assigned placement is created (or reused) and handed by its MIG
UUID; NVML's refusal is an allocation error and the slot is reported blocked for a while. Every loop,
instances no live pod holds are destroyed; those that cannot be are reported blocked. Read back from
podresources, a dynamic ID is the pod's own assigned instance of that profile on that GPU.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence, Set

from gpupack.agent.agent_metrics import MIG_CREATE_REFUSALS
from gpupack.agent.blocked_slots import Blocked
from gpupack.agent.claim import Claim
from gpupack.agent.device_kind import (
    AllocationError,
    ContainerGrant,
    Held,
    Host,
    on_slot_gpu,
    take_per_slot,
)
from gpupack.agent.kind_mig import MigKind
from gpupack.agent.mig_lifecycle import MigCreateError, ensure_instance, held_instances, reconcile, unheld
from gpupack.agent.node_gpus import Device, NodeGpus
from gpupack.agent.nvml import MigInstance
from gpupack.agent.vendor_nvidia import mig_resource, visible_devices
from gpupack.scoring.facts import GpuSlot
from gpupack.scoring.geometry import MAX_FIT, ME_SUFFIX, SHAPES, canonical_profile
from gpupack.scoring.gpu_models import lookup_model

log = logging.getLogger(__name__)
LEFTOVER = "MIG instance exists in NVML, no pod holds it, and it could not be destroyed"


def dynamic_mig_id(gpu_uuid: str, profile: str, k: int) -> str:
    """The k-th advertised `profile` device on a dynamic-MIG GPU."""
    return f"{gpu_uuid}/{profile}/{k}"


def profile_bounds(product: str) -> dict[str, int]:
    """Profile -> most instances on one empty GPU (a `+me` profile: 1), from scoring.geometry."""
    family = lookup_model(product).mig_family
    if family is None:
        return {}
    bounds: dict[str, int] = {}
    for profile, shape_id in sorted(family.profiles.items()):
        bounds[profile] = int(MAX_FIT[shape_id, 0])
        if SHAPES[shape_id].size == 1:  # NVIDIA offers media extensions on the one-slice profile
            bounds[profile + ME_SUFFIX] = 1
    return bounds


class DynamicMig(MigKind):
    """MIG instances the agent creates at the assigned placement."""

    name = "dynamic MIG"

    def advertise(self, node: NodeGpus) -> dict[str, list[Device]]:
        """Each profile's upper bound on every MIG-enabled GPU (only on a dynamic-MIG node)."""
        out: dict[str, list[Device]] = {}
        if not node.dynamic_mig:
            return out
        for gpu, mig in zip(node.gpus, node.mig_enabled, strict=True):
            if not mig:
                continue
            for profile, bound in profile_bounds(gpu.product).items():
                ids = [dynamic_mig_id(gpu.uuid, profile, k) for k in range(bound)]
                out.setdefault(mig_resource(profile), []).extend(node.device(gpu, device_id) for device_id in ids)
        return out

    def serving_ids(self, claim: Claim, devices: Sequence[Device], available: Set[str]) -> list[str] | None:
        """A device of the slot's profile (the resource) on the slot's GPU."""
        return take_per_slot(claim, devices, available, on_slot_gpu)

    def grant(self, claim: Claim, host: Host) -> ContainerGrant:
        """Create (or reuse) each assigned instance; `NVIDIA_VISIBLE_DEVICES=<MIG UUIDs>`."""
        return ContainerGrant(visible_devices([_ensure(claim, slot, host).uuid for slot in claim.slots]))

    def read_held(self, ids: Sequence[str], gpus: NodeGpus, assigned: tuple[GpuSlot, ...]) -> Held:
        """A dynamic ID is the pod's own assigned instance of that profile on that GPU, each taken once."""
        by_uuid = gpus.uuid_index()
        slots: list[GpuSlot] = []
        rest: list[str] = []
        for device_id in ids:
            gpu_uuid, _, tail = device_id.partition("/")
            slot = None
            if gpu_uuid in by_uuid and tail.count("/") == 1:
                slot = _own_instance(by_uuid[gpu_uuid], tail.split("/")[0], assigned, slots)
            if slot is None:
                rest.append(device_id)
            else:
                slots.append(slot)
        return slots, rest

    def tidy(self, host: Host) -> list[Blocked]:
        """Destroy instances no live pod holds; those that cannot be destroyed are blocked."""
        if not host.gpus.dynamic_mig:
            return []
        held = held_instances(host.pods.pods_on_node(), host.node)
        for gone in reconcile(host.nvml, held):
            log.info("destroyed %s@%d on GPU %d: no live pod holds it", gone.profile, gone.start, gone.gpu)
            host.refusals.freed(gone.gpu)
        return [Blocked(GpuSlot(i.gpu, mig=i.profile, start=i.start), LEFTOVER) for i in unheld(host.nvml, held)]


def _ensure(claim: Claim, slot: GpuSlot, host: Host) -> MigInstance:
    """The slot's instance; when NVML refuses, the instances no live pod holds are destroyed and it is tried
    once more: a pod may be bound moments after the one before it ended, before the loop's reconcile."""
    try:
        try:
            instance = ensure_instance(host.nvml, slot)
        except MigCreateError:
            if not _free_unheld(host):
                raise
            instance = ensure_instance(host.nvml, slot)
    except MigCreateError as exc:
        host.refusals.record(slot, str(exc))
        MIG_CREATE_REFUSALS.inc()
        raise AllocationError(f"pod {claim.pod} container {claim.container}: {exc}") from None
    host.refusals.created(slot)
    return instance


def _free_unheld(host: Host) -> bool:
    """Destroy the instances no live pod holds now; whether any was."""
    destroyed = reconcile(host.nvml, held_instances(host.pods.pods_on_node(), host.node))
    for gone in destroyed:
        log.info("destroyed %s@%d on GPU %d to make room: no live pod holds it", gone.profile, gone.start, gone.gpu)
        host.refusals.freed(gone.gpu)
    return bool(destroyed)


def _own_instance(gpu: int, profile: str, assigned: tuple[GpuSlot, ...], taken: list[GpuSlot]) -> GpuSlot | None:
    profile = canonical_profile(profile)
    return next((s for s in assigned if (s.index, s.mig) == (gpu, profile) and s not in taken), None)
