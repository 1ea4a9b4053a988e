"""The devices the agent advertises, one resource per device plugin, and the devices each slot means.

Device IDs (docs/contracts.md#device-plugins) — what the kubelet counts and hands back in Allocate:
- `nvidia.com/gpu`: the GPU's UUID, for each GPU with MIG off.
- `gpupack.io/gpu-milli`: `<GPU UUID>/milli-<k>`, k < 1000, for each GPU with MIG off (GPUs x 1000).
- dynamic MIG, `nvidia.com/mig-<profile>` (`.me` spelling): `<GPU UUID>/<profile>/<k>`, k below the
  profile's instances per GPU (the upper bound; gpupack enforces the real geometry).
- static MIG, `nvidia.com/mig-<profile>`: the UUID of each instance that exists.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpupack.agent.nvml import GpuInfo, MigInstance, Nvml
from gpupack.kube.keys import RESOURCE_GPU, RESOURCE_GPU_MILLI, RESOURCE_MIG_PREFIX
from gpupack.scoring.geometry import MAX_FIT, ME_SUFFIX, SHAPES, resource_profile
from gpupack.scoring.gpu_models import lookup_model

MILLI_PER_GPU = 1000


@dataclass(frozen=True)
class Device:
    """One advertised device: its ID, the GPU it lives on and (static MIG) the instance it is."""

    id: str
    gpu: int
    numa: int = -1
    instance: MigInstance | None = None


@dataclass(frozen=True)
class NodeGpus:
    """What NVML showed the agent: the GPUs, which have MIG on, their instances, and the node's MIG mode."""

    gpus: tuple[GpuInfo, ...]
    mig_enabled: tuple[bool, ...]
    instances: tuple[tuple[MigInstance, ...], ...]
    numa: tuple[int, ...]
    dynamic_mig: bool

    @classmethod
    def read(cls, nvml: Nvml, numa: tuple[int, ...], dynamic_mig: bool) -> NodeGpus:
        """Snapshot NVML."""
        gpus = tuple(nvml.gpus())
        enabled = tuple(nvml.mig_enabled(gpu.index) for gpu in gpus)
        instances = tuple(tuple(nvml.mig_instances(gpu.index)) for gpu in gpus)
        return cls(gpus, enabled, instances, numa, dynamic_mig)

    def whole_gpus(self) -> list[GpuInfo]:
        """GPUs with MIG off: whole GPUs and shares live there."""
        return [gpu for gpu, mig in zip(self.gpus, self.mig_enabled, strict=True) if not mig]


def mig_resource(profile: str) -> str:
    """`1g.10gb+me` -> `nvidia.com/mig-1g.10gb.me`."""
    return RESOURCE_MIG_PREFIX + resource_profile(profile)


def dynamic_mig_id(gpu_uuid: str, profile: str, k: int) -> str:
    """The k-th advertised `profile` device on a dynamic-MIG GPU."""
    return f"{gpu_uuid}/{profile}/{k}"


def advertised(node: NodeGpus) -> dict[str, list[Device]]:
    """Resource name -> devices, for every resource this node advertises (empty lists dropped)."""
    numa = node.numa
    out: dict[str, list[Device]] = {
        RESOURCE_GPU: [Device(gpu.uuid, gpu.index, numa[gpu.index]) for gpu in node.whole_gpus()],
        RESOURCE_GPU_MILLI: [
            Device(f"{gpu.uuid}/milli-{k}", gpu.index, numa[gpu.index])
            for gpu in node.whole_gpus()
            for k in range(MILLI_PER_GPU)
        ],
    }
    for gpu, mig, instances in zip(node.gpus, node.mig_enabled, node.instances, strict=True):
        if not mig:
            continue
        if node.dynamic_mig:
            for profile, bound in profile_bounds(gpu.product).items():
                devices = out.setdefault(mig_resource(profile), [])
                ids = [dynamic_mig_id(gpu.uuid, profile, k) for k in range(bound)]
                devices += [Device(device_id, gpu.index, numa[gpu.index]) for device_id in ids]
        else:
            for instance in instances:
                devices = out.setdefault(mig_resource(instance.profile), [])
                devices.append(Device(instance.uuid, gpu.index, numa[gpu.index], instance))
    return {resource: devices for resource, devices in out.items() if devices}


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
