"""The shipped gpupack on a real node: kubelet + containerd + runc, the image built from the repository.

The full control plane at the newest release, a real kubelet, the gpupack image built from the
Dockerfile and the shipped manifests applied (changed only where the machine forces it: deploy.py).
The scheduler Deployment and the agent DaemonSet run as pods on the node; GPU pods of every kind are
scheduled by that deployed scheduler and started by the kubelet, and each container's device variables
must equal its `gpupack.io/assignment` and what the kubelet's podresources API says it holds.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupack.harness.kube_programs import NEWEST, MissingBinary
from tests.e2e import deploy, images
from tests.e2e.conftest import missing_program
from tests.e2e.nodecase import (
    NODE_LABELS,
    NodeCluster,
    expected_ids,
    gpu_pod,
    held_gpus,
    reconfigure,
    wait_gone,
    write_fake_gpus,
)
from tests.e2e.realcluster import FullControlPlane
from tests.e2e.realnode import RealNode, wait_for

MINOR = NEWEST.rsplit(".", 1)[0]
VISIBLE = "NVIDIA_VISIBLE_DEVICES"


def deployed(cluster: NodeCluster) -> bool:
    """The agent's plugins are registered and the gpupack scheduler pod is ready."""
    allocatable = cluster.core().read_node(cluster.node.name).status.allocatable or {}
    if int(allocatable.get("nvidia.com/gpu", "0")) != 4:
        return False
    pods = cluster.core().list_namespaced_pod("gpupack-system").items
    return any(all(c.ready for c in pod.status.container_statuses or [False]) for pod in pods) and bool(pods)


@pytest.fixture(scope="module")
def node_cluster() -> Iterator[NodeCluster]:
    """Everything above, for the module; torn down afterwards, whatever state it reached."""
    try:
        plane = FullControlPlane(NEWEST)
    except MissingBinary as exc:
        missing_program(exc)
    archives = images.build_all(plane.kube_bin / "kube-scheduler", NEWEST)
    overlay = Path(tempfile.mkdtemp(prefix="gpupack-e2e-overlay-"))
    node = RealNode(plane, plane.kube_bin / "kubelet")
    try:
        plane.start()
        node.start(list(archives.values()))
        write_fake_gpus(Path(deploy.FAKE_NVML_FILE))
        core = plane.core()
        core.patch_node(node.name, {"metadata": {"labels": NODE_LABELS}})
        gpupack_image = next(name for name in archives if name.startswith("localhost/gpupack:"))
        deploy.apply(
            plane.kube_bin / "kubectl",
            plane.kubeconfig,
            deploy.write_overlay(overlay, MINOR, gpupack_image, plane.apiserver_port),
        )
        namespace = f"e2e-node-{uuid.uuid4().hex[:5]}"
        plane.create_namespace(namespace)
        cluster = NodeCluster(plane, node, namespace)
        wait_for("the agent's GPUs on the node and the gpupack scheduler ready", lambda: deployed(cluster), 300)
        yield cluster
    finally:
        node.stop()
        plane.stop()
        shutil.rmtree(overlay, ignore_errors=True)
        shutil.rmtree(Path(deploy.FAKE_NVML_DIR).parent, ignore_errors=True)  # /var/lib/gpupack-e2e


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


def test_whole_gpus_shares_and_static_mig_start_with_exactly_their_assignment(node_cluster: NodeCluster) -> None:
    pods = {
        "one-gpu": {"nvidia.com/gpu": 1},
        "two-gpus": {"nvidia.com/gpu": 2},
        "share": {"gpupack.io/gpu-milli": 250},
        "static-mig": {"nvidia.com/mig-2g.20gb": 1},
        "media-mig": {"nvidia.com/mig-1g.10gb.me": 1},
    }
    for name, limits in pods.items():
        node_cluster.create(gpu_pod(name, limits))
    visible = {name: check_devices(node_cluster, name) for name in pods}

    pair = {int(uuid[-1]) for uuid in visible["two-gpus"]}
    assert pair in ({0, 1}, {2, 3}), "a two-GPU pod gets an NVLinked pair"
    assert node_cluster.container_env("share")["GPUPACK_GPU_MILLI"] == "250"
    gpus = node_cluster.gpus()
    static = {i.uuid: (i.profile, i.start) for i in gpus.mig_instances(4)}
    assert static[visible["static-mig"][0]] == ("2g.20gb", 2)
    assert static[visible["media-mig"][0]] == ("1g.10gb+me", 0)
    whole = [visible[name] for name in ("one-gpu", "two-gpus")]
    assert len({uuid for uuids in whole for uuid in uuids}) == 3, "no GPU handed out twice"
    delete_all(node_cluster, list(pods))


def test_dynamic_mig_is_created_at_the_assigned_start_and_destroyed_after_the_pod(node_cluster: NodeCluster) -> None:
    """The operator turns MIG on for every GPU and marks the node dynamic, with the agent off meanwhile."""
    reconfigure(node_cluster, dynamic=True)
    node_cluster.create(gpu_pod("dynamic", {"nvidia.com/mig-3g.40gb": 1}))
    (visible,) = check_devices(node_cluster, "dynamic")
    (slot,) = node_cluster.assignment("dynamic")
    (instance,) = [i for i in node_cluster.gpus().mig_instances(slot.index) if i.uuid == visible]
    assert (instance.profile, instance.start) == (slot.mig, slot.start)

    delete_all(node_cluster, ["dynamic"])
    gone = lambda: visible not in {i.uuid for g in range(6) for i in node_cluster.gpus().mig_instances(g)}  # noqa: E731
    wait_for("the agent to destroy the instance no pod holds", gone, 60)
    reconfigure(node_cluster, dynamic=False)


def test_agent_restarted_while_a_pod_is_admitted_but_not_running(node_cluster: NodeCluster) -> None:
    """The kubelet allocated (the init container runs) when the agent goes; nothing is handed out twice."""
    core = node_cluster.core()
    node_cluster.create(gpu_pod("admitted", {"nvidia.com/gpu": 1}, init_sleep=20))

    def initialising() -> bool:
        status = node_cluster.pod("admitted").status
        assert status.phase != "Failed", node_cluster.events("admitted")
        return any(init.state.running for init in status.init_container_statuses or [])

    wait_for("the admitted pod's init container to run", initialising, 120)
    (agent,) = core.list_namespaced_pod("gpupack-agent").items
    core.delete_namespaced_pod(agent.metadata.name, "gpupack-agent", grace_period_seconds=0)
    wait_for("a new agent pod to run", lambda: agent_running(node_cluster, other_than=agent.metadata.uid), 120)
    node_cluster.create(gpu_pod("after-restart", {"nvidia.com/gpu": 1}))
    first = check_devices(node_cluster, "admitted")
    second = check_devices(node_cluster, "after-restart")
    assert not set(first) & set(second)
    delete_all(node_cluster, ["admitted", "after-restart"])


def agent_running(cluster: NodeCluster, other_than: str) -> bool:
    """A new agent pod (not `other_than`) runs and its plugins are registered again."""
    pods = cluster.core().list_namespaced_pod("gpupack-agent").items
    fresh = [p for p in pods if p.metadata.uid != other_than and p.status.phase == "Running"]
    return bool(fresh) and bool(cluster.allocatable_now("nvidia.com/gpu"))


def test_kubelet_restarted_with_running_and_finished_gpu_pods(node_cluster: NodeCluster) -> None:
    node_cluster.create(gpu_pod("running", {"nvidia.com/gpu": 1}))
    finished = gpu_pod("finished", {"nvidia.com/gpu": 1})
    finished["spec"]["restartPolicy"] = "Never"
    finished["spec"]["containers"][0]["command"][-1] = "true"
    node_cluster.create(finished)
    before = check_devices(node_cluster, "running")
    wait_for("the finished pod to succeed", lambda: node_cluster.pod("finished").status.phase == "Succeeded", 120)

    node_cluster.node.restart_kubelet()
    wait_for(
        "the agent's plugins back with the kubelet", lambda: bool(node_cluster.allocatable_now("nvidia.com/gpu")), 120
    )
    assert check_devices(node_cluster, "running") == before
    assert node_cluster.pod("running").status.container_statuses[0].restart_count == 0
    assert node_cluster.pod("finished").status.phase == "Succeeded"
    node_cluster.create(gpu_pod("after-kubelet", {"nvidia.com/gpu": 2}))
    after = check_devices(node_cluster, "after-kubelet")
    assert not set(before) & set(after)
    delete_all(node_cluster, ["running", "finished", "after-kubelet"])


def test_containerd_restarted_under_a_running_gpu_pod(node_cluster: NodeCluster) -> None:
    node_cluster.create(gpu_pod("survivor", {"nvidia.com/gpu": 1}))
    before = check_devices(node_cluster, "survivor")
    node_cluster.node.restart_containerd()
    node_cluster.create(gpu_pod("after-containerd", {"nvidia.com/gpu": 1}))
    after = check_devices(node_cluster, "after-containerd")
    assert check_devices(node_cluster, "survivor") == before
    assert node_cluster.pod("survivor").status.container_statuses[0].restart_count == 0
    assert not set(before) & set(after)
    delete_all(node_cluster, ["survivor", "after-containerd"])


def test_a_pod_that_cannot_get_its_devices_fails_with_the_agents_reason(node_cluster: NodeCluster) -> None:
    """Bound to the node without gpupack (no assignment): the agent refuses Allocate and says why."""
    body = gpu_pod("unassigned", {"nvidia.com/gpu": 1})
    body["spec"]["nodeName"] = node_cluster.node.name
    node_cluster.create(body)
    wait_for("the unassigned pod to fail", lambda: node_cluster.pod("unassigned").status.phase == "Failed", 120)
    events = " ".join(node_cluster.events("unassigned")) + " " + str(node_cluster.pod("unassigned").status.message)
    assert "holds a gpupack.io/assignment for 1 nvidia.com/gpu" in events, events
    delete_all(node_cluster, ["unassigned"])
