"""GPU products: the `nvidia.com/gpu.product` label values gpupack knows, their MIG family and memory.

An unknown product is still schedulable (whole GPUs and shares) but treated as non-MIG.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpupack.scoring.geometry import FAMILIES, MigFamily


@dataclass(frozen=True)
class GpuModel:
    """What gpupack knows about one GPU product."""

    product: str
    memory_mib: int  # 0 when unknown
    mig_family: MigFamily | None


_KNOWN: dict[str, tuple[int, str | None]] = {
    # product label (GPU Feature Discovery): (memory MiB, MIG family)
    "NVIDIA-A100-SXM4-40GB": (40960, "A100-40GB"),
    "NVIDIA-A100-PCIE-40GB": (40960, "A100-40GB"),
    "NVIDIA-A100-SXM4-80GB": (81920, "A100-80GB"),
    "NVIDIA-A100-80GB-PCIe": (81920, "A100-80GB"),
    "NVIDIA-H100-80GB-HBM3": (81559, "H100-80GB"),
    "NVIDIA-H100-SXM5-80GB": (81559, "H100-80GB"),
    "NVIDIA-H100-PCIe": (81559, "H100-80GB"),
    "NVIDIA-H800": (81559, "H100-80GB"),
    "NVIDIA-H100-NVL": (95830, "H100-94GB"),
    "NVIDIA-H200": (143771, "H200-141GB"),
    "NVIDIA-H200-NVL": (143771, "H200-141GB"),
    "NVIDIA-A30": (24576, "A30-24GB"),
    # non-MIG products, listed for their memory (used to prefer the cheaper card that fits)
    "NVIDIA-L4": (23034, None),
    "NVIDIA-L40S": (46068, None),
    "NVIDIA-A10G": (23028, None),
    "NVIDIA-A10": (23028, None),
    "Tesla-T4": (15360, None),
    "Tesla-V100-SXM2-16GB": (16384, None),
    "Tesla-V100-SXM2-32GB": (32768, None),
}


def lookup_model(product: str, memory_mib: int | None = None) -> GpuModel:
    """The model for a product label; `memory_mib` (the `nvidia.com/gpu.memory` label) wins if given."""
    known_memory, family_name = _KNOWN.get(product, (0, None))
    family = FAMILIES[family_name] if family_name else None
    return GpuModel(product, memory_mib if memory_mib else known_memory, family)
