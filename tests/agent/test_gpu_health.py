"""GPU health in the agent (#26 item 8): one lost or XID-struck GPU is Unhealthy, the rest of the node works.

Before: NVML "GPU is lost" on one GPU failed every round (the topology read raised), so nothing was
published, the plugins were never updated, and every device stayed Healthy.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from gpupack.agent.agent_metrics import REGISTRY
from gpupack.agent.blocked_slots import Blocked
from gpupack.agent.devices_in_use import devices_in_use
from gpupack.agent.fake_nvml import FakeNvml
from gpupack.agent.kubelet import deviceplugin_pb2 as pb
from gpupack.agent.main import AgentLoop
from gpupack.agent.nvml import NvmlError
from gpupack.agent.pods import MemoryPods
from gpupack.agent.xid import XidVerdict, classify, describe
from gpupack.scoring.facts import GpuSlot
from tests.agent.conftest import NODE, FakeKubelet, make_pod
from tests.agent.test_node_publisher import FakeNodeApi

GPU, MILLI = "nvidia.com/gpu", "gpupack.io/gpu-milli"
IN_USE, CORDON = "gpupack.io/devices-in-use", "gpupack.io/cordoned-gpus"


@pytest.mark.parametrize(
    ("xid", "verdict"),
    [(13, "application"), (31, "application"), (43, "application"), (45, "application"), (68, "application"),
     (109, "application"), (63, "handled"), (92, "handled"), (94, "handled"), (48, "critical"), (64, "critical"),
     (74, "critical"), (79, "critical"), (95, "critical"), (119, "critical"), (120, "critical"), (999, "critical")],
)  # fmt: skip
def test_xids_are_classified_as_nvidias_catalogue_says(xid: int, verdict: str) -> None:
    assert classify(xid) == XidVerdict(verdict)


def test_an_xid_is_described_by_its_code_and_meaning() -> None:
    assert describe(79) == "XID 79 (GPU has fallen off the bus)"
    assert describe(999) == "XID 999"


def _health(kubelet: FakeKubelet, resource: str) -> dict[int, set[str]]:
    """GPU index (from the fake UUIDs' order) -> the health values of its devices, from ListAndWatch."""
    stream = kubelet.plugin(resource).ListAndWatch(pb.Empty(), timeout=5)
    first = next(stream)
    stream.cancel()
    out: dict[str, set[str]] = {}
    for device in first.devices:
        out.setdefault(device.ID.split("/")[0], set()).add(device.health)
    return {_INDEX[uuid]: health for uuid, health in out.items()}


_INDEX: dict[str, int] = {}


@pytest.fixture
def nvml() -> FakeNvml:
    fake = FakeNvml.build(count=4)
    _INDEX.clear()
    _INDEX.update({gpu.uuid: gpu.index for gpu in fake.gpus()})
    return fake


@pytest.fixture
def loop(nvml: FakeNvml, plugin_dir, kubelet) -> Iterator[AgentLoop]:
    pods = MemoryPods([make_pod("on-1", [{GPU: 1}], [{"index": 1}])])
    agent = AgentLoop(NODE, nvml, pods, FakeNodeApi({}), plugin_dir)
    yield agent
    agent.manager.stop()


def _blocked(agent: AgentLoop) -> list[dict[str, object]]:
    value = agent.node_api.get_node()["metadata"]["annotations"].get(IN_USE)
    return json.loads(value)["blocked"] if value else []


def _metric(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_a_lost_gpu_is_unhealthy_and_the_other_gpus_keep_working(nvml: FakeNvml, loop: AgentLoop, kubelet) -> None:
    loop.step()
    nvml.lost_gpus.add(2)
    loop.step()  # before: NvmlError from the topology read, every round
    assert _health(kubelet, GPU) == {0: {"Healthy"}, 1: {"Healthy"}, 2: {"Unhealthy"}, 3: {"Healthy"}}
    assert _health(kubelet, MILLI)[2] == {"Unhealthy"} and _health(kubelet, MILLI)[0] == {"Healthy"}
    assert _blocked(loop) == [{"index": 2, "reason": "unhealthy: GPU is lost (NVML)"}]
    assert _metric("gpupack_agent_unhealthy_gpus", reason="lost") == 1
    uuids = [gpu.uuid for gpu in nvml.gpus()]
    _, envs = kubelet.admit(GPU, [uuids[0], uuids[1], uuids[3]], 1)  # Allocate for a healthy GPU
    assert envs["NVIDIA_VISIBLE_DEVICES"] == uuids[1]
    annotations = loop.node_api.get_node()["metadata"]["annotations"]
    assert json.loads(annotations["gpupack.io/gpu-topology"])["nvlink"] == [[0] * 4] * 4  # unchanged

    nvml.lost_gpus.clear()  # NVML answers for it again (reset)
    loop.step()
    assert _health(kubelet, GPU) == {i: {"Healthy"} for i in range(4)}
    assert _blocked(loop) == []


def test_a_lost_static_mig_gpu_is_left_out_of_the_layout_and_its_instances_are_unhealthy(plugin_dir, kubelet) -> None:
    """The kubelet drops Unhealthy instances from allocatable; the layout must say the same, or serve would
    find them disagreeing and take the whole node out of use."""
    nvml = FakeNvml.build(count=2, mig_enabled=True)
    instance = nvml.create_mig(1, "3g.40gb", 4)
    nvml.create_mig(0, "7g.80gb", 0)
    node_api = FakeNodeApi({})
    loop = AgentLoop(NODE, nvml, MemoryPods([]), node_api, plugin_dir)
    try:
        loop.step()
        layout = node_api.node["metadata"]["annotations"]["gpupack.io/mig-layout"]
        assert json.loads(layout) == {"0": ["7g.80gb@0"], "1": ["3g.40gb@4"]}
        nvml.lost_gpus.add(1)
        loop.step()
        assert json.loads(node_api.node["metadata"]["annotations"]["gpupack.io/mig-layout"]) == {"0": ["7g.80gb@0"]}
        stream = kubelet.plugin("nvidia.com/mig-3g.40gb").ListAndWatch(pb.Empty(), timeout=5)
        devices = {d.ID: d.health for d in next(stream).devices}
        stream.cancel()
        assert devices == {instance.uuid: "Unhealthy"}  # still its MIG device, not a whole GPU
        nvml.lost_gpus.clear()
        loop.step()
        assert node_api.node["metadata"]["annotations"]["gpupack.io/mig-layout"] == layout
    finally:
        loop.manager.stop()


def test_a_critical_xid_marks_its_gpu_and_an_applications_xid_changes_nothing(nvml, loop, kubelet) -> None:
    nvml.raise_xid(0, 79)  # before the agent registered for events: NVML never delivers it
    loop.step()
    assert _blocked(loop) == []
    nvml.raise_xid(3, 13)  # the application's fault
    nvml.raise_xid(3, 94)  # contained ECC: the GPU handled it
    loop.step()
    assert _health(kubelet, GPU) == {i: {"Healthy"} for i in range(4)}
    assert _blocked(loop) == []
    nvml.raise_xid(3, 79)
    loop.step()
    assert _health(kubelet, GPU)[3] == {"Unhealthy"}
    assert _blocked(loop) == [{"index": 3, "reason": "unhealthy: XID 79 (GPU has fallen off the bus)"}]
    loop.step()  # stays until the agent restarts after a reset
    assert _health(kubelet, GPU)[3] == {"Unhealthy"}
    assert (_metric("gpupack_agent_xid_events_total", verdict="critical") or 0) >= 1


@pytest.mark.parametrize("by", ["index", "uuid"])
def test_a_cordoned_gpu_is_unhealthy_until_the_cordon_goes(nvml, loop, kubelet, by: str) -> None:
    entry = "2" if by == "index" else nvml.gpus()[2].uuid
    loop.node_api.node["metadata"]["annotations"][CORDON] = f"{entry}, nope, 17"
    loop.step()
    assert _health(kubelet, GPU) == {0: {"Healthy"}, 1: {"Healthy"}, 2: {"Unhealthy"}, 3: {"Healthy"}}
    reason = f"cordoned: {CORDON} names {'GPU 2' if by == 'index' else entry}"
    assert _blocked(loop) == [{"index": 2, "reason": reason}]
    assert _metric("gpupack_agent_cordon_entries_invalid") == 2
    assert _metric("gpupack_agent_unhealthy_gpus", reason="cordoned") == 1
    del loop.node_api.node["metadata"]["annotations"][CORDON]
    loop.step()
    assert _health(kubelet, GPU) == {i: {"Healthy"} for i in range(4)}


def test_an_out_of_service_gpu_is_published_even_while_a_pod_holds_it() -> None:
    """Other blocks on a slot a live assignment names are left out; this one is what serve must see."""
    named = {GpuSlot(1)}
    value = devices_in_use([], [Blocked(GpuSlot(1), "other")], named, [Blocked(GpuSlot(1), "unhealthy: x")])
    assert json.loads(value or "{}") == {"blocked": [{"index": 1, "reason": "unhealthy: x"}]}
    assert devices_in_use([], [Blocked(GpuSlot(1), "other")], named) is None


def test_nvml_errors_while_watching_never_fail_the_round(nvml, loop, kubelet, caplog) -> None:
    def broken(timeout_ms: int) -> None:
        raise NvmlError("Unknown Error")

    nvml.next_xid = broken
    loop.step()
    loop.step()
    assert sum("Unknown Error" in r.getMessage() for r in caplog.records) == 1
    assert _health(kubelet, GPU) == {i: {"Healthy"} for i in range(4)}
