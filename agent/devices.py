"""The devices the agent advertises: every registered kind's (`agent.kinds`), one resource per device plugin.

Device IDs (docs/contracts.md#device-plugins) are each kind's business: see `agent.kind_*`. A resource
belongs to the one kind that advertises it on this node.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace

from gpupack.agent.device_kind import DeviceKind
from gpupack.agent.kinds import registered
from gpupack.agent.node_gpus import Device, NodeGpus
from gpupack.errors import GpupackError


class KindConflictError(GpupackError, RuntimeError):
    """Two registered kinds advertise the same resource on one node."""


@dataclass(frozen=True)
class Offer:
    """One advertised resource: the kind that serves it and its devices."""

    kind: DeviceKind
    devices: list[Device]


def offers(node: NodeGpus) -> dict[str, Offer]:
    """Resource name -> its kind and devices, for every resource this node advertises (empty ones dropped)."""
    out: dict[str, Offer] = {}
    for kind in registered():
        for resource, devices in kind.advertise(node).items():
            if not devices:
                continue
            if resource in out:
                raise KindConflictError(f"{resource} is advertised by both {out[resource].kind.name} and {kind.name}")
            out[resource] = Offer(kind, devices)
    return out


def advertised(node: NodeGpus) -> dict[str, list[Device]]:
    """Resource name -> devices, for every resource this node advertises (empty lists dropped)."""
    return {resource: offer.devices for resource, offer in offers(node).items()}


def with_health(devices: dict[str, list[Device]], out_of_service: Collection[int]) -> dict[str, list[Device]]:
    """The same devices, those on a GPU in `out_of_service` marked unhealthy (whatever their kind)."""
    return {
        resource: [replace(d, healthy=False) if d.gpu in out_of_service else d for d in listed]
        for resource, listed in devices.items()
    }
