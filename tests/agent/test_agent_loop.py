"""The agent's loop end to end over fakes: annotations published, plugins registered, MIG reconciled."""

from __future__ import annotations

import dataclasses
import json

from gpupack.agent.fake_nvml import FakeNvml
from gpupack.agent.kind_static_mig import EMPTY_MIG_GPU
from gpupack.agent.main import AgentLoop
from gpupack.agent.pods import MemoryPods
from tests.agent.conftest import NODE, make_pod
from tests.agent.test_node_publisher import FakeNodeApi


def test_a_step_publishes_reconciles_and_serves(plugin_dir, kubelet) -> None:
    nvml = FakeNvml.build(count=2, mig_enabled=True, nvswitch_links=18)
    nvml.create_mig(0, "3g.40gb", 0)  # held by a pod
    nvml.create_mig(1, "7g.80gb", 0)  # left over: no pod holds it
    pods = MemoryPods([make_pod("p", [{"nvidia.com/mig-3g.40gb": 1}], [{"index": 0, "mig": "3g.40gb", "start": 0}])])
    node_api = FakeNodeApi({"gpupack.io/mig": "dynamic"})
    loop = AgentLoop(NODE, nvml, pods, node_api, plugin_dir)
    try:
        loop.step()
        assert nvml.destroyed == [(1, "7g.80gb", 0)]
        annotations = node_api.node["metadata"]["annotations"]
        assert annotations["gpupack.io/gpu-topology"] == '{"nvlink":[[0,18],[18,0]],"numa":[0,0]}'
        assert "gpupack.io/mig-layout" not in annotations  # dynamic: gpupack places, no layout
        registered = {r.resource_name for r in kubelet.wait_registered({"nvidia.com/mig-3g.40gb"})}
        assert "nvidia.com/mig-1g.10gb.me" in registered
        loop.step()
        assert len(node_api.patches) == 1  # nothing changed the second time
    finally:
        loop.manager.stop()


def test_a_static_node_blocks_a_mig_gpu_without_instances_and_a_dynamic_one_does_not(plugin_dir, kubelet) -> None:
    """Found on the real node: gpupack serve counted such a GPU whole and assigned it; the agent refused."""
    nvml = FakeNvml.build(["NVIDIA H100 80GB HBM3"] * 3, mig_enabled=True)
    nvml.devices[0] = dataclasses.replace(nvml.devices[0], mig_enabled=False)
    nvml.create_mig(1, "3g.40gb", 0)
    cases: list[tuple[dict[str, str], list[dict[str, object]]]] = [
        ({}, [{"index": 2, "reason": EMPTY_MIG_GPU}]),
        ({"gpupack.io/mig": "dynamic"}, []),
    ]
    for operator_annotations, blocked in cases:
        node_api = FakeNodeApi(operator_annotations)
        loop = AgentLoop(NODE, nvml, MemoryPods([]), node_api, plugin_dir)
        try:
            loop.step()
        finally:
            loop.manager.stop()
        published = node_api.node["metadata"]["annotations"].get("gpupack.io/devices-in-use")
        assert (json.loads(published)["blocked"] if published else []) == blocked
