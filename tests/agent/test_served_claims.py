"""What the agent already handed out survives its restart, is never dealt twice, and matches how the
kubelet really hands devices to init containers, sidecars and app containers (#26 items 1, 2, 5, 6)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from gpupack.agent.fake_nvml import FakeNvml
from gpupack.agent.kubelet import deviceplugin_pb2 as pb
from gpupack.agent.main import AgentLoop
from gpupack.agent.podresources import KubeletPodResources
from gpupack.agent.pods import MemoryPods
from tests.agent.conftest import NODE, FakeKubelet, FakePodResources, make_pod
from tests.agent.test_device_plugins import _start
from tests.agent.test_node_publisher import FakeNodeApi

GPU, MIG_3G = "nvidia.com/gpu", "nvidia.com/mig-3g.40gb"
LATER = "2026-01-01T00:00:05Z"


def _loop(plugin_dir: Path, nvml: FakeNvml, pods: MemoryPods, podresources: Path) -> AgentLoop:
    node_api = FakeNodeApi({"gpupack.io/mig": "dynamic"})
    return AgentLoop(NODE, nvml, pods, node_api, plugin_dir, KubeletPodResources(podresources))


def _allocate(kubelet: FakeKubelet, resource: str, device_ids: list[str]) -> pb.ContainerAllocateResponse:
    request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=device_ids)])
    return kubelet.plugin(resource).Allocate(request, timeout=10).container_responses[0]


def test_a_restarted_agent_never_deals_an_admitted_pods_instance_again(
    plugin_dir, kubelet, podresources: FakePodResources
) -> None:
    """Pod a was admitted (its image still pulling) when the agent restarted: pod b gets its own instance."""
    nvml = FakeNvml.build(count=2, mig_enabled=True)
    pods = MemoryPods([
        make_pod("a", [{MIG_3G: 1}], [{"index": 0, "mig": "3g.40gb", "start": 0}]),
        make_pod("b", [{MIG_3G: 1}], [{"index": 1, "mig": "3g.40gb", "start": 4}], created=LATER),
    ])
    first = _loop(plugin_dir, nvml, pods, podresources.socket)
    try:
        first.step()
        kubelet.wait_registered({MIG_3G})
        chosen_a, envs_a = kubelet.admit(MIG_3G, kubelet.devices(MIG_3G), 1)
    finally:
        first.manager.stop()
    podresources.hold("ml/a", {MIG_3G: chosen_a})
    restarted = _loop(plugin_dir, nvml, pods, podresources.socket)
    try:
        restarted.step()
        kubelet.wait_registered({MIG_3G}, after=1)
        available = [d for d in kubelet.devices(MIG_3G) if d not in chosen_a]
        _, envs_b = kubelet.admit(MIG_3G, available, 1)
    finally:
        restarted.manager.stop()
    (on_gpu1,) = nvml.mig_instances(1)
    assert envs_b["NVIDIA_VISIBLE_DEVICES"] == on_gpu1.uuid != envs_a["NVIDIA_VISIBLE_DEVICES"]


def test_plugins_are_served_only_once_podresources_was_read(plugin_dir, kubelet) -> None:
    nvml = FakeNvml.build(count=1)
    podresources = FakePodResources(plugin_dir / "later.sock")
    loop = _loop(plugin_dir, nvml, MemoryPods([]), podresources.socket)
    try:
        loop.step()  # the kubelet's podresources socket is not there yet
        assert not loop.manager.plugins and not kubelet.registrations
        podresources.start()
        loop.step()
        kubelet.wait_registered({GPU})
    finally:
        loop.manager.stop()
        podresources.stop()


def test_the_ledger_forgets_pods_that_are_gone_or_finished(plugin_dir, kubelet, podresources) -> None:
    nvml = FakeNvml.build(count=2)
    pods = MemoryPods([make_pod("a", [{GPU: 1}], [{"index": 0}]), make_pod("b", [{GPU: 1}], [{"index": 1}])])
    podresources.hold("ml/a", {GPU: [nvml.gpus()[0].uuid]})
    podresources.hold("ml/b", {GPU: [nvml.gpus()[1].uuid]})
    loop = _loop(plugin_dir, nvml, pods, podresources.socket)
    try:
        loop.step()
        assert len(loop.manager.allocator.ledger) == 2
        pods.pods[0]["status"]["phase"] = "Succeeded"
        del pods.pods[1]
        loop.step()
        assert len(loop.manager.allocator.ledger) == 0
    finally:
        loop.manager.stop()


def test_an_instance_another_pod_was_served_is_never_dealt_again(plugin_dir, kubelet, agents) -> None:
    """A pod bound by hand with a copy of another pod's assignment (#26 item 2) does not get its instance."""
    nvml = FakeNvml.build(count=1, mig_enabled=True)
    slot = [{"index": 0, "mig": "3g.40gb", "start": 0}]
    pods = MemoryPods([make_pod("victim", [{MIG_3G: 1}], slot)])
    _start(plugin_dir, kubelet, agents, nvml, pods, dynamic=True)
    kubelet.wait_registered({MIG_3G})
    chosen, _ = kubelet.admit(MIG_3G, kubelet.devices(MIG_3G), 1)
    pods.pods.append(make_pod("forged", [{MIG_3G: 1}], slot, created=LATER))
    available = [d for d in kubelet.devices(MIG_3G) if d not in chosen]
    with pytest.raises(grpc.RpcError) as refused:
        kubelet.admit(MIG_3G, available, 1)
    details = str(refused.value.details())
    assert "ml/forged" in details and "another pod holds" in details and "victim" not in details
    assert len(nvml.created) == 1


def test_a_freed_overlapping_instance_is_destroyed_before_the_next_pods_is_made(plugin_dir, kubelet, agents) -> None:
    """The previous pod ended moments ago and the loop has not destroyed its instance yet (#26 item 5)."""
    nvml = FakeNvml.build(count=1, mig_enabled=True)
    nvml.create_mig(0, "3g.40gb", 4)
    ended = make_pod("ended", [{MIG_3G: 1}], [{"index": 0, "mig": "3g.40gb", "start": 4}], phase="Succeeded")
    new = make_pod("new", [{"nvidia.com/mig-7g.80gb": 1}], [{"index": 0, "mig": "7g.80gb", "start": 0}])
    agent = _start(plugin_dir, kubelet, agents, nvml, MemoryPods([ended, new]), dynamic=True)
    kubelet.wait_registered({"nvidia.com/mig-7g.80gb"})
    _, envs = kubelet.admit("nvidia.com/mig-7g.80gb", kubelet.devices("nvidia.com/mig-7g.80gb"), 1)
    (instance,) = nvml.mig_instances(0)
    assert (instance.profile, instance.start) == ("7g.80gb", 0)
    assert envs["NVIDIA_VISIBLE_DEVICES"] == instance.uuid
    assert nvml.destroyed == [(0, "3g.40gb", 4)]
    assert agent.allocator.refusals.current() == []


def test_an_instance_a_live_pod_holds_is_never_destroyed_to_make_room(plugin_dir, kubelet, agents) -> None:
    nvml = FakeNvml.build(count=1, mig_enabled=True)
    nvml.create_mig(0, "3g.40gb", 4)
    running = make_pod("running", [{MIG_3G: 1}], [{"index": 0, "mig": "3g.40gb", "start": 4}], phase="Running")
    new = make_pod("new", [{"nvidia.com/mig-7g.80gb": 1}], [{"index": 0, "mig": "7g.80gb", "start": 0}])
    _start(plugin_dir, kubelet, agents, nvml, MemoryPods([running, new]), dynamic=True)
    kubelet.wait_registered({"nvidia.com/mig-7g.80gb"})
    with pytest.raises(grpc.RpcError):
        kubelet.admit("nvidia.com/mig-7g.80gb", kubelet.devices("nvidia.com/mig-7g.80gb"), 1)
    assert nvml.destroyed == []


@pytest.mark.parametrize("reused", [0, 1])
def test_an_app_container_takes_whichever_init_container_gpu_the_kubelet_reuses(
    plugin_dir, kubelet, agents, reused: int
) -> None:
    """The kubelet hands an app container its init container's devices in map order (#26 item 6)."""
    nvml = FakeNvml.build(count=4)
    uuids = [gpu.uuid for gpu in nvml.gpus()]
    pods = MemoryPods([make_pod("p", [{GPU: 1}], [{"index": 1}, {"index": 3}], init=[{GPU: 2}])])
    _start(plugin_dir, kubelet, agents, nvml, pods)
    kubelet.wait_registered({GPU})
    init_chosen, _ = kubelet.admit(GPU, uuids, 2)
    assert sorted(init_chosen) == sorted([uuids[1], uuids[3]])
    response = _allocate(kubelet, GPU, [init_chosen[reused]])  # reused devices skip GetPreferredAllocation
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == init_chosen[reused]


def test_a_gpu_sidecar_and_the_app_container_each_get_their_own_gpu(plugin_dir, kubelet, agents) -> None:
    """A sidecar (`restartPolicy: Always`) keeps its devices; the kubelet does not reuse them (#26 item 6)."""
    nvml = FakeNvml.build(count=4)
    uuids = [gpu.uuid for gpu in nvml.gpus()]
    pod = make_pod("p", [{GPU: 1}], [{"index": 0}, {"index": 2}], init=[{GPU: 1}])
    pod["spec"]["initContainers"][0]["restartPolicy"] = "Always"
    _start(plugin_dir, kubelet, agents, nvml, MemoryPods([pod]))
    kubelet.wait_registered({GPU})
    sidecar, envs_sidecar = kubelet.admit(GPU, uuids, 1)
    app, envs_app = kubelet.admit(GPU, [u for u in uuids if u not in sidecar], 1)
    assert (sidecar, app) == ([uuids[0]], [uuids[2]])
    assert (envs_sidecar["NVIDIA_VISIBLE_DEVICES"], envs_app["NVIDIA_VISIBLE_DEVICES"]) == (uuids[0], uuids[2])


def test_a_refused_slot_is_not_blocked_any_more_once_the_loop_destroys_what_was_in_its_way(
    plugin_dir, kubelet, podresources
) -> None:
    """A process still used the ended pod's instance at Allocate; the loop destroys it later (#26 item 5)."""
    nvml = FakeNvml.build(count=1, mig_enabled=True)
    nvml.create_mig(0, "3g.40gb", 4)
    nvml.busy.add((0, 4))
    ended = make_pod("ended", [{MIG_3G: 1}], [{"index": 0, "mig": "3g.40gb", "start": 4}], phase="Succeeded")
    new = make_pod("new", [{"nvidia.com/mig-7g.80gb": 1}], [{"index": 0, "mig": "7g.80gb", "start": 0}])
    loop = _loop(plugin_dir, nvml, MemoryPods([ended, new]), podresources.socket)
    try:
        loop.step()
        kubelet.wait_registered({"nvidia.com/mig-7g.80gb"})
        with pytest.raises(grpc.RpcError):
            kubelet.admit("nvidia.com/mig-7g.80gb", kubelet.devices("nvidia.com/mig-7g.80gb"), 1)
        assert [b.slot.mig for b in loop.manager.allocator.refusals.current()] == ["7g.80gb"]
        nvml.busy.clear()
        loop.step()
        assert loop.manager.allocator.refusals.current() == []
    finally:
        loop.manager.stop()


def test_a_slot_whose_pod_is_gone_is_dealt_at_once_before_the_loop_forgets_it(plugin_dir, kubelet, agents) -> None:
    """Found on the real kubelet: the next pod came within the loop's 5 s and was refused for a gone pod."""
    nvml = FakeNvml.build(count=2)
    uuids = [gpu.uuid for gpu in nvml.gpus()]
    pods = MemoryPods([make_pod("gone", [{GPU: 1}], [{"index": 0}]),
                       make_pod("finished", [{GPU: 1}], [{"index": 1}], created=LATER)])
    _start(plugin_dir, kubelet, agents, nvml, pods)
    kubelet.wait_registered({GPU})
    assert [kubelet.admit(GPU, [uuid], 1)[0] for uuid in uuids] == [[uuids[0]], [uuids[1]]]
    pods.pods = [pods.pods[1], make_pod("next", [{GPU: 2}], [{"index": 0}, {"index": 1}], created=LATER)]
    pods.pods[0]["status"]["phase"] = "Succeeded"
    _, envs = kubelet.admit(GPU, uuids, 2)
    assert envs["NVIDIA_VISIBLE_DEVICES"] == f"{uuids[0]},{uuids[1]}"
