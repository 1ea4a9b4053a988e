"""`gpupack defrag --execute` on the real node (#31): the plan carried out by a real kubelet, containerd and runc.

tests/e2e/test_defrag.py proves the plan and its execution on the control plane alone: there, evicted pods
vanish at once and nothing starts. Here the kubelet must stop the evicted pod's container, its ReplicaSet's
replacement must start with the devices of its new assignment (gpupack's agent, fake NVML), and the
pending pod must start on exactly the GPUs the hold annotation reserved for it, while the replacement is
scheduled at the same time.

The node's whole GPUs 0-3 are fragmented by shares (`gpupack.io/gpu-milli: 250`), built with blockers so
that the layout does not depend on the scoring policy:

- GPU `G`: `pinned` (a bare pod, so never movable) and `mover-a` (a ReplicaSet's, movable);
- GPU `B` (another whole GPU): `mover-b` (a ReplicaSet's, movable);
- the two other whole GPUs free, and `train` Pending for 3 whole GPUs.

The only move that frees 3 GPUs evicts `mover-b` and puts it again beside `pinned` on `G` (no move can
empty `G`: `pinned` stays). The dry run plans exactly that and evicts nothing; `--execute` writes the hold
on `train`, evicts `mover-b` through the Eviction API, the kubelet stops it, the replacement runs on `G`
and `train` runs with the three other whole GPUs. `pinned` keeps running untouched and no whole GPU is
handed to two pods.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from gpupack.cli import main
from gpupack.kube.keys import ANNOTATION_ASSIGNMENT, ANNOTATION_DEFRAG_HOLD, LABEL_MOVABLE
from tests.e2e.nodecase import (
    NodeCluster,
    check_devices,
    delete_all,
    gpu_pod,
    manifests_node_cluster,
    wait_gone,
)
from tests.e2e.pod_events import notes_by_pod
from tests.e2e.realnode import wait_for

GPU, MILLI = "nvidia.com/gpu", "gpupack.io/gpu-milli"
WHOLE_GPUS = frozenset(range(4))  # GPUs 4 and 5 are MIG GPUs: no whole GPU nor share there
SHARE = 250
START = 240.0  # s for a pod to be scheduled and started on this slow machine
GOAL = ("--goal", "schedule-pending-pod")


@pytest.fixture(scope="module")
def node_cluster() -> Iterator[NodeCluster]:
    """The plane, the real node and gpupack installed from the shipped manifests (as test_real_node.py)."""
    with manifests_node_cluster() as cluster:
        yield cluster


def movable_replica_set(name: str, limits: dict[str, int]) -> client.V1ReplicaSet:
    """One replica of `gpu_pod(name, limits)`, labelled `app: name` and movable."""
    spec = gpu_pod(name, limits)["spec"]
    template = {"metadata": {"labels": {"app": name, LABEL_MOVABLE: "true"}}, "spec": spec}
    body = client.V1ReplicaSet.from_dict(
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": template},
        }
    )
    assert body is not None
    return body


def apps(cluster: NodeCluster) -> client.AppsV1Api:
    return client.AppsV1Api(cluster.plane.api_client())


def live_pod_of(cluster: NodeCluster, app: str) -> Any | None:
    """The ReplicaSet `app`'s pod that is not terminating, None while there is none."""
    found = cluster.core().list_namespaced_pod(cluster.namespace, label_selector=f"app={app}").items
    live = [pod for pod in found if pod.metadata.deletion_timestamp is None]
    assert len(live) <= 1, [pod.metadata.name for pod in live]
    return live[0] if live else None


def start_movable(cluster: NodeCluster, app: str) -> str:
    """Create the movable ReplicaSet `app` of one share; the name of its pod once it runs with its devices."""
    apps(cluster).create_namespaced_replica_set(cluster.namespace, movable_replica_set(app, {MILLI: SHARE}))
    wait_for(f"ReplicaSet {app} to create its pod", lambda: live_pod_of(cluster, app) is not None, 60)
    pod = live_pod_of(cluster, app)
    assert pod is not None
    name = str(pod.metadata.name)
    check_devices(cluster, name, START)
    return name


def start_bare(cluster: NodeCluster, name: str, limits: dict[str, int]) -> set[int]:
    """Create a bare GPU pod; the GPU indices of its assignment once it runs with exactly those devices."""
    cluster.create(gpu_pod(name, limits))
    check_devices(cluster, name, START)
    return gpu_indices(cluster, name)


def gpu_indices(cluster: NodeCluster, name: str) -> set[int]:
    return {slot.index for slot in cluster.assignment(name)}


def wait_unschedulable(cluster: NodeCluster, name: str) -> None:
    """The gpupack scheduler tried the pod and found no room: a FailedScheduling event, no node."""
    failed = lambda: any(e.startswith("FailedScheduling") for e in cluster.events(name))  # noqa: E731
    wait_for(f"pod {name} to be found unschedulable", failed, 120)
    assert not cluster.pod(name).spec.node_name, cluster.events(name)


def defrag(cluster: NodeCluster, capsys: pytest.CaptureFixture[str], *extra: str) -> Any:
    """`gpupack defrag --json` on the node's cluster, moving only the test namespace's pods."""
    kubeconfig = str(cluster.plane.kubeconfig)
    code = main(["defrag", "--kubeconfig", kubeconfig, "-n", cluster.namespace, "--json", *extra])
    captured = capsys.readouterr()
    assert code == 0, captured
    return json.loads(captured.out)


def uids(cluster: NodeCluster) -> dict[str, str]:
    """Pod name -> uid, every pod of the namespace."""
    return {p.metadata.name: p.metadata.uid for p in cluster.core().list_namespaced_pod(cluster.namespace).items}


def container_id(cluster: NodeCluster, name: str) -> str:
    """The containerd ID of the pod's one container (`containerd://<id>` in its status)."""
    (status,) = cluster.pod(name).status.container_statuses
    return str(status.container_id).removeprefix("containerd://")


def running_tasks(cluster: NodeCluster) -> set[str]:
    """IDs of the containers whose task containerd runs now."""
    lines = cluster.node.ctr("tasks", "ls").splitlines()[1:]  # TASK PID STATUS
    return {line.split()[0] for line in lines if line.split()[-1] == "RUNNING"}


def fragment(cluster: NodeCluster) -> tuple[int, str, str]:
    """Build the layout of the module docstring; (G, mover-a's pod, mover-b's pod).

    Blockers decide where each share goes: `fill-others` takes every whole GPU but `pinned`'s, so `mover-a`
    joins `pinned`; `fill-shared` then fills that GPU, so once `fill-others` is gone `mover-b` must go to
    another one. Both blockers are deleted before the plan is made.
    """
    (shared,) = start_bare(cluster, "pinned", {MILLI: SHARE})
    assert start_bare(cluster, "fill-others", {GPU: 3}) == WHOLE_GPUS - {shared}
    mover_a = start_movable(cluster, "mover-a")
    assert gpu_indices(cluster, mover_a) == {shared}
    assert start_bare(cluster, "fill-shared", {MILLI: 1000 - 2 * SHARE}) == {shared}
    delete_all(cluster, ["fill-others"])
    mover_b = start_movable(cluster, "mover-b")
    assert gpu_indices(cluster, mover_b) != {shared}
    delete_all(cluster, ["fill-shared"])
    return shared, mover_a, mover_b


def test_execute_moves_one_share_and_the_pending_pod_runs_on_the_gpus_it_freed(
    node_cluster: NodeCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = node_cluster
    namespace, node = cluster.namespace, cluster.node.name
    shared, mover_a, mover_b = fragment(cluster)
    (moved_from,) = gpu_indices(cluster, mover_b)
    cluster.create(gpu_pod("train", {GPU: 3}))
    wait_unschedulable(cluster, "train")
    before = uids(cluster)
    pinned_container = container_id(cluster, "pinned")
    moved_container = container_id(cluster, mover_b)

    plan = defrag(cluster, capsys, *GOAL)
    assert plan["dry_run"] is True
    (move,) = plan["moves"]
    assert move["target"] == f"{namespace}/train"
    (eviction,) = move["evictions"]
    assert (eviction["pod"], eviction["from"]) == (f"{namespace}/{mover_b}", node)
    assert eviction["to"]["node"] == node
    assert [slot["index"] for slot in eviction["to"]["gpus"]] == [shared]  # beside pinned: nowhere else is left
    placement = move["placement"]
    assert placement["node"] == node
    assert {slot["index"] for slot in placement["gpus"]} == WHOLE_GPUS - {shared}
    every_goal = defrag(cluster, capsys)
    assert [e["pod"] for m in every_goal["moves"] for e in m["evictions"]] == [f"{namespace}/{mover_b}"]
    assert uids(cluster) == before  # a dry run evicts nothing

    done = defrag(cluster, capsys, *GOAL, "--execute")
    assert done["dry_run"] is False and done["carried_out"]["stopped"] == ""
    assert done["carried_out"]["evictions"] == [{"pod": f"{namespace}/{mover_b}", "outcome": "evicted"}]
    annotations = cluster.pod("train").metadata.annotations or {}
    assert json.loads(annotations[ANNOTATION_DEFRAG_HOLD]) == placement

    wait_gone(cluster, mover_b, 120)  # with a grace period, the API server waits for the kubelet to stop it
    assert moved_container not in running_tasks(cluster)
    wait_for("mover-b's replacement", lambda: live_pod_of(cluster, "mover-b") is not None, 60)
    replacement = live_pod_of(cluster, "mover-b")
    assert replacement is not None and replacement.metadata.uid != before[mover_b]
    moved = str(replacement.metadata.name)
    moved_visible = check_devices(cluster, moved, START)
    assert gpu_indices(cluster, moved) == {shared}, "where the simulation put it again"
    assert cluster.container_env(moved)["GPUPACK_GPU_MILLI"] == str(SHARE)
    train_visible = check_devices(cluster, "train", START)
    assert json.loads(cluster.pod("train").metadata.annotations[ANNOTATION_ASSIGNMENT]) == placement
    gpus = cluster.gpus().gpus()
    assert sorted(train_visible) == sorted(gpus[i].uuid for i in WHOLE_GPUS - {shared})
    assert gpus[moved_from].uuid in train_visible  # the GPU the eviction freed

    pinned = cluster.pod("pinned")
    assert pinned.metadata.uid == before["pinned"] and pinned.status.phase == "Running"
    assert pinned.status.container_statuses[0].restart_count == 0
    assert container_id(cluster, "pinned") == pinned_container
    assert pinned_container in running_tasks(cluster)
    assert cluster.pod(mover_a).metadata.uid == before[mover_a]
    shares = {name: check_devices(cluster, name) for name in ("pinned", mover_a)} | {moved: moved_visible}
    assert {uuid for visible in shares.values() for uuid in visible} == {gpus[shared].uuid}
    assert not set(train_visible) & {gpus[shared].uuid}, "no GPU handed to a whole-GPU pod and to shares"
    assert set(uids(cluster)) == set(before) - {mover_b} | {moved}, "exactly the planned pod was evicted"
    assert set(notes_by_pod(cluster.plane, cluster.namespace, "Defragmented")) == {mover_b}

    for app in ("mover-a", "mover-b"):
        apps(cluster).delete_namespaced_replica_set(app, namespace, propagation_policy="Orphan")
    delete_all(cluster, ["pinned", "train", mover_a, moved])
