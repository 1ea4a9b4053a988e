"""A fake NVML for tests: GPUs, NVLinks, NUMA, MIG mode and MIG create/destroy as NVML does them.

MIG placement rules come from the per-profile table NVML reports (`nvmlDeviceGetGpuInstanceProfileInfo`:
instance limit; `...PossiblePlacements`: (start, size) pairs), not from `scoring.geometry`, so the
property test that compares the two checks gpupack's geometry against what NVML really allows. A
create is refused, with NVML's error string, when MIG is off, the profile does not exist, the
placement is not one of the profile's, it overlaps an instance, or the profile's instance limit is
reached (that limit is 1 for `1g.10gb+me`: one media-extension instance per GPU).

Health as NVML shows it: a GPU in `lost` answers `GPU is lost` where RealNvml's NVML call would (queries
RealNvml tolerates answer as RealNvml does: no NVLinks, MIG off); `raise_xid` is the driver reporting an
XID, delivered once by `next_xid`, and only after `watch_xids` registered the GPU (NVML keeps no past
events).

`agent.fake_nvml_file` keeps a `FakeNvml` in a JSON file (`gpupack agent --fake-nvml`, GPU-less clusters).
"""

from __future__ import annotations

import json
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpupack.agent.kind_dynamic_mig import profile_bounds
from gpupack.agent.nvml import (
    GPU_IS_LOST,
    NVLINK_REMOTE_GPU,
    NVLINK_REMOTE_SWITCH,
    GpuInfo,
    MigInstance,
    NvLink,
    NvmlError,
    XidEvent,
)
from gpupack.scoring.geometry import SHAPES, resolve_profile, slice_bits
from gpupack.scoring.gpu_models import lookup_model

_FAKE_NAMESPACE = uuid.UUID("5c1f1a52-2f0e-4a4c-9d0b-677070706163")


@dataclass(frozen=True)
class GiProfile:
    """What NVML reports for one GPU instance profile."""

    name: str  # "1g.10gb+me"
    instances: int  # most instances of this profile on one GPU
    placements: tuple[tuple[int, int], ...]  # (start, size) in memory slices


@dataclass
class FakeGpu:
    """One fake GPU and its MIG instances (by start)."""

    info: GpuInfo
    links: list[NvLink] = field(default_factory=list)
    numa: int | None = None
    cpu_numa: tuple[int, ...] = (0,)
    mig_enabled: bool = False
    profiles: dict[str, GiProfile] = field(default_factory=dict)
    instances: dict[int, MigInstance] = field(default_factory=dict)


def profiles_from_capture(gi_profiles: dict[str, object]) -> dict[str, GiProfile]:
    """The profile table of one GPU in `nvml-h100x4.json` (entries NVML did not support skipped)."""
    table: dict[str, GiProfile] = {}
    for entry in gi_profiles.values():
        if isinstance(entry, dict):
            name = str(entry["name"]).removeprefix("MIG ")
            placements = tuple((int(start), int(size)) for start, size in entry["placements"])
            table[name] = GiProfile(name, int(entry["instances"]), placements)
    return table


def profiles_from_geometry(product: str) -> dict[str, GiProfile]:
    """A profile table for a product without a capture, from gpupack's MIG table (empty: non-MIG)."""
    family = lookup_model(product).mig_family
    if family is None:
        return {}
    table: dict[str, GiProfile] = {}
    for name, bound in profile_bounds(product).items():
        shape = SHAPES[resolve_profile(family, name)[0]]
        table[name] = GiProfile(name, bound, tuple((start, shape.size) for start in shape.starts))
    return table


class FakeNvml:
    """`agent.nvml.Nvml` in memory. `created` / `destroyed` record (gpu, profile, start) calls that succeeded."""

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.devices = gpus
        self.created: list[tuple[int, str, int]] = []
        self.destroyed: list[tuple[int, str, int]] = []
        self.busy: set[tuple[int, int]] = set()  # (gpu, start) of instances a process uses: destroy refused
        self.mig_serial = 0  # MIG instances created so far: a new instance's UUID derives from it
        self.lost_gpus: set[int] = set()  # GPUs NVML answers `GPU is lost` for
        self.watched: set[int] = set()  # GPUs registered for critical XID events
        self._xids: deque[XidEvent] = deque()  # reported, not yet waited for

    @classmethod
    def from_capture(cls, path: Path, *, mig_enabled: bool | None = None, cpu_numa: tuple[int, ...] = (0,)) -> FakeNvml:
        """The GPUs of a `nvml-h100x4.json`-style capture. The capture has no CPU affinity: `cpu_numa`
        stands for it (its host's `topo -m` prints CPU affinity 0-63, NUMA 0)."""
        data = json.loads(path.read_text())
        gpus = []
        for entry in data["gpus"]:
            info = GpuInfo(int(entry["index"]), entry["uuid"], entry["name"], entry["busId"], int(entry["memory_MiB"]))
            active = [link for link in entry["links"] if link["state"] == 1]
            links = [NvLink(int(link["remote_type"]), link["remote_bus"]) for link in active]
            enabled = bool(entry["mig_mode"][0]) if mig_enabled is None else mig_enabled
            numa = _capture_numa(entry["numa_sysfs"], entry["numa_nvml"])
            gpus.append(FakeGpu(info, links, numa, cpu_numa, enabled, profiles_from_capture(entry["gi_profiles"])))
        return cls(gpus)

    @classmethod
    def build(
        cls,
        name: str | Sequence[str] = "NVIDIA H100 80GB HBM3",
        count: int = 4,
        *,
        mig_enabled: bool = False,
        nvlink: Sequence[Sequence[int]] | None = None,
        nvswitch_links: int = 0,
        numa: Sequence[int | None] | None = None,
    ) -> FakeNvml:
        """`count` GPUs of one product (or one GPU per name of a list): direct NVLinks per `nvlink[i][j]`,
        or `nvswitch_links` each into a switch. GPU UUIDs derive from name and index (stable)."""
        names = [name] * count if isinstance(name, str) else list(name)
        count = len(names)
        gpus = []
        for i, gpu_name in enumerate(names):
            gpu_uuid = f"GPU-{uuid.uuid5(_FAKE_NAMESPACE, f'{gpu_name}/{i}')}"
            memory = lookup_model(gpu_name.replace(" ", "-")).memory_mib or 81559
            info = GpuInfo(i, gpu_uuid, gpu_name, f"00000000:{i + 16:02x}:00.0", memory)
            links = [NvLink(NVLINK_REMOTE_SWITCH, "FFFFFFFF:FF:FF.0")] * nvswitch_links
            for j, width in enumerate((nvlink or [[]] * count)[i]):
                links += [NvLink(NVLINK_REMOTE_GPU, f"00000000:{j + 16:02x}:00.0")] * (width if j != i else 0)
            node = None if numa is None else numa[i]
            cpu_numa = (node if node is not None else 0,)
            gpus.append(FakeGpu(info, links, node, cpu_numa, mig_enabled, profiles_from_geometry(info.product)))
        return cls(gpus)

    # --- agent.nvml.Nvml
    def gpus(self) -> list[GpuInfo]:
        return [gpu.info for gpu in self.devices]

    def nvlinks(self, gpu: int) -> list[NvLink]:
        return [] if gpu in self.lost_gpus else list(self._gpu(gpu).links)

    def numa_node(self, gpu: int) -> int | None:
        return self._gpu(gpu).numa

    def cpu_affinity_numa_nodes(self, gpu: int) -> tuple[int, ...]:
        return self._alive(gpu).cpu_numa

    def mig_enabled(self, gpu: int) -> bool:
        return self._gpu(gpu).mig_enabled and gpu not in self.lost_gpus

    def mig_instances(self, gpu: int) -> list[MigInstance]:
        if not self.mig_enabled(gpu):
            return []
        return [self._gpu(gpu).instances[start] for start in sorted(self._gpu(gpu).instances)]

    def create_mig(self, gpu: int, profile: str, start: int) -> MigInstance:
        device = self._alive(gpu)
        self._check_create(device, profile, start)
        self.mig_serial += 1
        mig_uuid = f"MIG-{uuid.uuid5(_FAKE_NAMESPACE, f'{device.info.uuid}/{start}/{self.mig_serial}')}"
        instance = MigInstance(gpu, profile, start, mig_uuid)
        device.instances[start] = instance
        self.created.append((gpu, profile, start))
        return instance

    def restore_mig(self, gpu: int, profile: str, start: int, mig_uuid: str | None = None) -> MigInstance:
        """Put back an instance that already exists (state read from a file), under `create_mig`'s rules;
        not recorded in `created`. Without `mig_uuid`, one derived from GPU, profile and start."""
        device = self._gpu(gpu)
        self._check_create(device, profile, start)
        if mig_uuid is None:
            mig_uuid = f"MIG-{uuid.uuid5(_FAKE_NAMESPACE, f'{device.info.uuid}/{profile}@{start}')}"
        instance = MigInstance(gpu, profile, start, mig_uuid)
        device.instances[start] = instance
        return instance

    def destroy_mig(self, gpu: int, start: int) -> None:
        device = self._alive(gpu)
        if start not in device.instances:
            raise NvmlError(f"Not Found: no GPU instance starts at slice {start} on GPU {gpu}")
        if (gpu, start) in self.busy:
            raise NvmlError(f"In use by another client: GPU instance at slice {start} on GPU {gpu}")
        instance = device.instances.pop(start)
        self.destroyed.append((gpu, instance.profile, start))

    def watch_xids(self) -> dict[int, str]:
        refused = {gpu: GPU_IS_LOST for gpu in sorted(self.lost_gpus)}
        self.watched |= {gpu.info.index for gpu in self.devices} - set(refused)
        return refused

    def next_xid(self, timeout_ms: int) -> XidEvent | None:
        return self._xids.popleft() if self._xids else None

    def lost(self, gpu: int) -> bool:
        self._gpu(gpu)
        return gpu in self.lost_gpus

    # --- the driver's side: what happens to a GPU
    def raise_xid(self, gpu: int, xid: int) -> None:
        """The driver reports XID `xid` on `gpu`: an event for `next_xid` if the GPU is watched."""
        if gpu in self.watched:
            self._xids.append(XidEvent(gpu, xid))

    # --- rules
    def _gpu(self, gpu: int) -> FakeGpu:
        if not 0 <= gpu < len(self.devices):
            raise NvmlError(f"Invalid Argument: no GPU {gpu}")
        return self.devices[gpu]

    def _alive(self, gpu: int) -> FakeGpu:
        device = self._gpu(gpu)
        if gpu in self.lost_gpus:
            raise NvmlError(f"{GPU_IS_LOST}: GPU {gpu}")
        return device

    @staticmethod
    def _check_create(device: FakeGpu, profile: str, start: int) -> None:
        if not device.mig_enabled:
            raise NvmlError("Not Supported: MIG mode is disabled")
        info = device.profiles.get(profile)
        if info is None:
            raise NvmlError(f"Not Supported: no GPU instance profile {profile}")
        sizes = dict(info.placements)
        if start not in sizes:
            raise NvmlError(f"Invalid Argument: {profile} cannot be placed at slice {start}")
        occupied = 0
        for other in device.instances.values():
            occupied |= slice_bits(dict(device.profiles[other.profile].placements)[other.start], other.start)
        if occupied & slice_bits(sizes[start], start):
            raise NvmlError(f"Insufficient Resources: slices of {profile}@{start} are in use")
        if sum(1 for other in device.instances.values() if other.profile == profile) >= info.instances:
            raise NvmlError(f"Insufficient Resources: {profile} allows {info.instances} instance(s) per GPU")


def _capture_numa(sysfs: str, nvml: object) -> int | None:
    for value in (sysfs, nvml):
        number = str(value)
        if number.isdigit():  # "-1" and "NVMLError: Not Supported" both mean N/A
            return int(number)
    return None
