"""What the agent needs from NVML, as a small interface; `real_nvml` and `fake_nvml` implement it.

Profiles are named as nvidia-smi names them without the `MIG ` prefix (`1g.10gb`, `1g.10gb+me`), the
spelling of `scoring.geometry.canonical_profile`. GPUs are addressed by NVML index, which is the index
`nvidia-smi`, `gpupack.io/gpu-topology` and `gpupack.io/assignment` use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gpupack.errors import GpupackError

NVLINK_REMOTE_GPU = 0  # NVML_NVLINK_DEVICE_TYPE_GPU
NVLINK_REMOTE_SWITCH = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH: the peer GPU cannot be read from the link


GPU_IS_LOST = "GPU is lost"  # NVML's text for NVML_ERROR_GPU_IS_LOST


class NvmlError(GpupackError, RuntimeError):
    """An NVML call failed or refused; the message carries NVML's reason (e.g. "Insufficient Resources")."""


@dataclass(frozen=True)
class XidEvent:
    """One `nvmlEventTypeXidCriticalError` event: the GPU it happened on and its XID (the event's data)."""

    gpu: int  # NVML index
    xid: int


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU."""

    index: int
    uuid: str  # GPU-xxxxxxxx-...
    name: str  # NVML's name, e.g. "NVIDIA H100 80GB HBM3"
    bus_id: str  # 00000000:00:06.0
    memory_mib: int

    @property
    def product(self) -> str:
        """The `nvidia.com/gpu.product` label GPU Feature Discovery derives from the name."""
        return self.name.replace(" ", "-")


@dataclass(frozen=True)
class NvLink:
    """One active NVLink of a GPU: what sits at its other end."""

    remote_type: int  # NVLINK_REMOTE_GPU, NVLINK_REMOTE_SWITCH, ...
    remote_bus_id: str


@dataclass(frozen=True)
class MigInstance:
    """A GPU instance with its compute instance: what a container sees as one MIG device."""

    gpu: int
    profile: str  # "3g.40gb", "1g.10gb+me"
    start: int  # first memory slice
    uuid: str  # MIG-xxxxxxxx-... (what NVIDIA_VISIBLE_DEVICES takes)


class Nvml(Protocol):
    """The NVML calls the agent makes. Every method raises NvmlError on NVML failure."""

    def gpus(self) -> list[GpuInfo]:
        """Every GPU, by index; facts that never change (read when NVML was opened), so a lost GPU answers too."""
        ...

    def nvlinks(self, gpu: int) -> list[NvLink]:
        """The GPU's active NVLinks."""
        ...

    def numa_node(self, gpu: int) -> int | None:
        """The GPU's NUMA node from sysfs or NVML; None where both say N/A (-1 / Not Supported)."""
        ...

    def cpu_affinity_numa_nodes(self, gpu: int) -> tuple[int, ...]:
        """The NUMA nodes holding the CPUs NVML says are close to the GPU (what `topo -m` prints)."""
        ...

    def mig_enabled(self, gpu: int) -> bool:
        """Whether MIG mode is currently enabled on the GPU."""
        ...

    def mig_instances(self, gpu: int) -> list[MigInstance]:
        """The GPU's MIG instances (empty when MIG is off)."""
        ...

    def create_mig(self, gpu: int, profile: str, start: int) -> MigInstance:
        """Create a GPU instance of `profile` at `start` and a compute instance spanning it.

        NvmlError with NVML's reason when the placement is occupied, illegal, or MIG is off.
        """
        ...

    def destroy_mig(self, gpu: int, start: int) -> None:
        """Destroy the instance (compute instances first) whose GPU instance starts at `start`."""
        ...

    def watch_xids(self) -> dict[int, str]:
        """Register every GPU for critical XID events (`nvmlDeviceRegisterEvents`); NVML's reason per GPU
        it refused (lost, Not Supported). Events before this call are never delivered, as in NVML."""
        ...

    def next_xid(self, timeout_ms: int) -> XidEvent | None:
        """The next critical XID event on a watched GPU (`nvmlEventSetWait`), None after `timeout_ms`
        without one. NvmlError when the wait fails (`GPU is lost` names no GPU: probe each with `lost`)."""
        ...

    def lost(self, gpu: int) -> bool:
        """Whether NVML answers `GPU is lost` (NVML_ERROR_GPU_IS_LOST) for the GPU now."""
        ...
