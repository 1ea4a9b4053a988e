"""The device-kind seam (agent.device_kind, agent.kinds): the four real kinds answer the interface as the agent
did before it, and a fifth kind — defined here, registered with one line — is advertised, dealt, allocated
and read back through the same paths (docs/adding-a-device-kind.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence, Set
from pathlib import Path

import grpc
import pytest

from gpupack.agent.blocked_slots import Blocked, Refusals
from gpupack.agent.claim import Ask, Claim
from gpupack.agent.claims import claims_for
from gpupack.agent.device_kind import (
    AllocationError,
    ContainerGrant,
    DeviceKind,
    DeviceNode,
    Held,
    Host,
    on_slot_gpu,
    read_each,
    take_per_slot,
)
from gpupack.agent.devices import advertised
from gpupack.agent.fake_nvml import FakeNvml
from gpupack.agent.kind_dynamic_mig import LEFTOVER, DynamicMig, dynamic_mig_id
from gpupack.agent.kind_share import Share, milli_id
from gpupack.agent.kind_static_mig import EMPTY_MIG_GPU, StaticMig
from gpupack.agent.kind_whole_gpu import WholeGpu
from gpupack.agent.kinds import KINDS, kind_named, register, registered, unregister
from gpupack.agent.kubelet import deviceplugin_pb2 as pb
from gpupack.agent.main import AgentLoop
from gpupack.agent.node_gpus import Device, NodeGpus
from gpupack.agent.podresources import HeldDevices
from gpupack.agent.pods import MemoryPods, Pod
from gpupack.agent.verification import compare
from gpupack.scoring.facts import GpuSlot
from tests.agent.conftest import NODE, Agent, FakeKubelet, make_pod
from tests.agent.test_node_publisher import FakeNodeApi

GPU, MILLI = "nvidia.com/gpu", "gpupack.io/gpu-milli"
MIG_3G, MIG_1G_ME = "nvidia.com/mig-3g.40gb", "nvidia.com/mig-1g.10gb.me"
LINK = "example.com/gpu-link"


# --- the fifth kind: this class is "the new file"


class FakeLink(DeviceKind):
    """One fake link device per GPU with MIG off (`<GPU UUID>/link`), handed out with the whole GPUs a pod is
    assigned: a pod asking for `nvidia.com/gpu: 2` and `example.com/gpu-link: 2` gets its two GPUs' links."""

    name = "fake GPU link"

    def owns(self, resource: str) -> bool:
        return resource == LINK

    def resource_of(self, slot: GpuSlot) -> str | None:
        return None if slot.mig or slot.milli else LINK

    def advertise(self, node: NodeGpus) -> dict[str, list[Device]]:
        return {LINK: [node.device(gpu, link_id(gpu.uuid)) for gpu in node.whole_gpus()]}

    def serving_ids(self, claim: Claim, devices: Sequence[Device], available: Set[str]) -> list[str] | None:
        return take_per_slot(claim, devices, available, on_slot_gpu)

    def grant(self, claim: Claim, host: Host) -> ContainerGrant:
        paths = [f"/dev/fake-link{slot.index}" for slot in claim.slots]
        return ContainerGrant({"FAKE_LINKS": ",".join(paths)}, tuple(DeviceNode(path, path) for path in paths))

    def read_held(self, ids: Sequence[str], gpus: NodeGpus, assigned: tuple[GpuSlot, ...]) -> Held:
        by_id = {link_id(gpu.uuid): GpuSlot(gpu.index) for gpu in gpus.gpus}
        return read_each(ids, by_id.get)


def link_id(gpu_uuid: str) -> str:
    return f"{gpu_uuid}/link"


@pytest.fixture
def fake_link() -> Iterator[FakeLink]:
    """FakeLink registered for one test, and unregistered after it."""
    kind = FakeLink()
    register(kind)  # the one line that adds a kind
    yield kind
    unregister(kind)


def _linked_pod() -> Pod:
    return make_pod("linked", [{GPU: 2, LINK: 2}], [{"index": 3}, {"index": 1}])


def test_a_registered_kind_is_advertised_dealt_and_allocated_by_the_device_plugins(
    plugin_dir: Path, kubelet: FakeKubelet, agents: list[Agent], fake_link: FakeLink
) -> None:
    nvml = FakeNvml.build(count=4)
    uuids = [gpu.uuid for gpu in nvml.gpus()]
    other = make_pod("other", [{GPU: 1, LINK: 1}], [{"index": 0}], created="2026-01-01T00:00:09Z")
    pods = MemoryPods([_linked_pod(), other])
    agent = Agent(nvml, pods, plugin_dir)
    agents.append(agent)
    agent.sync()
    kubelet.wait_registered({GPU, MILLI, LINK})
    assert kubelet.devices(LINK) == [link_id(uuid) for uuid in uuids]
    assert [c.slots for c in claims_for(pods.pods, NODE, LINK).claims] == [(GpuSlot(3), GpuSlot(1)), (GpuSlot(0),)]
    chosen, response = kubelet.admit_response(LINK, kubelet.devices(LINK), 2)
    assert chosen == [link_id(uuids[3]), link_id(uuids[1])]
    assert dict(response.envs) == {"FAKE_LINKS": "/dev/fake-link3,/dev/fake-link1"}
    assert [(d.container_path, d.host_path, d.permissions) for d in response.devices] == [
        ("/dev/fake-link3", "/dev/fake-link3", "rw"), ("/dev/fake-link1", "/dev/fake-link1", "rw")
    ]
    _, envs = kubelet.admit(GPU, uuids, 2)  # the same container's GPUs: the real kind, unchanged
    assert envs == {"NVIDIA_VISIBLE_DEVICES": f"{uuids[3]},{uuids[1]}"}
    with pytest.raises(grpc.RpcError) as refused:  # never a guess: the other pod is assigned GPU 0's link
        kubelet.plugin(LINK).Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[link_id(uuids[2])])])
        )
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no waiting pod's assignment names" in str(refused.value.details())


def test_a_registered_kind_is_served_by_the_loop_and_read_back_by_verification(
    plugin_dir: Path, kubelet: FakeKubelet, fake_link: FakeLink
) -> None:
    nvml = FakeNvml.build(count=4)
    uuids = [gpu.uuid for gpu in nvml.gpus()]
    loop = AgentLoop(NODE, nvml, MemoryPods([_linked_pod()]), FakeNodeApi({}), plugin_dir)
    try:
        loop.step()
        kubelet.wait_registered({GPU, LINK})
    finally:
        loop.manager.stop()
    held = [HeldDevices("ml/linked", {GPU: (uuids[3], uuids[1]), LINK: (link_id(uuids[3]), link_id(uuids[1]))})]
    gpus = NodeGpus.read(nvml, (0,) * 4, False)
    assert compare(held, [_linked_pod()], gpus) == []  # the links stand for the assigned GPUs: nothing unknown


def test_registration_is_undone_and_one_kind_registers_once(fake_link: FakeLink) -> None:
    assert registered() == (*KINDS, fake_link) and kind_named(LINK) is fake_link
    with pytest.raises(ValueError, match="registered already"):
        register(fake_link)


def test_without_it_the_agent_serves_the_four_kinds() -> None:
    assert registered() == KINDS
    assert [type(kind) for kind in KINDS] == [WholeGpu, Share, StaticMig, DynamicMig]
    assert kind_named(LINK) is None
    assert LINK not in advertised(NodeGpus.read(FakeNvml.build(count=1), (0,), False))


# --- the four real kinds, each through the interface


def _host(nvml: FakeNvml, dynamic: bool = False, pods: Sequence[Pod] = ()) -> Host:
    gpus = NodeGpus.read(nvml, (0,) * len(nvml.gpus()), dynamic)
    return Host(NODE, nvml, gpus, MemoryPods(list(pods)), Refusals())


def _claim(resource: str, amount: int, *slots: GpuSlot) -> Claim:
    return Claim("ml/p", "uid-p", "c0", "2026-01-01T00:00:00Z", resource, amount, slots)


def _ids(offered: dict[str, list[Device]]) -> dict[str, list[str]]:
    return {resource: [d.id for d in devices] for resource, devices in offered.items()}


def test_the_whole_gpu_kind_hands_the_assigned_gpus_with_mig_off() -> None:
    nvml = FakeNvml.build(count=3)
    nvml.devices[2] = dataclasses.replace(nvml.devices[2], mig_enabled=True)
    host, kind = _host(nvml), WholeGpu()
    uuids = [gpu.uuid for gpu in nvml.gpus()]
    offered = kind.advertise(host.gpus)
    assert _ids(offered) == {GPU: uuids[:2]}
    claim = _claim(GPU, 1, GpuSlot(1))
    assert kind.serving_ids(claim, offered[GPU], set(uuids)) == [uuids[1]]
    assert kind.serving_ids(claim, offered[GPU], {uuids[0]}) is None
    assert kind.grant(claim, host) == ContainerGrant({"NVIDIA_VISIBLE_DEVICES": uuids[1]})
    assert kind.split([GpuSlot(0), GpuSlot(1)], [Ask(1), Ask(1)]) == [(GpuSlot(0),), (GpuSlot(1),)]
    assert kind.split([GpuSlot(0)], [Ask(2)]) is None
    assert kind.read_held([uuids[2], "vendor-x-7"], host.gpus, ()) == ([GpuSlot(2)], ["vendor-x-7"])
    assert (kind.resource_of(GpuSlot(0)), kind.resource_of(GpuSlot(0, milli=5))) == (GPU, None)
    assert kind.owns(GPU) and not kind.owns(MILLI) and kind.tidy(host) == []


def test_the_share_kind_hands_the_whole_gpu_with_its_milli() -> None:
    nvml = FakeNvml.build(count=2)
    host, kind = _host(nvml), Share()
    uuids = [gpu.uuid for gpu in nvml.gpus()]
    offered = kind.advertise(host.gpus)
    assert len(offered[MILLI]) == 2000 and offered[MILLI][1000].id == milli_id(uuids[1], 0) == f"{uuids[1]}/milli-0"
    slot = GpuSlot(1, milli=250)
    claim = _claim(MILLI, 3, slot)
    assert kind.serving_ids(claim, offered[MILLI], {d.id for d in offered[MILLI]}) == [
        milli_id(uuids[1], k) for k in range(3)
    ]
    assert kind.grant(claim, host) == ContainerGrant({"NVIDIA_VISIBLE_DEVICES": uuids[1], "GPUPACK_GPU_MILLI": "3"})
    assert kind.split([slot], [Ask(100), Ask(150)]) == [(slot,), (slot,)]  # every container: the one share slot
    ids = [milli_id(uuids[1], k) for k in range(250)] + [milli_id(uuids[0], k) for k in range(1000)]
    assert kind.read_held([*ids, uuids[0]], host.gpus, ()) == ([GpuSlot(0), slot], [uuids[0]])
    assert (kind.resource_of(slot), kind.resource_of(GpuSlot(1))) == (MILLI, None)


def test_the_static_mig_kind_hands_existing_instances_by_uuid_and_blocks_empty_mig_gpus() -> None:
    nvml = FakeNvml.build(count=2, mig_enabled=True)
    made = nvml.create_mig(0, "3g.40gb", 4)
    host, kind = _host(nvml), StaticMig()
    offered = kind.advertise(host.gpus)
    assert offered == {MIG_3G: [Device(made.uuid, 0, 0, made)]}
    assert kind.advertise(_host(nvml, dynamic=True).gpus) == {}
    slot = GpuSlot(0, mig="3g.40gb", start=4)
    claim = _claim(MIG_3G, 1, slot)
    assert kind.serving_ids(claim, offered[MIG_3G], {made.uuid}) == [made.uuid]
    assert kind.serving_ids(_claim(MIG_3G, 1, GpuSlot(0, mig="3g.40gb", start=0)), offered[MIG_3G], {made.uuid}) is None
    assert kind.grant(claim, host) == ContainerGrant({"NVIDIA_VISIBLE_DEVICES": made.uuid})
    with pytest.raises(AllocationError, match=r"no MIG instance 3g\.40gb@0 on GPU 1"):
        kind.grant(_claim(MIG_3G, 1, GpuSlot(1, mig="3g.40gb", start=0)), host)
    assert kind.read_held([made.uuid], host.gpus, ()) == ([slot], [])
    assert kind.tidy(host) == [Blocked(GpuSlot(1), EMPTY_MIG_GPU)]
    assert kind.tidy(_host(nvml, dynamic=True)) == []
    assert kind.resource_of(GpuSlot(0, mig="1g.10gb+me", start=0)) == MIG_1G_ME and kind.owns(MIG_1G_ME)


def test_the_dynamic_mig_kind_creates_the_assigned_instance_and_destroys_unheld_ones() -> None:
    nvml = FakeNvml.build(count=2, mig_enabled=True)
    kind, uuid0 = DynamicMig(), nvml.gpus()[0].uuid
    host = _host(nvml, dynamic=True)
    offered = kind.advertise(host.gpus)
    assert len(offered[MIG_3G]) == 4 and len(offered[MIG_1G_ME]) == 2  # upper bounds: 2 and 1 per GPU
    assert kind.advertise(_host(nvml).gpus) == {}
    slot = GpuSlot(0, mig="3g.40gb", start=4)
    claim = _claim(MIG_3G, 1, slot)
    assert kind.serving_ids(claim, offered[MIG_3G], {d.id for d in offered[MIG_3G]}) == [
        dynamic_mig_id(uuid0, "3g.40gb", 0)
    ]
    assert kind.grant(claim, host) == ContainerGrant({"NVIDIA_VISIBLE_DEVICES": nvml.mig_instances(0)[0].uuid})
    assert nvml.created == [(0, "3g.40gb", 4)]
    nvml.create_mig(1, "1g.10gb", 5)  # someone else's, inside the next assigned placement, in use
    nvml.busy = {(1, 5)}
    refused = GpuSlot(1, mig="3g.40gb", start=4)
    with pytest.raises(AllocationError, match="Insufficient Resources"):
        kind.grant(_claim(MIG_3G, 1, refused), host)
    assert [b.slot for b in host.refusals.current()] == [refused]
    held_id = dynamic_mig_id(uuid0, "3g.40gb", 1)
    assert kind.read_held([held_id], host.gpus, (slot,)) == ([slot], [])
    assert kind.read_held([held_id], host.gpus, ()) == ([], [held_id])  # not its assignment: unknown
    pods = [make_pod("p", [{MIG_3G: 1}], [slot.to_json()])]
    assert kind.tidy(_host(nvml, dynamic=True, pods=pods)) == [
        Blocked(GpuSlot(1, mig="1g.10gb", start=5), LEFTOVER)
    ]
    nvml.busy.clear()
    assert kind.tidy(_host(nvml, dynamic=True)) == [] and nvml.destroyed == [(0, "3g.40gb", 4), (1, "1g.10gb", 5)]


def test_each_slot_of_an_assignment_has_one_resource_among_the_kinds() -> None:
    slots = {GpuSlot(0): GPU, GpuSlot(0, milli=5): MILLI, GpuSlot(0, mig="3g.40gb", start=4): MIG_3G}
    for slot, resource in slots.items():
        assert {kind.resource_of(slot) for kind in KINDS} - {None} == {resource}
        owner = kind_named(resource)  # the kind that deals a pod's claims on it
        assert owner is not None and owner.resource_of(slot) == resource
