"""What the real-node cases share: the cluster they run on and how they read a pod's devices.

`NodeCluster` is the full control plane at the newest release, the real node, the locally built
images imported into its containerd and gpupack installed on it (`running_node_cluster`: the shipped
manifests through `deploy.py`, or the Helm chart through `helm_deploy.py`). The node's GPUs are a fake
NVML file (`FAKE_GPUS`): GPUs 0-3 whole (NVLinked pairs 0-1 and 2-3), GPU 4 with static MIG instances
(one a media-extension instance), GPU 5 with MIG on and no instance (dynamic MIG).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from gpupack.agent.fake_nvml_file import FileNvml
from gpupack.agent.kubelet import podresources_pb2 as pr
from gpupack.agent.kubelet import podresources_pb2_grpc as pr_grpc
from gpupack.agent.podresources import KubeletPodResources
from gpupack.harness.kube_programs import NEWEST, MissingBinary
from gpupack.kube.pod_request import assignment_from_pod
from gpupack.scoring.facts import GpuSlot
from tests.e2e import deploy, images
from tests.e2e.conftest import missing_program
from tests.e2e.deploy import FAKE_NVML_DIR, FAKE_NVML_FILE
from tests.e2e.realcluster import FullControlPlane
from tests.e2e.realnode import RealNode, RealNodeError, container_log, pod_summary, wait_for

PRODUCT = "NVIDIA H100 80GB HBM3"
STATIC_INSTANCES = (("1g.10gb+me", 0), ("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 4))
FAKE_GPUS: dict[str, Any] = {
    "gpus": [{"name": PRODUCT, "mig": index >= 4, "uuid": f"GPU-e2e0000{index}"} for index in range(6)],
    "nvlink": [[18 if {i, j} in ({0, 1}, {2, 3}) else 0 for j in range(6)] for i in range(6)],
    "numa": [0, 0, 1, 1, 0, 1],
    "instances": [{"gpu": 4, "profile": profile, "start": start} for profile, start in STATIC_INSTANCES],
}
NODE_LABELS = {  # what GPU feature discovery would label, and the agent's node selector
    "gpupack.io/agent": "true",
    "nvidia.com/gpu.product": PRODUCT.replace(" ", "-"),
    "nvidia.com/gpu.count": "6",
    "nvidia.com/gpu.memory": "81559",
}
ENV_LINE = re.compile(r"^(NVIDIA_VISIBLE_DEVICES|GPUPACK_GPU_MILLI)=(.*)$", re.M)
BUSYBOX = "localhost/busybox:e2e"
VISIBLE = "NVIDIA_VISIBLE_DEVICES"


@dataclass
class NodeCluster:
    """The full control plane, the real node on it, and the namespace the cases' pods live in."""

    plane: FullControlPlane
    node: RealNode
    namespace: str

    def core(self) -> Any:
        return self.plane.core()

    def allocatable_now(self, resource: str) -> int:
        """How many devices of `resource` the kubelet offers now (podresources, its live view)."""
        try:
            with grpc.insecure_channel(f"unix://{self.node.pod_resources_socket}") as channel:
                stub = pr_grpc.PodResourcesListerStub(channel)
                answer = stub.GetAllocatableResources(pr.AllocatableResourcesRequest(), timeout=5)
        except grpc.RpcError:  # the kubelet is restarting
            return 0
        return sum(len(d.device_ids) for d in answer.devices if d.resource_name == resource)

    def gpus(self) -> FileNvml:
        """The fake GPUs as the agent left them (MIG instances it created included)."""
        return FileNvml.open(Path(FAKE_NVML_FILE))

    def pod(self, name: str) -> Any:
        return self.core().read_namespaced_pod(name, self.namespace)

    def create(self, body: dict[str, Any]) -> str:
        self.core().create_namespaced_pod(self.namespace, body)
        return str(body["metadata"]["name"])

    def delete(self, name: str) -> None:
        self.core().delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)

    def wait_running(self, name: str, timeout: float = 120) -> Any:
        """The pod once every container runs; RealNodeError with its state when it fails or times out."""
        last: list[Any] = [None]

        def running() -> bool:
            last[0] = pod = self.pod(name)
            if pod.status.phase in ("Failed", "Succeeded"):
                raise RealNodeError(f"pod {name} ended: {pod_summary(pod)}; events: {self.events(name)}")
            return pod.status.phase == "Running" and bool(self.container_env(name))

        try:
            wait_for(f"pod {name} to run and print its devices", running, timeout)
        except RealNodeError as exc:
            raise RealNodeError(f"{exc}; {pod_summary(last[0])}; events: {self.events(name)}") from exc
        return last[0]

    def container_env(self, name: str) -> dict[str, str]:
        """The device variables the container printed at start (empty until it printed them)."""
        try:
            text = container_log(self.core(), self.namespace, name)
        except Exception:  # no log yet: the container is still starting
            return {}
        return dict(ENV_LINE.findall(text))

    def events(self, name: str) -> list[str]:
        """`reason: message` of the events about one pod of the namespace."""
        events = self.core().list_namespaced_event(self.namespace, field_selector=f"involvedObject.name={name}")
        return [f"{event.reason}: {event.message}" for event in events.items]

    def held(self, name: str) -> dict[str, tuple[str, ...]]:
        """What the kubelet's podresources API says the pod's containers hold, per resource."""
        for held in KubeletPodResources(self.node.pod_resources_socket).list_held():
            if held.pod == f"{self.namespace}/{name}":
                return dict(held.devices)
        return {}

    def assignment(self, name: str) -> tuple[GpuSlot, ...]:
        """The slots of the pod's `gpupack.io/assignment` annotation."""
        pod = self.core().api_client.sanitize_for_serialization(self.pod(name))
        placement = assignment_from_pod(pod)
        assert placement is not None, f"pod {name} has no assignment"
        return placement.slots


def gpu_pod(name: str, limits: dict[str, int], init_sleep: float = 0) -> dict[str, Any]:
    """A host-network busybox pod for the gpupack scheduler that prints its device variables and waits."""
    script = 'echo "NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES"; echo "GPUPACK_GPU_MILLI=$GPUPACK_GPU_MILLI"'
    container = {
        "name": "main",
        "image": BUSYBOX,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", f"{script}; exec sleep 3600"],
        "resources": {
            "requests": {"cpu": "10m", "memory": "16Mi"},
            "limits": {key: str(value) for key, value in limits.items()},
        },
    }
    spec: dict[str, Any] = {
        "schedulerName": "gpupack",
        "hostNetwork": True,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 1,
        "containers": [container],
    }
    if init_sleep:
        init = {"name": "wait", "image": BUSYBOX, "imagePullPolicy": "Never", "command": ["sleep", str(init_sleep)]}
        spec["initContainers"] = [init]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def expected_ids(gpus: FileNvml, slots: tuple[GpuSlot, ...]) -> list[str]:
    """The UUIDs NVIDIA's container toolkit must be given for `slots`: GPUs' or MIG instances'."""
    uuids = []
    for slot in slots:
        if slot.mig:
            (instance,) = [i for i in gpus.mig_instances(slot.index) if (i.profile, i.start) == (slot.mig, slot.start)]
            uuids.append(instance.uuid)
        else:
            uuids.append(gpus.gpus()[slot.index].uuid)
    return uuids


def held_gpus(gpus: FileNvml, device_ids: tuple[str, ...]) -> set[str]:
    """The GPU or MIG UUIDs that podresources device IDs stand for (`<uuid>/milli-k`, `<uuid>/<profile>/k`)."""
    known = {gpu.uuid for gpu in gpus.gpus()} | {
        instance.uuid for gpu in gpus.gpus() for instance in gpus.mig_instances(gpu.index)
    }
    found = set()
    for device in device_ids:
        head = device.split("/", 1)[0]
        assert head in known, f"podresources names {device}, which no GPU or instance is"
        found.add(head)
    return found


def wait_gone(cluster: NodeCluster, name: str, timeout: float = 60) -> None:
    """Until the pod is deleted from the API server."""
    from kubernetes.client.exceptions import ApiException

    def gone() -> bool:
        try:
            cluster.pod(name)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(f"pod {name} to be gone", gone, timeout)


def write_fake_gpus(path: Path, dynamic: bool = False) -> None:
    """The node's fake NVML file (the agent reads it at start and writes its MIG changes back).

    `dynamic`: every GPU with MIG on and no instance, as a dynamic-MIG node starts.
    """
    gpus = dict(FAKE_GPUS)
    if dynamic:
        gpus["gpus"] = [{**gpu, "mig": True} for gpu in FAKE_GPUS["gpus"]]
        gpus["instances"] = []
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(gpus, indent=1))


def edit_fake_gpus(change: Callable[[dict[str, Any]], None], path: Path = Path(FAKE_NVML_FILE)) -> None:
    """Change the fake NVML file while the agent runs, as the GPUs would (its health keys: `lost`,
    `xid_events`); replaced whole, as the agent writes it, so the agent never reads half of it."""
    document = json.loads(path.read_text())
    change(document)
    temporary = path.with_name(f".{path.name}.e2e")
    temporary.write_text(json.dumps(document, indent=1))
    os.replace(temporary, path)


def inject_xid(gpu: int, xid: int) -> None:
    """The driver reports XID `xid` on GPU `gpu` (the agent takes it as an NVML event)."""
    edit_fake_gpus(lambda document: document.setdefault("xid_events", []).append({"gpu": gpu, "xid": xid}))


def blocked_gpus(cluster: NodeCluster) -> dict[int, str]:
    """Whole GPUs the Node's `gpupack.io/devices-in-use` lists blocked, with their reasons."""
    annotations = cluster.core().read_node(cluster.node.name).metadata.annotations or {}
    value = json.loads(annotations.get("gpupack.io/devices-in-use") or "{}")
    return {b["index"]: b["reason"] for b in value.get("blocked", []) if "mig" not in b and "milli" not in b}


def reconfigure(cluster: NodeCluster, dynamic: bool) -> None:
    """As an operator changes a node's MIG mode: the agent off, the GPUs changed, the node marked, the agent on.

    Waits until the kubelet offers the new mode's devices (its podresources view; the Node's allocatable
    can run ahead of it while re-registered plugins' devices are still unhealthy).
    """
    core = cluster.core()
    name = cluster.node.name
    core.patch_node(name, {"metadata": {"labels": {"gpupack.io/agent": "false"}}})
    wait_for("the agent pod to go", lambda: not core.list_namespaced_pod("gpupack-agent").items, 120)
    write_fake_gpus(Path(FAKE_NVML_FILE), dynamic)
    mode = {"gpupack.io/mig": "dynamic" if dynamic else None}
    core.patch_node(name, {"metadata": {"labels": {"gpupack.io/agent": "true"}, "annotations": mode}})
    resource = "nvidia.com/mig-3g.40gb" if dynamic else "nvidia.com/gpu"

    def offered() -> bool:
        allocatable = core.read_node(name).status.allocatable or {}
        return int(allocatable.get(resource, "0")) > 0 < cluster.allocatable_now(resource)

    wait_for(f"the agent to offer {resource}", offered, 180)


Install = Callable[[FullControlPlane, str], None]  # (plane, name of the local gpupack image) -> gpupack installed


def deployed(cluster: NodeCluster) -> bool:
    """The agent's plugins are registered and the gpupack scheduler pod is ready."""
    allocatable = cluster.core().read_node(cluster.node.name).status.allocatable or {}
    if int(allocatable.get("nvidia.com/gpu", "0")) != 4:
        return False
    pods = cluster.core().list_namespaced_pod("gpupack-system").items
    return any(all(c.ready for c in pod.status.container_statuses or [False]) for pod in pods) and bool(pods)


@contextlib.contextmanager
def running_node_cluster(install: Install) -> Iterator[NodeCluster]:
    """The plane and the real node with the local images, the fake GPUs and the node's labels; `install`
    puts gpupack on it. Yields once the agent's GPUs are offered and the gpupack scheduler is ready; torn
    down afterwards, whatever state it reached."""
    try:
        plane = FullControlPlane(NEWEST)
    except MissingBinary as exc:
        missing_program(exc)
    archives = images.build_all(plane.kube_bin / "kube-scheduler", NEWEST)
    node = RealNode(plane, plane.kube_bin / "kubelet")
    try:
        plane.start()
        node.start(list(archives.values()))
        write_fake_gpus(Path(FAKE_NVML_FILE))
        plane.core().patch_node(node.name, {"metadata": {"labels": NODE_LABELS}})
        install(plane, next(name for name in archives if name.startswith("localhost/gpupack:")))
        namespace = f"e2e-node-{uuid.uuid4().hex[:5]}"
        plane.create_namespace(namespace)
        cluster = NodeCluster(plane, node, namespace)
        wait_for("the agent's GPUs on the node and the gpupack scheduler ready", lambda: deployed(cluster), 300)
        yield cluster
    finally:
        node.stop()
        plane.stop()
        shutil.rmtree(Path(FAKE_NVML_DIR).parent, ignore_errors=True)  # /var/lib/gpupack-e2e


def check_devices(cluster: NodeCluster, name: str, timeout: float = 120) -> list[str]:
    """The container's NVIDIA_VISIBLE_DEVICES equals its assignment and what podresources says it holds.

    podresources names dynamic-MIG devices by their GPU (`<GPU UUID>/<profile>/<k>`): for those the GPU
    of the assigned slot is what it must hold. Returns the visible UUIDs.
    """
    cluster.wait_running(name, timeout)
    gpus = cluster.gpus()
    slots = cluster.assignment(name)
    expected = expected_ids(gpus, slots)
    visible = cluster.container_env(name)[VISIBLE].split(",")
    assert sorted(visible) == sorted(expected), name
    held = {uuid for ids in cluster.held(name).values() for uuid in held_gpus(gpus, ids)}
    dynamic = {gpus.gpus()[slot.index].uuid for slot in slots if slot.mig} - set(expected)
    assert held in (set(expected), dynamic | {u for u, s in zip(expected, slots, strict=True) if not s.mig}), name
    return visible


def delete_all(cluster: NodeCluster, names: list[str]) -> None:
    """Delete the pods and wait until they are gone."""
    for name in names:
        cluster.delete(name)
    for name in names:
        wait_gone(cluster, name)


@contextlib.contextmanager
def manifests_node_cluster() -> Iterator[NodeCluster]:
    """`running_node_cluster` with gpupack installed from the shipped manifests (deploy.py's overlay)."""
    overlay = Path(tempfile.mkdtemp(prefix="gpupack-e2e-overlay-"))

    def install(plane: FullControlPlane, gpupack_image: str) -> None:
        folder = deploy.write_overlay(overlay, NEWEST.rsplit(".", 1)[0], gpupack_image, plane.apiserver_port)
        deploy.apply(plane.kube_bin / "kubectl", plane.kubeconfig, folder)

    try:
        with running_node_cluster(install) as cluster:
            yield cluster
    finally:
        shutil.rmtree(overlay, ignore_errors=True)
