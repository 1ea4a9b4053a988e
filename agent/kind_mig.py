"""What both MIG kinds share: the resources they answer to (`nvidia.com/mig-<profile>`) and how a slot maps to one."""

from __future__ import annotations

from gpupack.agent.device_kind import DeviceKind
from gpupack.agent.vendor_nvidia import is_mig_resource, mig_resource
from gpupack.scoring.facts import GpuSlot


class MigKind(DeviceKind):
    """A kind serving MIG instances; static and dynamic MIG differ in which instances exist, not in names."""

    def owns(self, resource: str) -> bool:
        """`nvidia.com/mig-<profile>`."""
        return is_mig_resource(resource)

    def resource_of(self, slot: GpuSlot) -> str | None:
        """A MIG slot, under its profile's resource."""
        return mig_resource(slot.mig) if slot.mig else None
