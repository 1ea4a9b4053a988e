"""One kubelet device plugin (v1beta1) per resource: its gRPC service, socket and registration.

The kubelet deletes every plugin socket in its device-plugin folder when it restarts; `PluginServer`
notices its socket is gone (`alive()`), and the manager restarts it and registers again.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc

from gpupack.agent.allocator import Allocator
from gpupack.agent.device_kind import AllocationError, ContainerGrant
from gpupack.agent.kubelet import API_VERSION, KUBELET_SOCKET
from gpupack.agent.kubelet import deviceplugin_pb2 as pb
from gpupack.agent.kubelet import deviceplugin_pb2_grpc as pb_grpc
from gpupack.agent.node_gpus import Device

log = logging.getLogger(__name__)
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"  # pluginapi.Healthy / pluginapi.Unhealthy


def socket_name(resource: str) -> str:
    """`nvidia.com/mig-1g.10gb.me` -> `gpupack-nvidia.com_mig-1g.10gb.me.sock`."""
    return "gpupack-" + resource.replace("/", "_") + ".sock"


class DevicePluginService(pb_grpc.DevicePluginServicer):
    """The v1beta1 DevicePlugin service of one resource."""

    def __init__(self, resource: str, allocator: Allocator) -> None:
        self.resource = resource
        self.allocator = allocator
        self._devices: list[Device] = []
        self._version = 0
        self._changed = threading.Condition()
        self._stopped = False

    def set_devices(self, devices: list[Device]) -> None:
        """Publish a new device list to every ListAndWatch stream (only when it differs)."""
        with self._changed:
            if devices != self._devices:
                self._devices = list(devices)
                self._version += 1
                self._changed.notify_all()

    def stop(self) -> None:
        """End the ListAndWatch streams."""
        with self._changed:
            self._stopped = True
            self._changed.notify_all()

    def GetDevicePluginOptions(self, request: pb.Empty, context: grpc.ServicerContext) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request: pb.Empty, context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:
        seen = -1

        def stopped_or_changed() -> bool:
            return self._stopped or self._version != seen

        while context.is_active():
            with self._changed:
                self._changed.wait_for(stopped_or_changed, timeout=1.0)
                if self._stopped:
                    return
                if self._version == seen:
                    continue
                seen, devices = self._version, list(self._devices)
            yield pb.ListAndWatchResponse(devices=[_device(d) for d in devices])

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        responses = []
        for ask in request.container_requests:
            ids = self.allocator.preferred(
                self.resource, list(ask.available_deviceIDs), list(ask.must_include_deviceIDs), ask.allocation_size
            )
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return pb.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: pb.AllocateRequest, context: grpc.ServicerContext) -> pb.AllocateResponse:
        responses = []
        for ask in request.container_requests:
            try:
                allocation = self.allocator.allocate(self.resource, list(ask.devices_ids))
            except AllocationError as exc:
                log.warning("Allocate %s refused: %s", self.resource, exc)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            log.info("Allocate %s: pod %s container %s -> %s", self.resource, allocation.claim.pod,
                     allocation.claim.container, allocation.grant.envs)
            responses.append(_response(allocation.grant))
        return pb.AllocateResponse(container_responses=responses)

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


def _response(grant: ContainerGrant) -> pb.ContainerAllocateResponse:
    devices = [pb.DeviceSpec(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
               for d in grant.devices]
    mounts = [pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
              for m in grant.mounts]
    return pb.ContainerAllocateResponse(envs=grant.envs, devices=devices, mounts=mounts)


def _device(device: Device) -> pb.Device:
    topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=device.numa)]) if device.numa >= 0 else None
    return pb.Device(ID=device.id, health=HEALTHY if device.healthy else UNHEALTHY, topology=topology)


class PluginServer:
    """Serves one `DevicePluginService` on its socket in the plugin folder and registers it."""

    def __init__(self, service: DevicePluginService, plugin_dir: Path) -> None:
        self.service = service
        self.plugin_dir = plugin_dir
        self.socket = plugin_dir / socket_name(service.resource)
        self._server: grpc.Server | None = None

    def start(self) -> None:
        """Bind the socket (replacing a stale one) and serve."""
        if self.socket.exists():
            self.socket.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_DevicePluginServicer_to_server(self.service, server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server

    def register(self, timeout: float = 5.0) -> None:
        """Tell the kubelet about this plugin (grpc.RpcError when the kubelet is not there)."""
        kubelet = self.plugin_dir / KUBELET_SOCKET
        with grpc.insecure_channel(f"unix://{kubelet}") as channel:
            pb_grpc.RegistrationStub(channel).Register(
                pb.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.socket.name,
                    resource_name=self.service.resource,
                    options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
                ),
                timeout=timeout,
            )

    def alive(self) -> bool:
        """Serving and its socket still exists (the kubelet removes it when it restarts)."""
        return self._server is not None and os.path.exists(self.socket)

    def stop(self) -> None:
        """Stop serving; the socket is removed."""
        if self._server is not None:
            self._server.stop(grace=0.5).wait()
            self._server = None
        if self.socket.exists():
            self.socket.unlink()
