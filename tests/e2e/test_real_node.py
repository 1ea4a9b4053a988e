"""The shipped gpupack on a real node: kubelet + containerd + runc, the image built from the repository.

The full control plane at the newest release, a real kubelet, the gpupack image built from the
Dockerfile and the shipped manifests applied (changed only where the machine forces it: deploy.py).
The scheduler Deployment and the agent DaemonSet run as pods on the node; GPU pods of every kind are
scheduled by that deployed scheduler and started by the kubelet, and each container's device variables
must equal its `gpupack.io/assignment` and what the kubelet's podresources API says it holds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpupack.kube.keys import ANNOTATION_ASSIGNMENT
from tests.e2e.impersonation import SCHEDULER, ApiAs, binding
from tests.e2e.nodecase import (
    ENV_LINE,
    VISIBLE,
    NodeCluster,
    blocked_gpus,
    check_devices,
    delete_all,
    edit_fake_gpus,
    expected_ids,
    gpu_pod,
    inject_xid,
    manifests_node_cluster,
    reconfigure,
)
from tests.e2e.realnode import container_log, wait_for


@pytest.fixture(scope="module")
def node_cluster() -> Iterator[NodeCluster]:
    """Everything above, for the module; torn down afterwards, whatever state it reached."""
    with manifests_node_cluster() as cluster:
        yield cluster


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
    agent_restarted_while_a_dynamic_mig_pod_is_admitted(node_cluster)
    overlapping_pod_bound_as_the_last_one_ends(node_cluster)
    reconfigure(node_cluster, dynamic=False)


def bind_as_gpupack(cluster: NodeCluster, body: dict[str, Any], slots: list[dict[str, Any]]) -> None:
    """Create the pod for no scheduler, then bind it to the node with `slots` as gpupack's scheduler does:
    a Binding carrying the assignment, written as its identity (the one the admission policy lets)."""
    body["spec"]["schedulerName"] = "e2e-by-hand"
    name = cluster.create(body)
    pod = cluster.core().api_client.sanitize_for_serialization(cluster.pod(name))
    assignment = json.dumps({"node": cluster.node.name, "gpus": slots})
    path = f"/api/v1/namespaces/{cluster.namespace}/pods/{name}/binding"
    request = binding(pod, cluster.node.name, {ANNOTATION_ASSIGNMENT: assignment})
    answer = ApiAs(cluster.plane, SCHEDULER).post(path, request)
    assert answer.status == 201, answer.body


def overlapping_pod_bound_as_the_last_one_ends(cluster: NodeCluster) -> None:
    """#26 item 5: a pod bound right after the one before it ended, on a placement overlapping its instance,
    was refused (NVML: in use) because the agent's loop had not destroyed the old instance yet."""
    first = gpu_pod("first-mig", {"nvidia.com/mig-3g.40gb": 1})
    first["spec"]["restartPolicy"] = "Never"
    first["spec"]["containers"][0]["command"] = ["true"]
    bind_as_gpupack(cluster, first, [{"index": 5, "mig": "3g.40gb", "start": 4}])
    wait_for("the first pod to end", lambda: cluster.pod("first-mig").status.phase == "Succeeded", 120, 0.05)
    whole_gpu = [{"index": 5, "mig": "7g.80gb", "start": 0}]
    bind_as_gpupack(cluster, gpu_pod("next-mig", {"nvidia.com/mig-7g.80gb": 1}), whole_gpu)
    (visible,) = check_devices(cluster, "next-mig")
    assert [(i.profile, i.start, i.uuid) for i in cluster.gpus().mig_instances(5)] == [("7g.80gb", 0, visible)]
    delete_all(cluster, ["first-mig", "next-mig"])


def agent_restarted_while_a_dynamic_mig_pod_is_admitted(cluster: NodeCluster) -> None:
    """#26 item 1: the restarted agent took the admitted pod's claim for open and dealt its instance again.

    A dynamic-MIG device ID only names a profile on a GPU, so the kubelet cannot keep two pods apart; the
    agent's ledger, rebuilt from podresources, must.
    """
    profile = {"nvidia.com/mig-3g.40gb": 1}
    cluster.create(gpu_pod("admitted-mig", profile, init_sleep=20))
    wait_for("the admitted pod's init container to run", lambda: init_running(cluster, "admitted-mig"), 120)
    restart_agent(cluster, "nvidia.com/mig-3g.40gb")
    cluster.create(gpu_pod("after-restart-mig", profile))
    first = check_devices(cluster, "admitted-mig")
    second = check_devices(cluster, "after-restart-mig")
    assert not set(first) & set(second)
    delete_all(cluster, ["admitted-mig", "after-restart-mig"])


def init_running(cluster: NodeCluster, name: str) -> bool:
    """The pod's init container runs (the kubelet has allocated its devices; it is not running yet)."""
    status = cluster.pod(name).status
    assert status.phase != "Failed", cluster.events(name)
    return any(init.state.running for init in status.init_container_statuses or [])


def restart_agent(cluster: NodeCluster, resource: str = "nvidia.com/gpu") -> None:
    """Delete the agent's pod at once and wait for its successor's plugin of `resource`."""
    core = cluster.core()
    (agent,) = core.list_namespaced_pod("gpupack-agent").items
    core.delete_namespaced_pod(agent.metadata.name, "gpupack-agent", grace_period_seconds=0)
    wait_for("a new agent pod to run", lambda: agent_running(cluster, agent.metadata.uid, resource), 120)


def test_agent_restarted_while_a_pod_is_admitted_but_not_running(node_cluster: NodeCluster) -> None:
    """The kubelet allocated (the init container runs) when the agent goes; nothing is handed out twice."""
    node_cluster.create(gpu_pod("admitted", {"nvidia.com/gpu": 1}, init_sleep=20))
    wait_for("the admitted pod's init container to run", lambda: init_running(node_cluster, "admitted"), 120)
    restart_agent(node_cluster)
    node_cluster.create(gpu_pod("after-restart", {"nvidia.com/gpu": 1}))
    first = check_devices(node_cluster, "admitted")
    second = check_devices(node_cluster, "after-restart")
    assert not set(first) & set(second)
    delete_all(node_cluster, ["admitted", "after-restart"])


def agent_running(cluster: NodeCluster, other_than: str, resource: str = "nvidia.com/gpu") -> bool:
    """A new agent pod (not `other_than`) runs and its plugin of `resource` is registered again."""
    pods = cluster.core().list_namespaced_pod("gpupack-agent").items
    fresh = [p for p in pods if p.metadata.uid != other_than and p.status.phase == "Running"]
    return bool(fresh) and bool(cluster.allocatable_now(resource))


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


def gpu_init_pod(name: str, init_gpus: int, app_gpus: int, sidecar: bool = False) -> dict[str, Any]:
    """`gpu_pod` with an init container asking for GPUs first: one that runs to completion, or a sidecar."""
    body = gpu_pod(name, {"nvidia.com/gpu": app_gpus})
    main = body["spec"]["containers"][0]
    init = {
        **main,
        "name": "side" if sidecar else "init",
        "resources": {"requests": main["resources"]["requests"], "limits": {"nvidia.com/gpu": str(init_gpus)}},
    }
    if sidecar:
        init["restartPolicy"] = "Always"
    else:
        init["command"] = ["true"]
    body["spec"]["initContainers"] = [init]
    return body


def test_gpu_init_containers_and_sidecars_are_admitted_with_their_pods_gpus(node_cluster: NodeCluster) -> None:
    """#26 item 6: the kubelet hands an app container its init container's GPUs in map order (refused in 4
    of 10 admissions before), and does not reuse a sidecar's (refused in 3 of 3)."""
    for k in range(4):
        name = f"init-{k}"
        node_cluster.create(gpu_init_pod(name, init_gpus=2, app_gpus=1))
        node_cluster.wait_running(name)
        assigned = set(expected_ids(node_cluster.gpus(), node_cluster.assignment(name)))
        assert len(assigned) == 2 and set(node_cluster.container_env(name)[VISIBLE].split(",")) < assigned
        delete_all(node_cluster, [name])
    node_cluster.create(gpu_init_pod("sidecar", init_gpus=1, app_gpus=1, sidecar=True))
    node_cluster.wait_running("sidecar")
    assigned = set(expected_ids(node_cluster.gpus(), node_cluster.assignment("sidecar")))
    side_log = container_log(node_cluster.core(), node_cluster.namespace, "sidecar", "side")
    side = dict(ENV_LINE.findall(side_log))[VISIBLE]
    app = node_cluster.container_env("sidecar")[VISIBLE]
    assert {side, app} == assigned and side != app
    delete_all(node_cluster, ["sidecar"])


def allocatable(cluster: NodeCluster, resource: str) -> int:
    """The Node's allocatable count of `resource`."""
    return int((cluster.core().read_node(cluster.node.name).status.allocatable or {}).get(resource, "0"))


def whole_gpus_offered(cluster: NodeCluster) -> int:
    """The kubelet's healthy `nvidia.com/gpu` devices: the Node's allocatable and its live view, the smaller."""
    return min(allocatable(cluster, GPU), cluster.allocatable_now(GPU))


def stays_unplaced(cluster: NodeCluster, name: str) -> None:
    """The pod gets FailedScheduling from the gpupack scheduler and no node."""
    failed = lambda: any(e.startswith("FailedScheduling") for e in cluster.events(name))  # noqa: E731
    wait_for(f"pod {name} to be found unschedulable", failed, 90)
    assert not cluster.pod(name).spec.node_name, cluster.events(name)


def placed_elsewhere(cluster: NodeCluster, name: str, gpu: int) -> None:
    """The pod runs with devices of another GPU than `gpu`, by its assignment and by what it was handed."""
    visible = check_devices(cluster, name)
    assert gpu not in {slot.index for slot in cluster.assignment(name)}, name
    assert cluster.gpus().gpus()[gpu].uuid not in visible, name


GPU, MILLI = "nvidia.com/gpu", "gpupack.io/gpu-milli"


def test_a_gpu_with_a_critical_xid_or_a_cordon_gets_no_new_pod_and_the_rest_keep_starting(
    node_cluster: NodeCluster,
) -> None:
    """#26 item 8 on a busy node: the kubelet stops handing the GPU out (allocatable drops), gpupack stops
    placing on it, pods on the other GPUs keep starting; an application's XID changes nothing."""
    cluster = node_cluster
    cluster.create(gpu_pod("busy-gpu", {GPU: 1}))
    cluster.create(gpu_pod("busy-share", {MILLI: 250}))
    for name in ("busy-gpu", "busy-share"):
        check_devices(cluster, name)
    busy = {slot.index for name in ("busy-gpu", "busy-share") for slot in cluster.assignment(name)}
    target, free = sorted(set(range(4)) - busy)  # GPUs 0-3 are whole; 4 and 5 are MIG

    inject_xid(target, 13)  # the application's fault
    time.sleep(12)  # two agent rounds and more: time enough to change something, if it did
    assert whole_gpus_offered(cluster) == 4 and target not in blocked_gpus(cluster)

    inject_xid(target, 79)
    inject_xid(4, 48)  # the static-MIG GPU too: its instances go, the node stays usable
    wait_for(f"GPU {target} Unhealthy", lambda: whole_gpus_offered(cluster) == 3, 90)
    wait_for("GPU 4's instances Unhealthy", lambda: allocatable(cluster, "nvidia.com/mig-2g.20gb") == 0, 90)
    wait_for(f"GPU {target} published", lambda: target in blocked_gpus(cluster), 60)
    assert blocked_gpus(cluster)[target] == "unhealthy: XID 79 (GPU has fallen off the bus)"
    assert blocked_gpus(cluster)[4] == "unhealthy: XID 48 (double-bit ECC error)"
    for name, limits in (("after-gpu", {GPU: 1}), ("after-share", {MILLI: 250})):
        cluster.create(gpu_pod(name, limits))
        placed_elsewhere(cluster, name, target)
    cluster.create(gpu_pod("no-room", {GPU: 1}))  # GPU `target` is the only whole one left
    cluster.create(gpu_pod("no-mig", {"nvidia.com/mig-2g.20gb": 1}))  # only GPU 4 has one
    stays_unplaced(cluster, "no-room")
    stays_unplaced(cluster, "no-mig")
    delete_all(cluster, ["after-share", "after-gpu", "no-room", "no-mig"])
    restart_agent(cluster)  # after a reset the operator restarts the agent: the GPU is offered again
    wait_for("every whole GPU offered again", lambda: whole_gpus_offered(cluster) == 4, 120)
    wait_for("GPU 4's instances offered again", lambda: allocatable(cluster, "nvidia.com/mig-2g.20gb") == 1, 90)
    wait_for(f"GPU {target} offered again", lambda: target not in blocked_gpus(cluster), 60)

    cordon = lambda value: {"metadata": {"annotations": {"gpupack.io/cordoned-gpus": value}}}  # noqa: E731
    cluster.core().patch_node(cluster.node.name, cordon(str(free)))
    wait_for(f"cordoned GPU {free} Unhealthy", lambda: whole_gpus_offered(cluster) == 3, 90)
    assert blocked_gpus(cluster)[free] == f"cordoned: gpupack.io/cordoned-gpus names GPU {free}"
    cluster.create(gpu_pod("beside-cordon", {GPU: 1}))
    placed_elsewhere(cluster, "beside-cordon", free)
    cluster.create(gpu_pod("no-room", {GPU: 1}))
    stays_unplaced(cluster, "no-room")
    cluster.core().patch_node(cluster.node.name, cordon(None))
    wait_for(f"GPU {free} offered again", lambda: whole_gpus_offered(cluster) == 4, 90)
    for name in ("busy-gpu", "busy-share"):
        assert cluster.pod(name).status.phase == "Running", name
        assert cluster.pod(name).status.container_statuses[0].restart_count == 0, name
    delete_all(cluster, ["beside-cordon", "no-room", "busy-gpu", "busy-share"])
    edit_fake_gpus(lambda document: document.pop("xid_events", None))
