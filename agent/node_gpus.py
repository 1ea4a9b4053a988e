"""What NVML showed the agent (`NodeGpus`) and one device it advertises to the kubelet (`Device`)."""

from __future__ import annotations

from dataclasses import dataclass

from gpupack.agent.nvml import GpuInfo, MigInstance, Nvml


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

    def device(self, gpu: GpuInfo, device_id: str, instance: MigInstance | None = None) -> Device:
        """A device on `gpu`, with that GPU's NUMA node."""
        return Device(device_id, gpu.index, self.numa[gpu.index], instance)

    def uuid_index(self) -> dict[str, int]:
        """GPU UUID -> NVML index."""
        return {gpu.uuid: gpu.index for gpu in self.gpus}
