"""What one pod asks for, in the scoring core's terms (docs/contracts.md#pod-resources), and its validation."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from gpupack.errors import GpupackError
from gpupack.scoring.geometry import resource_profile

MILLI_PER_GPU = 1000  # the milli unit: thousandths of one GPU (gpupack.io/gpu-milli, openb's gpu_milli)
MAX_GPUS_PER_NODE = 16
MAX_MIG_INSTANCES = 64  # 8 GPUs x 7 instances, with headroom
MAX_CPU_MILLI = 10**9  # a million cores
MAX_MEMORY_BYTES = 1 << 60


class RequestError(GpupackError, ValueError):
    """A pod request that gpupack cannot place anywhere, whatever the cluster looks like."""


class Kind(IntEnum):
    """The one kind of GPU resource a pod asks for."""

    NONE = 0  # CPU and memory only
    WHOLE = 1  # nvidia.com/gpu: N
    SHARE = 2  # gpupack.io/gpu-milli: M
    MIG = 3  # nvidia.com/mig-<profile>: K


@dataclass(frozen=True)
class PodRequest:
    """Resources of one pod, summed over its containers, and its placement preferences."""

    cpu_milli: int = 0
    memory_bytes: int = 0
    kind: Kind = Kind.NONE
    gpus: int = 0  # WHOLE: number of entire GPUs
    milli: int = 0  # SHARE: thousandths of one GPU
    mig: tuple[tuple[str, int], ...] = ()  # MIG: (profile, instances); nvidia-smi's names (1g.10gb+me)
    allowed_products: frozenset[str] | None = None  # None: any GPU product
    interruptible: bool = False

    def __post_init__(self) -> None:
        validate(self)

    @property
    def gpu_demand(self) -> float:
        """GPUs this pod takes, in whole-GPU units (a share counts its fraction; MIG counts 0)."""
        if self.kind == Kind.WHOLE:
            return float(self.gpus)
        if self.kind == Kind.SHARE:
            return self.milli / MILLI_PER_GPU
        return 0.0

    @property
    def mig_instances(self) -> int:
        return sum(count for _, count in self.mig)


def validate(request: PodRequest) -> None:
    """Raise RequestError with a reason when a request is malformed or absurd."""
    if not 0 <= request.cpu_milli <= MAX_CPU_MILLI:
        raise RequestError(f"cpu request {request.cpu_milli}m is out of range")
    if not 0 <= request.memory_bytes <= MAX_MEMORY_BYTES:
        raise RequestError(f"memory request {request.memory_bytes} bytes is out of range")
    kinds_used = [
        name
        for name, used in (("whole GPUs", request.gpus), ("GPU share", request.milli), ("MIG", request.mig))
        if used
    ]
    if len(kinds_used) > 1:
        raise RequestError(f"pod mixes GPU request kinds ({' and '.join(kinds_used)}); ask for one kind")
    expected = {Kind.WHOLE: "whole GPUs", Kind.SHARE: "GPU share", Kind.MIG: "MIG"}.get(request.kind)
    if kinds_used != ([expected] if expected else []):
        raise RequestError(f"request kind {request.kind.name} does not match its quantities")
    if request.kind == Kind.WHOLE and not 1 <= request.gpus <= MAX_GPUS_PER_NODE:
        raise RequestError(f"nvidia.com/gpu: {request.gpus} is out of range 1..{MAX_GPUS_PER_NODE}")
    if request.kind == Kind.SHARE and not 1 <= request.milli < MILLI_PER_GPU:
        raise RequestError(f"gpupack.io/gpu-milli: {request.milli} is out of range 1..999")
    if request.kind == Kind.MIG:
        for profile, count in request.mig:
            if count < 1:
                raise RequestError(f"nvidia.com/mig-{resource_profile(profile)}: {count} must be at least 1")
        if request.mig_instances > MAX_MIG_INSTANCES:
            raise RequestError(f"{request.mig_instances} MIG instances exceed {MAX_MIG_INSTANCES}")
    if request.allowed_products is not None and not request.allowed_products:
        raise RequestError("GPU product constraint allows no product")
