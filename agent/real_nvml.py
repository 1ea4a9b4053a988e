"""`agent.nvml.Nvml` over NVIDIA's official binding, `nvidia-ml-py` (module `pynvml`).

`pynvml` is imported when a `RealNvml` is made, so nothing else in gpupack needs the NVML library.
Every `pynvml.NVMLError` leaves as `NvmlError` carrying NVML's own message.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from gpupack.agent.nvml import GpuInfo, MigInstance, NvLink, NvmlError, XidEvent
from gpupack.scoring.geometry import SHAPES, resolve_profile
from gpupack.scoring.gpu_models import lookup_model

T = TypeVar("T")
SYS_NODES = Path("/sys/devices/system/node")
SYS_PCI = Path("/sys/bus/pci/devices")
# compute slices of a GPU instance -> the compute instance profile that spans all of it
_CI_PROFILE_BY_COMPUTE = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 6: 5, 8: 6}


class RealNvml:
    """NVML on this host. `close()` (or the context manager) shuts NVML down."""

    def __init__(self) -> None:
        import pynvml  # lazy: only a node agent on a GPU host needs libnvidia-ml

        self._nvml: Any = pynvml
        self._call(pynvml.nvmlInit)
        count = self._call(pynvml.nvmlDeviceGetCount)
        self._handles = [self._call(pynvml.nvmlDeviceGetHandleByIndex, i) for i in range(count)]
        self._infos = [self._read_info(index, handle) for index, handle in enumerate(self._handles)]
        self._events: Any = None  # the event set of `watch_xids`

    def close(self) -> None:
        """Shut NVML down."""
        self._call(self._nvml.nvmlShutdown)

    def __enter__(self) -> RealNvml:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, func: Callable[..., T], *args: Any) -> T:
        try:
            return func(*args)
        except self._nvml.NVMLError as exc:
            raise NvmlError(f"{func.__name__}: {exc}") from None

    def gpus(self) -> list[GpuInfo]:
        """Every GPU, by NVML index, as read when NVML was opened (UUID, name, bus and memory never change)."""
        return list(self._infos)

    def _read_info(self, index: int, handle: Any) -> GpuInfo:
        nvml = self._nvml
        pci = self._call(nvml.nvmlDeviceGetPciInfo, handle)
        memory = self._call(nvml.nvmlDeviceGetMemoryInfo, handle)
        name = self._call(nvml.nvmlDeviceGetName, handle)
        uuid = self._call(nvml.nvmlDeviceGetUUID, handle)
        return GpuInfo(index, _text(uuid), _text(name), _text(pci.busId), memory.total // (1 << 20))

    def nvlinks(self, gpu: int) -> list[NvLink]:
        """Active NVLinks; a GPU without NVLink reports none (NVML: Not Supported)."""
        nvml, handle = self._nvml, self._handles[gpu]
        links = []
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                    continue
                remote = nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
                kind = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
            except nvml.NVMLError:
                continue  # links past the GPU's last one, or NVLink not supported at all
            links.append(NvLink(int(kind), _text(remote.busId)))
        return links

    def numa_node(self, gpu: int) -> int | None:
        """sysfs `numa_node` of the GPU's PCI device, else `nvmlDeviceGetNumaNodeId`; None when both are N/A."""
        node = _sysfs_numa(self._infos[gpu].bus_id)
        if node is not None:
            return node
        try:
            node = int(self._nvml.nvmlDeviceGetNumaNodeId(self._handles[gpu]))
        except (self._nvml.NVMLError, AttributeError):
            return None
        return node if node >= 0 else None

    def cpu_affinity_numa_nodes(self, gpu: int) -> tuple[int, ...]:
        """NUMA nodes of the CPUs in `nvmlDeviceGetCpuAffinity` (as `topo -m`'s NUMA Affinity)."""
        words = (os.cpu_count() or 64) // 64 + 1
        mask = self._call(self._nvml.nvmlDeviceGetCpuAffinity, self._handles[gpu], words)
        cpus = {word * 64 + bit for word, value in enumerate(mask) for bit in range(64) if value >> bit & 1}
        return tuple(sorted(node for node, node_cpus in _cpus_by_node().items() if cpus & node_cpus))

    def mig_enabled(self, gpu: int) -> bool:
        """Current MIG mode (pending changes do not count)."""
        try:
            current, _pending = self._nvml.nvmlDeviceGetMigMode(self._handles[gpu])
        except self._nvml.NVMLError:
            return False  # a GPU without MIG support
        return current == self._nvml.NVML_DEVICE_MIG_ENABLE

    def mig_instances(self, gpu: int) -> list[MigInstance]:
        """GPU instances by profile with the UUID of the MIG device on each."""
        if not self.mig_enabled(gpu):
            return []
        uuids = self._mig_uuids(gpu)
        out = []
        for profile, info in self._profiles(gpu).items():
            for instance in self._gpu_instances(gpu, info.id, info.instanceCount):
                gi = self._call(self._nvml.nvmlGpuInstanceGetInfo, instance)
                out.append(MigInstance(gpu, profile, int(gi.placement.start), uuids.get(int(gi.id), "")))
        return sorted(out, key=lambda i: i.start)

    def create_mig(self, gpu: int, profile: str, start: int) -> MigInstance:
        """GPU instance at `start`, then one compute instance spanning it."""
        nvml = self._nvml
        info = self._profiles(gpu).get(profile)
        if info is None:
            raise NvmlError(f"GPU {gpu} has no MIG profile {profile}")
        placement = nvml.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, _slices(self._gpus_product(gpu), profile)
        instance = self._call(nvml.nvmlDeviceCreateGpuInstanceWithPlacement, self._handles[gpu], info.id, placement)
        try:
            ci_index = _CI_PROFILE_BY_COMPUTE[int(info.sliceCount)]
            ci_info = self._call(
                nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo,
                instance,
                ci_index,
                nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            )
            self._call(nvml.nvmlGpuInstanceCreateComputeInstance, instance, ci_info.id)
        except NvmlError:
            self._call(nvml.nvmlGpuInstanceDestroy, instance)  # no half-made instance left behind
            raise
        gi = self._call(nvml.nvmlGpuInstanceGetInfo, instance)
        return MigInstance(gpu, profile, start, self._mig_uuids(gpu).get(int(gi.id), ""))

    def destroy_mig(self, gpu: int, start: int) -> None:
        """Compute instances first, then the GPU instance at `start`."""
        nvml = self._nvml
        for info in self._profiles(gpu).values():
            for instance in self._gpu_instances(gpu, info.id, info.instanceCount):
                if int(self._call(nvml.nvmlGpuInstanceGetInfo, instance).placement.start) != start:
                    continue
                for compute in self._compute_instances(instance):
                    self._call(nvml.nvmlComputeInstanceDestroy, compute)
                self._call(nvml.nvmlGpuInstanceDestroy, instance)
                return
        raise NvmlError(f"Not Found: no GPU instance starts at slice {start} on GPU {gpu}")

    # --- health (agent.gpu_health)
    def watch_xids(self) -> dict[int, str]:
        """One event set; each GPU registered for `nvmlEventTypeXidCriticalError` (its refusals returned)."""
        nvml = self._nvml
        if self._events is None:
            self._events = self._call(nvml.nvmlEventSetCreate)
        refused = {}
        for index, handle in enumerate(self._handles):
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._events)
            except nvml.NVMLError as exc:
                refused[index] = str(exc)
        return refused

    def next_xid(self, timeout_ms: int) -> XidEvent | None:
        """`nvmlEventSetWait_v2`: the event's device as its NVML index, its data as the XID."""
        nvml = self._nvml
        if self._events is None:
            return None
        try:
            data = nvml.nvmlEventSetWait_v2(self._events, timeout_ms)
        except nvml.NVMLError as exc:
            if exc.value == nvml.NVML_ERROR_TIMEOUT:
                return None
            raise NvmlError(f"nvmlEventSetWait_v2: {exc}") from None
        if not data.eventType & nvml.nvmlEventTypeXidCriticalError:
            return None
        index = int(self._call(nvml.nvmlDeviceGetIndex, data.device))
        return XidEvent(index, int(data.eventData))

    def lost(self, gpu: int) -> bool:
        """A cheap query of the GPU (its memory) answers NVML_ERROR_GPU_IS_LOST."""
        nvml = self._nvml
        try:
            nvml.nvmlDeviceGetMemoryInfo(self._handles[gpu])
        except nvml.NVMLError as exc:
            return bool(exc.value == nvml.NVML_ERROR_GPU_IS_LOST)
        return False

    # --- helpers
    def _gpus_product(self, gpu: int) -> str:
        return self._infos[gpu].product

    def _profiles(self, gpu: int) -> dict[str, Any]:
        """Profile name ("1g.10gb+me") -> NVML's profile info, for the profiles this GPU supports."""
        nvml, profiles = self._nvml, {}
        for index in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(self._handles[gpu], index)
            except nvml.NVMLError:
                continue
            profiles[_text(info.name).removeprefix("MIG ")] = info
        return profiles

    def _gpu_instances(self, gpu: int, profile_id: int, limit: int) -> list[Any]:
        nvml = self._nvml
        array = (nvml.c_nvmlGpuInstance_t * max(limit, 1))()
        count = nvml.c_uint()
        self._call(nvml.nvmlDeviceGetGpuInstances, self._handles[gpu], profile_id, array, nvml.byref(count))
        return [array[i] for i in range(count.value)]

    def _compute_instances(self, instance: Any) -> Iterator[Any]:
        nvml = self._nvml
        for ci_index in sorted(set(_CI_PROFILE_BY_COMPUTE.values())):
            try:
                info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    instance, ci_index, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                )
            except nvml.NVMLError:
                continue
            array = (nvml.c_nvmlComputeInstance_t * max(int(info.instanceCount), 1))()
            count = nvml.c_uint()
            self._call(nvml.nvmlGpuInstanceGetComputeInstances, instance, info.id, array, nvml.byref(count))
            yield from (array[i] for i in range(count.value))

    def _mig_uuids(self, gpu: int) -> dict[int, str]:
        """GPU instance id -> UUID of the MIG device on it."""
        nvml, handle = self._nvml, self._handles[gpu]
        uuids = {}
        for slot in range(self._call(nvml.nvmlDeviceGetMaxMigDeviceCount, handle)):
            try:
                device = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nvml.NVMLError:
                continue  # an empty slot
            uuids[int(self._call(nvml.nvmlDeviceGetGpuInstanceId, device))] = _text(
                self._call(nvml.nvmlDeviceGetUUID, device)
            )
        return uuids


@contextmanager
def open_nvml() -> Iterator[RealNvml]:
    """NVML for the duration of a `with` block."""
    nvml = RealNvml()
    try:
        yield nvml
    finally:
        nvml.close()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _slices(product: str, profile: str) -> int:
    family = lookup_model(product).mig_family
    if family is None:
        raise NvmlError(f"{product} has no MIG geometry gpupack knows")
    try:
        return SHAPES[resolve_profile(family, profile)[0]].size
    except KeyError:
        raise NvmlError(f"{product} has no MIG profile {profile}") from None


def _sysfs_numa(bus_id: str) -> int | None:
    """`/sys/bus/pci/devices/<domain:bus:dev.fn>/numa_node` (sysfs writes a 4-digit domain, lower case)."""
    domain, _, rest = bus_id.lower().partition(":")
    try:
        text = (SYS_PCI / f"{int(domain, 16):04x}:{rest}" / "numa_node").read_text().strip()
        node = int(text)
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def _cpus_by_node() -> dict[int, set[int]]:
    """NUMA node -> its CPUs, from `/sys/devices/system/node/node*/cpulist`."""
    nodes: dict[int, set[int]] = {}
    for path in SYS_NODES.glob("node[0-9]*"):
        try:
            nodes[int(path.name[4:])] = _cpu_list((path / "cpulist").read_text())
        except (OSError, ValueError):
            continue
    return nodes


def _cpu_list(text: str) -> set[int]:
    """`0-31,64-95` -> the CPU numbers."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if part:
            low, _, high = part.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
    return cpus
