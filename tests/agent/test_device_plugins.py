"""The device plugins against a fake kubelet speaking v1beta1 gRPC over unix sockets."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from gpupack.agent.fake_nvml import FakeNvml
from gpupack.agent.kubelet import deviceplugin_pb2 as pb
from gpupack.agent.mig_lifecycle import held_instances, reconcile
from gpupack.agent.pods import MemoryPods
from tests.agent.conftest import NODE, Agent, FakeKubelet, make_pod

GPU, MILLI = "nvidia.com/gpu", "gpupack.io/gpu-milli"
MIG_3G, MIG_1G_ME = "nvidia.com/mig-3g.40gb", "nvidia.com/mig-1g.10gb.me"


def _start(plugin_dir: Path, kubelet: FakeKubelet, agents: list[Agent], nvml: FakeNvml, pods: MemoryPods,
           dynamic: bool = False) -> Agent:
    agent = Agent(nvml, pods, plugin_dir, dynamic)
    agents.append(agent)
    agent.sync()
    return agent


def test_whole_gpus_and_shares_register_and_list(plugin_dir, kubelet, agents) -> None:
    nvml = FakeNvml.build(count=4)
    _start(plugin_dir, kubelet, agents, nvml, MemoryPods())
    registered = kubelet.wait_registered({GPU, MILLI})
    assert {r.version for r in registered} == {"v1beta1"}
    assert all(r.options.get_preferred_allocation_available for r in registered)
    assert kubelet.devices(GPU) == [gpu.uuid for gpu in nvml.gpus()]
    assert len(kubelet.devices(MILLI)) == 4000


def test_whole_gpus_are_the_assigned_ones_and_the_oldest_pod_goes_first(plugin_dir, kubelet, agents) -> None:
    nvml = FakeNvml.build(count=4)
    uuids = [gpu.uuid for gpu in nvml.gpus()]
    pods = MemoryPods([
        make_pod("late", [{GPU: 2}], [{"index": 0}, {"index": 2}], created="2026-01-01T00:00:09Z"),
        make_pod("early", [{GPU: 2}], [{"index": 3}, {"index": 1}], created="2026-01-01T00:00:01Z"),
    ])
    _start(plugin_dir, kubelet, agents, nvml, pods)
    kubelet.wait_registered({GPU})
    chosen, envs = kubelet.admit(GPU, uuids, 2)
    assert chosen == [uuids[3], uuids[1]]
    assert envs["NVIDIA_VISIBLE_DEVICES"] == f"{uuids[3]},{uuids[1]}"
    chosen, envs = kubelet.admit(GPU, [uuids[0], uuids[2]], 2)
    assert envs["NVIDIA_VISIBLE_DEVICES"] == f"{uuids[0]},{uuids[2]}"


def test_pods_created_in_one_second_go_in_binding_order_not_by_name(plugin_dir, kubelet, agents) -> None:
    """The kubelet keeps arrival (binding) order among equal creation seconds: the resourceVersion tells it."""
    nvml = FakeNvml.build(count=2)
    uuids = [gpu.uuid for gpu in nvml.gpus()]
    first = make_pod("running", [{GPU: 1}], [{"index": 0}], created="2026-01-01T00:00:01Z")
    second = make_pod("finished", [{GPU: 1}], [{"index": 1}], created="2026-01-01T00:00:01Z")
    first["metadata"]["resourceVersion"], second["metadata"]["resourceVersion"] = "1201", "1202"
    _start(plugin_dir, kubelet, agents, nvml, MemoryPods([second, first]))
    kubelet.wait_registered({GPU})
    chosen, envs = kubelet.admit(GPU, uuids, 1)
    assert chosen == [uuids[0]] and envs["NVIDIA_VISIBLE_DEVICES"] == uuids[0]


def test_unmatched_containers_are_refused_naming_pods_only_in_the_agents_log(
    plugin_dir, kubelet, agents, caplog
) -> None:
    """The refusal reaches the refused pod's events: another tenant's pods are named in the agent's log only."""
    nvml = FakeNvml.build(count=4)
    uuids = [gpu.uuid for gpu in nvml.gpus()]
    pods = MemoryPods([make_pod("stray", [{GPU: 1}], None), make_pod("placed", [{GPU: 1}], [{"index": 2}])])
    _start(plugin_dir, kubelet, agents, nvml, pods)
    kubelet.wait_registered({GPU})
    stub = kubelet.plugin(GPU)
    with pytest.raises(grpc.RpcError) as refused:  # the kubelet picked GPU 0, the assignment says GPU 2
        stub.Allocate(pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[uuids[0]])]))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = str(refused.value.details())
    assert "no waiting pod's assignment names" in details and "ml/" not in details
    assert "ml/placed" in caplog.text
    pods.pods[1]["status"]["phase"] = "Running"
    with pytest.raises(grpc.RpcError) as refused:
        kubelet.admit(GPU, uuids, 1)
    details = str(refused.value.details())
    assert "holds a gpupack.io/assignment for 1 nvidia.com/gpu" in details
    assert "1 with a missing or unreadable" in details
    assert "ml/" not in details
    assert "ml/stray asks for nvidia.com/gpu but has no gpupack.io/assignment" in caplog.text


def test_a_share_is_time_sliced_on_the_assigned_gpu(plugin_dir, kubelet, agents) -> None:
    nvml = FakeNvml.build(count=4)
    pods = MemoryPods([make_pod("small", [{MILLI: 250}], [{"index": 2, "milli": 250}])])
    _start(plugin_dir, kubelet, agents, nvml, pods)
    kubelet.wait_registered({MILLI})
    chosen, envs = kubelet.admit(MILLI, kubelet.devices(MILLI), 250)
    gpu2 = nvml.gpus()[2].uuid
    assert len(chosen) == 250 and all(device.startswith(gpu2 + "/") for device in chosen)
    assert envs == {"NVIDIA_VISIBLE_DEVICES": gpu2, "GPUPACK_GPU_MILLI": "250"}


def test_dynamic_mig_creates_the_assigned_instance_before_allocate_returns(plugin_dir, kubelet, agents) -> None:
    nvml = FakeNvml.from_capture(Path(__file__).parents[1] / "data" / "nvml-h100x4.json", mig_enabled=True)
    pods = MemoryPods([make_pod("mig", [{MIG_3G: 1}], [{"index": 1, "mig": "3g.40gb", "start": 4}])])
    _start(plugin_dir, kubelet, agents, nvml, pods, dynamic=True)
    kubelet.wait_registered({MIG_3G, MIG_1G_ME})
    assert len(kubelet.devices(MIG_3G)) == 8  # 2 per GPU: the upper bound
    assert len(kubelet.devices(MIG_1G_ME)) == 4  # one media-extension instance per GPU
    assert GPU not in {r.resource_name for r in kubelet.registrations}  # every GPU is in MIG mode
    _, envs = kubelet.admit(MIG_3G, kubelet.devices(MIG_3G), 1)
    assert nvml.created == [(1, "3g.40gb", 4)]
    assert envs["NVIDIA_VISIBLE_DEVICES"] == nvml.mig_instances(1)[0].uuid
    pods.pods.clear()  # the pod is gone: its instance goes
    assert [(i.gpu, i.start) for i in reconcile(nvml, held_instances(pods.pods, NODE))] == [(1, 4)]


def test_an_nvml_refusal_is_an_allocation_error_with_nvmls_reason(plugin_dir, kubelet, agents) -> None:
    nvml = FakeNvml.build(count=2, mig_enabled=True)
    nvml.create_mig(0, "1g.10gb", 5)  # made by someone else, inside the assigned 3g.40gb@4, in use
    nvml.busy.add((0, 5))
    pods = MemoryPods([make_pod("mig", [{MIG_3G: 1}], [{"index": 0, "mig": "3g.40gb", "start": 4}])])
    _start(plugin_dir, kubelet, agents, nvml, pods, dynamic=True)
    kubelet.wait_registered({MIG_3G})
    with pytest.raises(grpc.RpcError) as refused:
        kubelet.admit(MIG_3G, kubelet.devices(MIG_3G), 1)
    details = str(refused.value.details())
    assert "ml/mig" in details and "Insufficient Resources" in details


def test_static_mig_instances_are_handed_by_their_uuid(plugin_dir, kubelet, agents) -> None:
    nvml = FakeNvml.build(count=1, mig_enabled=True)
    made = [nvml.create_mig(0, "3g.40gb", 0), nvml.create_mig(0, "3g.40gb", 4)]
    pods = MemoryPods([make_pod("s", [{MIG_3G: 1}], [{"index": 0, "mig": "3g.40gb", "start": 4}])])
    _start(plugin_dir, kubelet, agents, nvml, pods, dynamic=False)
    kubelet.wait_registered({MIG_3G})
    assert kubelet.devices(MIG_3G) == [made[0].uuid, made[1].uuid]
    chosen, envs = kubelet.admit(MIG_3G, kubelet.devices(MIG_3G), 1)
    assert chosen == [made[1].uuid] and envs["NVIDIA_VISIBLE_DEVICES"] == made[1].uuid
    assert nvml.created == [(0, "3g.40gb", 0), (0, "3g.40gb", 4)]  # nothing new


def test_plugins_register_again_after_a_kubelet_restart(plugin_dir, kubelet, agents) -> None:
    agent = _start(plugin_dir, kubelet, agents, FakeNvml.build(count=2), MemoryPods())
    first = len(kubelet.wait_registered({GPU, MILLI}))
    kubelet.restart()  # removes the plugin sockets, as the kubelet does
    agent.manager.check()
    again = kubelet.wait_registered({GPU, MILLI}, after=first)
    assert len(again) == 2
    assert len(kubelet.devices(GPU)) == 2  # served on a fresh socket


def test_agent_restart_rebuilds_from_pods_and_nvml(plugin_dir, kubelet, agents) -> None:
    nvml = FakeNvml.build(count=2, mig_enabled=True)
    pods = MemoryPods([
        make_pod("a", [{MIG_3G: 1}], [{"index": 0, "mig": "3g.40gb", "start": 0}]),
        make_pod("b", [{MIG_3G: 1}], [{"index": 1, "mig": "3g.40gb", "start": 4}], created="2026-01-01T00:00:05Z"),
    ])
    agent = _start(plugin_dir, kubelet, agents, nvml, pods, dynamic=True)
    kubelet.wait_registered({MIG_3G})
    _, envs_a = kubelet.admit(MIG_3G, kubelet.devices(MIG_3G), 1)
    assert envs_a["NVIDIA_VISIBLE_DEVICES"] == nvml.mig_instances(0)[0].uuid
    nvml.create_mig(1, "3g.40gb", 4)  # b's instance was made, then the agent stopped before answering
    agent.manager.stop()
    agents.remove(agent)
    pods.pods[0]["status"]["phase"] = "Succeeded"  # a finished while the agent was down
    restarted = _start(plugin_dir, kubelet, agents, nvml, pods, dynamic=True)
    destroyed = reconcile(nvml, held_instances(pods.pods, NODE))  # the agent's start-up reconcile
    assert [(i.gpu, i.start) for i in destroyed] == [(0, 0)]
    kubelet.wait_registered({MIG_3G}, after=1)
    _, envs_b = kubelet.admit(MIG_3G, kubelet.devices(MIG_3G), 1)
    assert envs_b["NVIDIA_VISIBLE_DEVICES"] == nvml.mig_instances(1)[0].uuid  # reused, not created twice
    assert nvml.created == [(0, "3g.40gb", 0), (1, "3g.40gb", 4)]
    assert len(restarted.allocator.ledger) == 1
