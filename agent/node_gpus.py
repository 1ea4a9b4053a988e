"""What NVML showed the agent (`NodeGpus`) and one device it advertises to the kubelet (`Device`)."""

from __future__ import annotations

from dataclasses import dataclass

from gpupack.agent.nvml import GpuInfo, MigInstance, Nvml, NvmlError


@dataclass(frozen=True)
class Device:
    """One advertised device: its ID, the GPU it lives on, (static MIG) the instance it is, and its health."""

    id: str
    gpu: int
    numa: int = -1
    instance: MigInstance | None = None
    healthy: bool = True  # False: its GPU is unhealthy or cordoned (agent.gpu_health)


@dataclass(frozen=True)
class NodeGpus:
    """What NVML showed the agent: the GPUs, which have MIG on, their instances, and the node's MIG mode."""

    gpus: tuple[GpuInfo, ...]
    mig_enabled: tuple[bool, ...]
    instances: tuple[tuple[MigInstance, ...], ...]
    numa: tuple[int, ...]
    dynamic_mig: bool

    @classmethod
    def read(
        cls,
        nvml: Nvml,
        numa: tuple[int, ...],
        dynamic_mig: bool,
        lost: frozenset[int] = frozenset(),
        previous: NodeGpus | None = None,
    ) -> NodeGpus:
        """Snapshot NVML. A GPU in `lost`, or one NVML fails on, keeps its MIG state of `previous` (without one,
        NVML's answer stands): a lost GPU must not change the node's devices or its `mig-layout`."""
        gpus = tuple(nvml.gpus())
        states = [_mig_state(nvml, gpu.index, gpu.index in lost, previous) for gpu in gpus]
        enabled = tuple(state[0] for state in states)
        instances = tuple(state[1] for state in states)
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


def _mig_state(
    nvml: Nvml, gpu: int, lost: bool, previous: NodeGpus | None
) -> tuple[bool, tuple[MigInstance, ...]]:
    kept = None
    if previous is not None and gpu < len(previous.gpus):
        kept = (previous.mig_enabled[gpu], previous.instances[gpu])
    if lost and kept is not None:
        return kept
    try:
        return nvml.mig_enabled(gpu), tuple(nvml.mig_instances(gpu))
    except NvmlError:
        if kept is None:
            raise
        return kept
