"""The kubelet's podresources API (v1 `List`): which device IDs each admitted container holds.

A small interface (`PodResourcesSource`) so the comparison can be tested with a fake; the real client
speaks gRPC to the kubelet's socket (`/var/lib/kubelet/pod-resources/kubelet.sock`, read-only mount).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import grpc

from gpupack.agent.kubelet import PODRESOURCES_SOCKET
from gpupack.agent.kubelet import podresources_pb2 as pr
from gpupack.agent.kubelet import podresources_pb2_grpc as pr_grpc


@dataclass(frozen=True)
class HeldDevices:
    """The device IDs one pod's containers hold, per resource name: merged, and per container."""

    pod: str  # namespace/name
    devices: dict[str, tuple[str, ...]]
    containers: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)  # container -> resource -> IDs


class PodResourcesSource(Protocol):
    """Lists what the kubelet has handed to the containers it admitted."""

    def list_held(self) -> list[HeldDevices]:
        """Every pod the kubelet knows with the devices its containers hold."""
        ...


class KubeletPodResources:
    """`PodResourcesSource` over the kubelet's podresources v1 gRPC service on a unix socket."""

    def __init__(self, socket: Path | str = PODRESOURCES_SOCKET, timeout: float = 5.0) -> None:
        self.socket = Path(socket)
        self.timeout = timeout

    def list_held(self) -> list[HeldDevices]:
        """`List` (grpc.RpcError when the kubelet is not there)."""
        with grpc.insecure_channel(f"unix://{self.socket}") as channel:
            answer = pr_grpc.PodResourcesListerStub(channel).List(pr.ListPodResourcesRequest(), timeout=self.timeout)
        return [held_from_proto(pod) for pod in answer.pod_resources]


def held_from_proto(pod: pr.PodResources) -> HeldDevices:
    """One `PodResources` message as `HeldDevices` (device IDs of every container, per resource)."""
    devices: dict[str, list[str]] = {}
    containers: dict[str, dict[str, tuple[str, ...]]] = {}
    for container in pod.containers:
        for held in container.devices:
            devices.setdefault(held.resource_name, []).extend(held.device_ids)
            mine = containers.setdefault(container.name, {})
            mine[held.resource_name] = mine.get(held.resource_name, ()) + tuple(held.device_ids)
    merged = {name: tuple(ids) for name, ids in devices.items()}
    return HeldDevices(f"{pod.namespace}/{pod.name}", merged, containers)
