"""Plain-Python facts the scoring core is built from, and the placements it hands back.

The extender derives these from Node and Pod objects, the simulator from trace rows; the core never
sees Kubernetes objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum


class MigMode(IntEnum):
    """How a node's GPUs are partitioned (docs/contracts.md#gpupackiomig)."""

    NONE = 0  # whole GPUs and shares only
    STATIC = 1  # the MIG instances that exist are fixed (allocatable / mig-layout)
    DYNAMIC = 2  # gpupack picks GPU and placement of each new instance; a node agent creates it


@dataclass(frozen=True)
class NodeFacts:
    """What a node offers: capacity, GPUs, partitioning, topology and price."""

    name: str
    cpu_milli: int
    memory_bytes: int
    pods: int = 110
    gpu_product: str = ""
    gpu_count: int = 0
    gpu_memory_mib: int = 0
    mig_mode: MigMode = MigMode.NONE
    # static MIG: GPU index -> [(profile, start)], the instances that exist
    mig_layout: dict[int, tuple[tuple[str, int], ...]] = field(default_factory=dict)
    nvlink: tuple[tuple[int, ...], ...] | None = None  # N x N NVLink counts
    numa: tuple[int, ...] | None = None
    spot: bool = False
    hourly_cost: float | None = None
    labels: dict[str, str] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class GpuSlot:
    """One GPU (or part of one) a pod gets: a whole GPU, a share, or a MIG instance."""

    index: int
    milli: int = 0  # share of the GPU, 0 when whole or MIG
    mig: str = ""  # MIG profile name, "" when not MIG
    start: int = -1  # MIG placement start slice

    def to_json(self) -> dict[str, int | str]:
        """The slot as it appears in the `gpupack.io/assignment` annotation."""
        entry: dict[str, int | str] = {"index": self.index}
        if self.mig:
            entry["mig"] = self.mig
            entry["start"] = self.start
        elif self.milli:
            entry["milli"] = self.milli
        return entry


@dataclass(frozen=True)
class Placement:
    """Where one pod goes: the node, its GPU slots, and the CPU/memory it takes there."""

    node: str
    slots: tuple[GpuSlot, ...]
    cpu_milli: int = 0
    memory_bytes: int = 0
    pod_slots: int = 1  # a pod takes one of the node's pod slots; a hold of devices no pod names takes none

    def to_assignment(self) -> dict[str, object]:
        """The `gpupack.io/assignment` annotation value (docs/contracts.md#assignment), as a JSON-ready dict."""
        return {"node": self.node, "gpus": [slot.to_json() for slot in self.slots]}
