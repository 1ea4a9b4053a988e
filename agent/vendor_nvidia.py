"""NVIDIA's names, in one place: the resource names of its device plugin and what its container toolkit reads.

The device kinds (`agent.kind_*`) take every vendor name from here. The two resource names are the ones
`gpupack serve` reads pods' requests by (kube/keys.py, docs/contracts.md), so they are taken from there:
the agent and the scheduler cannot spell them differently. The agent hands no device nodes or mounts of
its own: NVIDIA's container toolkit adds `/dev/nvidia*` for the UUIDs in `NVIDIA_VISIBLE_DEVICES`.
"""

from __future__ import annotations

from gpupack.kube import keys
from gpupack.scoring.geometry import resource_profile

RESOURCE_GPU = keys.RESOURCE_GPU  # nvidia.com/gpu: whole GPUs
RESOURCE_MIG_PREFIX = keys.RESOURCE_MIG_PREFIX  # nvidia.com/mig-<profile>: MIG instances
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"  # what NVIDIA's container toolkit reads (GPU or MIG UUIDs)


def mig_resource(profile: str) -> str:
    """`1g.10gb+me` -> `nvidia.com/mig-1g.10gb.me`."""
    return RESOURCE_MIG_PREFIX + resource_profile(profile)


def is_mig_resource(resource: str) -> bool:
    """Whether `resource` is a `nvidia.com/mig-<profile>` name."""
    return resource.startswith(RESOURCE_MIG_PREFIX)


def visible_devices(uuids: list[str]) -> dict[str, str]:
    """The container environment that gives it these GPU or MIG UUIDs."""
    return {VISIBLE_DEVICES_ENV: ",".join(uuids)}
