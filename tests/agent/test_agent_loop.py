"""The agent's loop end to end over fakes: annotations published, plugins registered, MIG reconciled."""

from __future__ import annotations

from gpupack.agent.fake_nvml import FakeNvml
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
