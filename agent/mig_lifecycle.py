"""Dynamic MIG: create the instance a pod's assignment places, destroy instances no live pod holds.

Live pods are those bound to this node that have not finished (Succeeded / Failed) and still exist;
each holds the `(gpu, profile, start)` of its assignment's MIG slots. Reconciling destroys every
instance on a MIG-enabled GPU that no live pod holds — on start (the agent may have missed deletions
while it was down) and whenever the pod list changes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from gpupack.agent.nvml import MigInstance, Nvml, NvmlError
from gpupack.agent.pods import live_assigned
from gpupack.errors import GpupackError
from gpupack.scoring.facts import GpuSlot
from gpupack.scoring.geometry import canonical_profile

log = logging.getLogger(__name__)
Held = set[tuple[int, str, int]]  # (gpu, profile, start)


class MigCreateError(GpupackError, RuntimeError):
    """NVML refused to create an assigned instance; the message names the slot and NVML's reason."""


def ensure_instance(nvml: Nvml, slot: GpuSlot) -> MigInstance:
    """The instance at the slot's placement, created when it does not exist yet (idempotent)."""
    profile = canonical_profile(slot.mig)
    for instance in nvml.mig_instances(slot.index):
        if instance.start == slot.start and instance.profile == profile:
            return instance
    try:
        return nvml.create_mig(slot.index, profile, slot.start)
    except NvmlError as exc:
        raise MigCreateError(f"NVML refused to create {profile}@{slot.start} on GPU {slot.index}: {exc}") from None


def held_instances(pods: Iterable[Mapping[str, Any]], node: str) -> Held:
    """MIG placements named by the assignments of pods on `node` that have not finished."""
    return {(slot.index, slot.mig, slot.start) for slot in live_assigned(pods, node) if slot.mig}


def unheld(nvml: Nvml, held: Held) -> list[MigInstance]:
    """Instances on MIG-enabled GPUs that no live pod holds."""
    return [
        instance
        for gpu in nvml.gpus()
        if nvml.mig_enabled(gpu.index)
        for instance in nvml.mig_instances(gpu.index)
        if (gpu.index, instance.profile, instance.start) not in held
    ]


def reconcile(nvml: Nvml, held: Held) -> list[MigInstance]:
    """Destroy instances on MIG-enabled GPUs that no live pod holds; returns the ones destroyed."""
    destroyed = []
    for instance in unheld(nvml, held):
        try:
            nvml.destroy_mig(instance.gpu, instance.start)
        except NvmlError as exc:  # in use by a process, most likely: try again next time
            log.warning("cannot destroy %s@%d on GPU %d: %s", instance.profile, instance.start, instance.gpu, exc)
            continue
        destroyed.append(instance)
    return destroyed
