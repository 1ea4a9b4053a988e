"""podresources verification: the client over real gRPC, the comparison, `gpupack.io/devices-in-use`, metrics."""

from __future__ import annotations

import json

import grpc
import pytest

from gpupack.agent.agent_metrics import REGISTRY
from gpupack.agent.blocked_slots import Blocked, Refusals
from gpupack.agent.devices_in_use import devices_in_use
from gpupack.agent.fake_nvml import FakeNvml
from gpupack.agent.kind_dynamic_mig import LEFTOVER, dynamic_mig_id
from gpupack.agent.main import AgentLoop
from gpupack.agent.node_gpus import NodeGpus
from gpupack.agent.podresources import HeldDevices, KubeletPodResources
from gpupack.agent.pods import MemoryPods, live_assigned
from gpupack.agent.verification import Discrepancy, compare
from gpupack.kube.node_usage import MAX_REASON, parse_devices_in_use
from gpupack.scoring.facts import GpuSlot
from tests.agent.conftest import NODE, FakePodResources, make_pod
from tests.agent.test_node_publisher import FakeNodeApi

GPU, MILLI, MIG_3G = "nvidia.com/gpu", "gpupack.io/gpu-milli", "nvidia.com/mig-3g.40gb"
IN_USE = "gpupack.io/devices-in-use"


def _gpus(nvml: FakeNvml, dynamic: bool = False) -> NodeGpus:
    return NodeGpus.read(nvml, (0,) * len(nvml.gpus()), dynamic)


def test_the_client_reads_list_over_the_kubelet_socket(podresources: FakePodResources) -> None:
    podresources.hold("ml/a", {GPU: ["GPU-1", "GPU-2"]})
    podresources.hold("ml/cpu", {})
    held = KubeletPodResources(podresources.socket).list_held()
    assert held == [
        HeldDevices("ml/a", {GPU: ("GPU-1", "GPU-2")}, {"c0": {GPU: ("GPU-1", "GPU-2")}}),
        HeldDevices("ml/cpu", {}, {}),
    ]


def test_devices_equal_to_the_assignment_are_no_discrepancy() -> None:
    nvml = FakeNvml.build(count=4)
    uuids = [gpu.uuid for gpu in nvml.gpus()]
    pods = [make_pod("whole", [{GPU: 2}], [{"index": 1}, {"index": 3}]),
            make_pod("share", [{MILLI: 250}], [{"index": 2, "milli": 250}])]
    held = [HeldDevices("ml/whole", {GPU: (uuids[3], uuids[1])}),
            HeldDevices("ml/share", {MILLI: tuple(f"{uuids[2]}/milli-{k}" for k in range(250))}),
            HeldDevices("ml/cpu-only", {})]
    assert compare(held, pods, _gpus(nvml)) == []


def test_other_devices_than_the_assignment_are_extra_and_missing() -> None:
    nvml = FakeNvml.build(count=4)
    uuids = [gpu.uuid for gpu in nvml.gpus()]
    pods = [make_pod("moved", [{GPU: 1}], [{"index": 1}]), make_pod("stray", [{GPU: 1}], None)]
    held = [HeldDevices("ml/moved", {GPU: (uuids[2],)}),  # another plugin picked GPU 2
            HeldDevices("ml/stray", {GPU: (uuids[0], "vendor-x-7")}),  # no assignment; one ID unknown here
            HeldDevices("other/unlisted", {MILLI: tuple(f"{uuids[3]}/milli-{k}" for k in range(1000))})]
    assert compare(held, pods, _gpus(nvml)) == [
        Discrepancy("ml/moved", (GpuSlot(2),), (GpuSlot(1),), 0),
        Discrepancy("ml/stray", (GpuSlot(0),), (), 1),
        Discrepancy("other/unlisted", (GpuSlot(3),), (), 0),  # 1000 milli: the whole GPU
    ]


def test_mig_devices_map_to_their_placement() -> None:
    nvml = FakeNvml.build(count=2, mig_enabled=True)
    static = nvml.create_mig(1, "3g.40gb", 4)
    gpu0 = nvml.gpus()[0].uuid
    pods = [make_pod("dyn", [{MIG_3G: 1}], [{"index": 0, "mig": "3g.40gb", "start": 0}]),
            make_pod("odd", [{MIG_3G: 1}], [{"index": 1, "mig": "3g.40gb", "start": 0}])]
    held = [HeldDevices("ml/dyn", {MIG_3G: (dynamic_mig_id(gpu0, "3g.40gb", 1),)}),
            HeldDevices("ml/odd", {MIG_3G: (static.uuid,)})]
    assert compare(held, pods, _gpus(nvml, dynamic=True)) == [
        Discrepancy("ml/odd", (GpuSlot(1, mig="3g.40gb", start=4),), (GpuSlot(1, mig="3g.40gb", start=0),), 0),
    ]


def test_the_annotation_leaves_out_what_live_assignments_name_and_is_absent_when_empty() -> None:
    pods = [make_pod("waiting", [{GPU: 1}], [{"index": 2}]),
            make_pod("done", [{GPU: 1}], [{"index": 0}], phase="Succeeded")]
    named = live_assigned(pods, NODE)
    assert named == {GpuSlot(2)}
    found = [Discrepancy("ml/stray", (GpuSlot(2), GpuSlot(0)), (), 0), Discrepancy("ml/other", (), (GpuSlot(1),), 0)]
    refused = [Blocked(GpuSlot(1, mig="3g.40gb", start=4), "NVML refused")]
    value = json.loads(devices_in_use(found, refused, named) or "")
    assert value == {"pods": {"ml/stray": [{"index": 0}]},
                     "blocked": [{"index": 1, "mig": "3g.40gb", "start": 4, "reason": "NVML refused"}]}
    assert devices_in_use([], [], named) is None
    assert devices_in_use([Discrepancy("ml/w", (GpuSlot(2),), (), 0)], [], named) is None


def test_an_extra_share_equal_to_another_pods_share_is_still_reported() -> None:
    """A share is not exclusive: another pod's equal share on that GPU does not account for this one's."""
    named = live_assigned([make_pod("tenant", [{MILLI: 250}], [{"index": 1, "milli": 250}])], NODE)
    found = [Discrepancy("ml/stray", (GpuSlot(1, milli=250),), (), 0)]
    value = json.loads(devices_in_use(found, [], named) or "")
    assert value == {"pods": {"ml/stray": [{"index": 1, "milli": 250}]}}


def test_refusals_last_until_a_create_succeeds_or_their_ttl() -> None:
    now = [0.0]
    refusals = Refusals(ttl_s=60, clock=lambda: now[0])
    slot, other = GpuSlot(0, mig="3g.40gb", start=4), GpuSlot(1, mig="7g.80gb", start=0)
    refusals.record(slot, "Insufficient Resources")
    refusals.record(other, "Insufficient Resources")
    refusals.created(slot)
    assert refusals.current() == [Blocked(other, "Insufficient Resources")]
    now[0] = 61
    assert refusals.current() == []


def test_a_long_nvml_reason_is_cut_to_what_serve_accepts() -> None:
    """serve refuses a reason over MAX_REASON characters, and with it the node's whole annotation."""
    blocked = [Blocked(GpuSlot(0, mig="3g.40gb", start=4), "NVML refused: " + "x" * 2000)]
    value = devices_in_use([], blocked, set())
    assert value is not None
    usage = parse_devices_in_use(NODE, json.loads(value))
    assert usage.blocked == (GpuSlot(0, mig="3g.40gb", start=4),)
    assert len(json.loads(value)["blocked"][0]["reason"]) == MAX_REASON


def test_a_step_publishes_devices_in_use_and_the_metrics(plugin_dir, kubelet, podresources) -> None:
    nvml = FakeNvml.build(count=2, mig_enabled=True)
    stray = nvml.create_mig(0, "1g.10gb", 5)  # another plugin's instance inside the assigned 3g.40gb@4
    leftover = nvml.create_mig(1, "7g.80gb", 0)  # no pod holds it, a process still uses it
    nvml.busy = {(0, 5), (1, 0)}
    pods = MemoryPods([make_pod("mig", [{MIG_3G: 1}], [{"index": 0, "mig": "3g.40gb", "start": 4}])])
    podresources.hold("ml/stray", {"nvidia.com/mig-1g.10gb": [stray.uuid]})
    node_api = FakeNodeApi({"gpupack.io/mig": "dynamic"})
    loop = AgentLoop(NODE, nvml, pods, node_api, plugin_dir, KubeletPodResources(podresources.socket))
    annotation = lambda: json.loads(node_api.node["metadata"]["annotations"].get(IN_USE, "{}"))  # noqa: E731
    try:
        loop.step()
        assert annotation() == {
            "pods": {"ml/stray": [{"index": 0, "mig": "1g.10gb", "start": 5}]},
            "blocked": [{"index": 1, "mig": "7g.80gb", "start": 0, "reason": LEFTOVER}],
        }
        assert REGISTRY.get_sample_value("gpupack_agent_pods_with_unassigned_devices") == 1
        kubelet.wait_registered({MIG_3G})
        with pytest.raises(grpc.RpcError):  # NVML refuses 3g.40gb@4: 1g.10gb@5 sits there
            kubelet.admit(MIG_3G, kubelet.devices(MIG_3G), 1)
        pods.pods.clear()  # the refused pod is deleted: its slot is reported blocked
        nvml.busy.discard((1, 0))  # and the leftover is destroyed this time
        loop.step()
        assert annotation()["blocked"] == [
            {"index": 0, "mig": "3g.40gb", "start": 4, "reason": loop.manager.allocator.refusals.current()[0].reason}
        ]
        assert "Insufficient Resources" in annotation()["blocked"][0]["reason"]
        assert (1, "7g.80gb", 0) in nvml.destroyed and leftover not in nvml.mig_instances(1)
        podresources.pods.clear()  # the stray pod is gone too, and its instance can go
        nvml.busy.clear()
        loop.manager.allocator.refusals.created(GpuSlot(0, mig="3g.40gb", start=4))
        loop.step()
        assert IN_USE not in node_api.node["metadata"]["annotations"]  # nothing to tell: removed
    finally:
        loop.manager.stop()
