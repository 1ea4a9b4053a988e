"""Builders for agent tests: pods with assignments, a fake kubelet speaking v1beta1 over unix sockets."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest

from gpupack.agent.allocator import Allocator
from gpupack.agent.devices import advertised
from gpupack.agent.fake_nvml import FakeNvml
from gpupack.agent.kubelet import KUBELET_SOCKET
from gpupack.agent.kubelet import deviceplugin_pb2 as pb
from gpupack.agent.kubelet import deviceplugin_pb2_grpc as pb_grpc
from gpupack.agent.kubelet import podresources_pb2 as pr
from gpupack.agent.kubelet import podresources_pb2_grpc as pr_grpc
from gpupack.agent.node_gpus import NodeGpus
from gpupack.agent.nvml_topology import read_topology
from gpupack.agent.plugin_manager import PluginManager
from gpupack.agent.pods import MemoryPods
from gpupack.kube import objects

NODE = "gpu-node-1"


def make_pod(
    name: str,
    containers: list[dict[str, int]],
    gpus: list[dict[str, Any]] | None,
    *,
    created: str = "2026-01-01T00:00:00Z",
    phase: str = "Pending",
    node: str = NODE,
    init: list[dict[str, int]] | None = None,
) -> dict[str, Any]:
    """`make_pod` bound to `node` whose containers ask for the given resources, with an assignment of `gpus`."""
    annotations = {} if gpus is None else {"gpupack.io/assignment": orjson.dumps({"node": node, "gpus": gpus}).decode()}
    return objects.make_pod(
        name,
        namespace="ml",
        uid=f"uid-{name}",
        containers=containers,
        init_containers=init or (),
        node=node,
        phase=phase,
        annotations=annotations,
        scheduler=None,
        created=created,
    )


def serve_on_socket(add_servicer: Any, servicer: Any, socket: Path, workers: int) -> grpc.Server:
    """A started gRPC server for one servicer on a unix socket, as the kubelet serves its APIs."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    add_servicer(servicer, server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    return server


def stop_server(server: grpc.Server | None) -> None:
    """Stop `server` at once (None: nothing to stop)."""
    if server is not None:
        server.stop(grace=0).wait()


class FakeKubelet:
    """The kubelet's side of the device-plugin contract: Registration server, plugin client."""

    def __init__(self, plugin_dir: Path) -> None:
        self.plugin_dir = plugin_dir
        self.registrations: list[pb.RegisterRequest] = []
        self.registered = threading.Condition()
        self._server: grpc.Server | None = None

    def start(self) -> None:
        kubelet = self

        class Registration(pb_grpc.RegistrationServicer):
            def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:
                with kubelet.registered:
                    kubelet.registrations.append(request)
                    kubelet.registered.notify_all()
                return pb.Empty()

        self._server = serve_on_socket(
            pb_grpc.add_RegistrationServicer_to_server, Registration(), self.plugin_dir / KUBELET_SOCKET, 4
        )

    def stop(self) -> None:
        """Stop, and (as the kubelet does on start) remove every socket in the folder."""
        stop_server(self._server)
        self._server = None
        for sock in self.plugin_dir.glob("*.sock"):
            sock.unlink()

    def restart(self) -> None:
        self.stop()
        time.sleep(0.01)  # a new kubelet.sock gets a new mtime even on coarse clocks
        self.start()

    def wait_registered(self, resources: set[str], after: int = 0, timeout: float = 10.0) -> list[pb.RegisterRequest]:
        """The registrations after the first `after`, once they cover `resources`."""
        with self.registered:
            ok = self.registered.wait_for(
                lambda: resources <= {r.resource_name for r in self.registrations[after:]}, timeout=timeout
            )
            assert ok, f"registered: {[r.resource_name for r in self.registrations]}"
            return self.registrations[after:]

    def plugin(self, resource: str) -> pb_grpc.DevicePluginStub:
        """A client of the plugin that registered `resource` last."""
        endpoint = next(r.endpoint for r in reversed(self.registrations) if r.resource_name == resource)
        channel = grpc.insecure_channel(f"unix://{self.plugin_dir / endpoint}")
        return pb_grpc.DevicePluginStub(channel)

    def devices(self, resource: str) -> list[str]:
        """The first ListAndWatch answer's device IDs."""
        stream = self.plugin(resource).ListAndWatch(pb.Empty(), timeout=5)
        first = next(stream)
        stream.cancel()
        return [d.ID for d in first.devices]

    def admit(self, resource: str, available: list[str], size: int) -> tuple[list[str], dict[str, str]]:
        """What the kubelet does for one container: GetPreferredAllocation, then Allocate with its answer
        (filled up from `available` when the plugin has no preference)."""
        chosen, response = self.admit_response(resource, available, size)
        return chosen, dict(response.envs)

    def admit_response(
        self, resource: str, available: list[str], size: int
    ) -> tuple[list[str], pb.ContainerAllocateResponse]:
        """`admit`, answering the container's whole Allocate response (envs, device nodes, mounts)."""
        stub = self.plugin(resource)
        asked = pb.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=size)
        answer = stub.GetPreferredAllocation(pb.PreferredAllocationRequest(container_requests=[asked]), timeout=5)
        chosen = list(answer.container_responses[0].deviceIDs) or available[:size]
        response = stub.Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=chosen)]), timeout=10
        )
        return chosen, response.container_responses[0]


class Agent:
    """The agent's device-plugin half over a fake NVML and an in-memory pod list."""

    def __init__(self, nvml: FakeNvml, pods: MemoryPods, plugin_dir: Path, dynamic_mig: bool = False) -> None:
        numa = read_topology(nvml).numa
        self.nvml = nvml
        self.read_gpus: Callable[[], NodeGpus] = lambda: NodeGpus.read(nvml, numa, dynamic_mig)
        self.allocator = Allocator(NODE, nvml, pods, self.read_gpus)
        self.manager = PluginManager(self.allocator, plugin_dir)

    def sync(self) -> None:
        self.manager.sync(advertised(self.read_gpus()))


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    """A short temporary folder (unix socket paths are limited to 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="gp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(plugin_dir: Path) -> Iterator[FakeKubelet]:
    fake = FakeKubelet(plugin_dir)
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture
def agents() -> Iterator[list[Agent]]:
    """Agents a test starts (append them); each is stopped when the test ends."""
    started: list[Agent] = []
    yield started
    for agent in started:
        agent.manager.stop()


class FakePodResources:
    """The kubelet's podresources v1 server on a unix socket; `pods` is what `List` answers."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.pods: list[pr.PodResources] = []
        self._server: grpc.Server | None = None

    def hold(self, pod: str, devices: dict[str, list[str]], container: str = "c0") -> None:
        """The kubelet admitted `pod` (namespace/name) with one container holding `devices` by resource."""
        namespace, name = pod.split("/")
        held = [pr.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in devices.items()]
        containers = [pr.ContainerResources(name=container, devices=held)]
        self.pods.append(pr.PodResources(name=name, namespace=namespace, containers=containers))

    def start(self) -> None:
        fake = self

        class Lister(pr_grpc.PodResourcesListerServicer):
            def List(self, request: pr.ListPodResourcesRequest, context: Any) -> pr.ListPodResourcesResponse:
                return pr.ListPodResourcesResponse(pod_resources=fake.pods)

        self._server = serve_on_socket(pr_grpc.add_PodResourcesListerServicer_to_server, Lister(), self.socket, 2)

    def stop(self) -> None:
        stop_server(self._server)
        self._server = None


@pytest.fixture
def podresources(plugin_dir: Path) -> Iterator[FakePodResources]:
    """A fake podresources server in the test's temporary folder."""
    fake = FakePodResources(plugin_dir / "pod-resources.sock")
    fake.start()
    yield fake
    fake.stop()
