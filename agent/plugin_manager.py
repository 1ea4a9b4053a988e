"""Keeps one registered `PluginServer` per advertised resource, through kubelet restarts."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import grpc

from gpupack.agent.allocator import Allocator
from gpupack.agent.kubelet import KUBELET_SOCKET
from gpupack.agent.node_gpus import Device
from gpupack.agent.plugin import DevicePluginService, PluginServer

log = logging.getLogger(__name__)


@dataclass
class _Plugin:
    server: PluginServer
    registered_with: tuple[int, int] | None = None  # (inode, mtime_ns) of the kubelet socket we told


class PluginManager:
    """Starts, updates, re-registers and stops the plugins; `sync` and `check` are called by one loop."""

    def __init__(self, allocator: Allocator, plugin_dir: Path) -> None:
        self.allocator = allocator
        self.plugin_dir = plugin_dir
        self.plugins: dict[str, _Plugin] = {}

    def sync(self, devices: dict[str, list[Device]]) -> None:
        """Serve exactly the resources in `devices` with those devices; then `check`."""
        for resource in set(self.plugins) - set(devices):
            self.plugins.pop(resource).server.stop()
        for resource, listed in devices.items():
            if resource not in self.plugins:
                server = PluginServer(DevicePluginService(resource, self.allocator), self.plugin_dir)
                server.start()
                self.plugins[resource] = _Plugin(server)
            self.plugins[resource].server.service.set_devices(listed)
        self.check()

    def check(self) -> None:
        """Restart plugins whose socket the kubelet removed; (re-)register with a new kubelet socket."""
        kubelet = _identity(self.plugin_dir / KUBELET_SOCKET)
        for resource, plugin in self.plugins.items():
            if not plugin.server.alive():
                log.info("socket of %s is gone (kubelet restart?): serving it again", resource)
                plugin.server.stop()
                plugin.server.start()
                plugin.registered_with = None
            if kubelet is None or plugin.registered_with == kubelet:
                continue
            try:
                plugin.server.register()
            except grpc.RpcError as exc:
                log.warning("registering %s with the kubelet failed: %s", resource, exc.details())
                continue
            plugin.registered_with = kubelet
            log.info("registered %s with the kubelet", resource)

    def stop(self) -> None:
        """Stop every plugin and end its streams."""
        for plugin in self.plugins.values():
            plugin.server.service.stop()
            plugin.server.stop()
        self.plugins.clear()


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_ino, stat.st_mtime_ns)
