"""gpupack agent against the real control plane: nodes described by the agent's publisher over fake NVML,
pods of each kind scheduled by the real kube-scheduler through gpupack, then the agent's device plugins
driven by the fake kubelet: each container gets exactly the devices its assignment names (#14)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpupack.agent.devices import NodeGpus, advertised
from gpupack.agent.fake_nvml import FakeNvml
from gpupack.agent.main import AgentLoop
from gpupack.agent.node_publisher import KubeNodeApi, desired_annotations
from gpupack.agent.nvml_topology import read_topology
from gpupack.agent.pods import KubePods
from gpupack.harness.controlplane import node_body, pod_body, wait_until
from gpupack.kube.keys import ANNOTATION_MIG
from gpupack.kube.pod_request import assignment_from_pod
from gpupack.scoring.facts import GpuSlot
from tests.agent.conftest import FakeKubelet
from tests.e2e.cluster import E2ECluster

VISIBLE = "NVIDIA_VISIBLE_DEVICES"
STATIC_LAYOUT = {0: ["1g.10gb+me@0", "1g.10gb@1", "2g.20gb@2", "3g.40gb@4"], 1: ["4g.40gb@0", "2g.20gb@4", "1g.10gb@6"]}
PODS = {  # pod -> (node kind, the one resource it asks for, amount)
    "whole": ("gpus", "nvidia.com/gpu", 2),
    "share": ("gpus", "gpupack.io/gpu-milli", 250),
    "dynamic": ("dyn", "nvidia.com/mig-3g.40gb", 1),
    "static": ("static", "nvidia.com/mig-2g.20gb", 1),
    "media": ("static", "nvidia.com/mig-1g.10gb.me", 1),
}


@dataclass
class AgentNode:
    """One node: its fake NVML, the agent's loop on it and the fake kubelet its plugins register with."""

    name: str
    nvml: FakeNvml
    operator_annotations: dict[str, str]
    loop: AgentLoop | None = None
    kubelet: FakeKubelet | None = None

    def body(self) -> dict[str, Any]:
        """The Node as the kubelet (allocatable from the agent's plugins) and the agent's publisher write it."""
        gpus = NodeGpus.read(self.nvml, read_topology(self.nvml).numa, ANNOTATION_MIG in self.operator_annotations)
        published = desired_annotations(read_topology(self.nvml), gpus)
        annotations = {**self.operator_annotations, **{k: v for k, v in published.items() if v is not None}}
        allocatable = {resource: len(devices) for resource, devices in advertised(gpus).items()}
        info = self.nvml.gpus()[0]
        labels = {
            "nvidia.com/gpu.product": info.product,
            "nvidia.com/gpu.count": str(len(self.nvml.gpus())),
            "nvidia.com/gpu.memory": str(info.memory_mib),
        }
        return node_body(self.name, allocatable, labels, annotations)


def _nodes(prefix: str) -> dict[str, AgentNode]:
    static = FakeNvml.build(count=2, mig_enabled=True)
    for gpu, entries in STATIC_LAYOUT.items():
        for entry in entries:
            profile, start = entry.split("@")
            static.create_mig(gpu, profile, int(start))
    return {
        "gpus": AgentNode(f"{prefix}-agent-gpus", FakeNvml.build(count=4, nvswitch_links=18, numa=[0, 0, 1, 1]), {}),
        "dyn": AgentNode(f"{prefix}-agent-dyn", FakeNvml.build(count=2, mig_enabled=True), {ANNOTATION_MIG: "dynamic"}),
        "static": AgentNode(f"{prefix}-agent-static", static, {}),
    }


@pytest.fixture
def agent_nodes(cluster: E2ECluster) -> Iterator[dict[str, AgentNode]]:
    """The three agent nodes, created; their loops and fake kubelets are stopped afterwards."""
    nodes = _nodes(cluster.prefix)
    folders = []
    cluster.add_nodes(node.body() for node in nodes.values())
    core = cluster.plane.core()
    try:
        for node in nodes.values():
            folder = Path(tempfile.mkdtemp(prefix="gp-e2e-", dir="/tmp"))
            folders.append(folder)
            node.kubelet = FakeKubelet(folder)
            node.kubelet.start()
            node.loop = AgentLoop(node.name, node.nvml, KubePods(core, node.name), KubeNodeApi(core, node.name), folder)
        yield nodes
    finally:
        for node in nodes.values():
            if node.loop is not None:
                node.loop.manager.stop()
            if node.kubelet is not None:
                node.kubelet.stop()
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


def _expected_devices(node: AgentNode, slots: tuple[GpuSlot, ...]) -> list[str]:
    """The UUIDs NVIDIA's toolkit must get for an assignment's slots, read from the fake NVML."""
    uuids = []
    for slot in slots:
        if slot.mig:
            instances = node.nvml.mig_instances(slot.index)
            (instance,) = [i for i in instances if (i.profile, i.start) == (slot.mig, slot.start)]
            uuids.append(instance.uuid)
        else:
            uuids.append(node.nvml.gpus()[slot.index].uuid)
    return uuids


def test_each_kind_gets_in_allocate_exactly_its_assignment(
    cluster: E2ECluster, agent_nodes: dict[str, AgentNode]
) -> None:
    bodies = [
        pod_body(name, {resource: amount}, node_affinity={"kubernetes.io/hostname": [agent_nodes[kind].name]})
        for name, (kind, resource, amount) in PODS.items()
    ]
    bound = cluster.wait_all_bound(cluster.create_pods(bodies), timeout=90)
    assert bound == {name: agent_nodes[kind].name for name, (kind, _, _) in PODS.items()}
    pods = {pod["metadata"]["name"]: pod for pod in cluster.pods()}
    for node in agent_nodes.values():
        assert node.loop is not None and node.kubelet is not None
        node.loop.step()  # publishes nothing new (the Node already says what NVML says), registers the plugins
        assert node.loop.node_api.get_node()["metadata"]["annotations"] == node.body()["metadata"]["annotations"]
    for name, (kind, resource, amount) in PODS.items():
        node = agent_nodes[kind]
        assert node.kubelet is not None
        node.kubelet.wait_registered({resource})
        placement = assignment_from_pod(pods[name])
        assert placement is not None
        _, envs = node.kubelet.admit(resource, node.kubelet.devices(resource), amount)
        assert envs[VISIBLE].split(",") == _expected_devices(node, placement.slots), name
        if kind == "dyn":
            (slot,) = placement.slots
            assert node.nvml.created == [(slot.index, slot.mig, slot.start)]  # created at the assigned start
    dynamic = agent_nodes["dyn"]
    cluster.plane.delete_pod(cluster.namespace, "dynamic")
    wait_until("its pod to go", lambda: "dynamic" not in {p["metadata"]["name"] for p in cluster.pods()}, 30)
    assert dynamic.loop is not None
    dynamic.loop.step()
    assert dynamic.nvml.destroyed == dynamic.nvml.created and not any(
        dynamic.nvml.mig_instances(gpu.index) for gpu in dynamic.nvml.gpus()
    )
    assert cluster.assignment_problems() == []
