"""The Helm chart on a real node (#27 item 3): install, an upgrade under load, uninstall.

test_real_node's plane and node (nodecase.running_node_cluster), with gpupack put there by `helm install`
of charts/gpupack instead of `kubectl apply -k`, changed only where this machine forces it (helm_deploy.py;
the first case holds the rendered objects to that without a cluster). The node cases run in order on one
release, each leaving its pods to the next: install, then upgrade to a changed policy and a new image tag
while pods are created, then uninstall.

The node's whole GPUs are 0-3 (nodecase.FAKE_GPUS; 4 holds static MIG instances): the pods of these cases
ask for exactly four whole GPUs together, so a GPU handed out twice leaves a pod without one, or shows as
two assignments naming it.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupack.harness.kube_programs import NEWEST, MissingBinary
from gpupack.kube.keys import ANNOTATION_ASSIGNMENT
from tests.e2e.conftest import missing_program
from tests.e2e.helm_deploy import NAMESPACE, Helm, e2e_values, prepare_namespace
from tests.e2e.nodecase import NodeCluster, check_devices, gpu_pod, running_node_cluster
from tests.e2e.realcluster import FullControlPlane
from tests.e2e.realnode import wait_for
from tests.e2e.test_deploy_overlay import ALLOWED, differences, keyed

AGENT_NAMESPACE = "gpupack-agent"
WHOLE_GPUS = {0, 1, 2, 3}
GPU = "nvidia.com/gpu"
STATIC_MIG = ("nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb")  # GPU 4 has one instance of each
# what the post-renderer changes besides deploy.py's overlay: one scheduler replica rolls one at a time
ROLLING = r"Deployment/gpupack-scheduler:spec\.strategy\.rollingUpdate\.(maxSurge|maxUnavailable)"
ALLOWED_HERE = [*ALLOWED, re.compile(ROLLING)]
# What `helm uninstall` leaves in the release namespace (docs/helm.md): the namespace itself, what the
# cluster puts in every namespace, and kube-scheduler's leader-election Lease
LEFT_IN_NAMESPACE = {"ConfigMap": {"kube-root-ca.crt"}, "ServiceAccount": {"default"}, "Lease": {"gpupack-scheduler"}}
LEFT_KINDS = ("ConfigMap", "ServiceAccount", "Lease", "Pod", "Service", "Deployment", "ReplicaSet", "DaemonSet",
              "Role", "RoleBinding", "Secret", "PodDisruptionBudget")  # fmt: skip
CLUSTER_KINDS = ("ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                 "Namespace")  # fmt: skip
AGENT_ANNOTATIONS = ("gpupack.io/gpu-topology", "gpupack.io/mig-layout", "gpupack.io/devices-in-use")


@dataclass
class Release:
    """The node cluster, helm on it, the gpupack image installed first, and the pods the cases leave."""

    cluster: NodeCluster
    helm: Helm
    image: str
    pods: dict[str, str] = field(default_factory=dict)  # pod -> its gpupack.io/assignment


def helm_or_fail(workdir: Path) -> Helm:
    """helm on `workdir`; the suite fails (skips only when allowed) when it is not built."""
    try:
        return Helm(workdir)
    except MissingBinary as exc:
        missing_program(exc)
        raise


@pytest.fixture(scope="module")
def release() -> Iterator[Release]:
    """The node cluster with gpupack from `helm install`; torn down afterwards, whatever state it reached."""
    workdir = Path(tempfile.mkdtemp(prefix="gpupack-e2e-helm-"))
    helm = helm_or_fail(workdir)
    installed: list[str] = []

    def install(plane: FullControlPlane, gpupack_image: str) -> None:
        helm.kubeconfig = plane.kubeconfig
        prepare_namespace(plane)
        helm.install(e2e_values(gpupack_image), plane.apiserver_port)
        installed.append(gpupack_image)

    try:
        with running_node_cluster(install) as cluster:
            yield Release(cluster, helm, installed[0])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def test_the_e2e_release_differs_from_the_chart_only_where_the_machine_forces_it(tmp_path: Path) -> None:
    helm = helm_or_fail(tmp_path)
    chart = keyed(helm.template({}, NEWEST))
    e2e = keyed(helm.template(e2e_values("localhost/gpupack:0.1.0"), NEWEST, api_port=6443))
    # the chart makes no PodDisruptionBudget for one replica: it would block every drain
    assert set(chart) - set(e2e) == {"PodDisruptionBudget/gpupack-scheduler"} and set(e2e) <= set(chart)
    changed = [path for key in e2e for path in differences(chart[key], e2e[key], f"{key}:")]
    assert changed, "the post-renderer changes nothing: the check would be vacuous"
    assert [path for path in changed if not any(rule.fullmatch(path) for rule in ALLOWED_HERE)] == []
    containers = e2e["Deployment/gpupack-scheduler"]["spec"]["template"]["spec"]["containers"]
    assert {c["name"]: c["image"] for c in containers} == {
        "kube-scheduler": f"localhost/kube-scheduler:{NEWEST}",  # the chart's default: the cluster's version
        "gpupack": "localhost/gpupack:0.1.0",
        "metrics": "localhost/gpupack:0.1.0",
    }


# ------------------------------------------------------------------ install


def releases(helm: Helm) -> dict[str, Any]:
    """The release as `helm list` reports it."""
    (listed,) = yaml.safe_load(helm("list", "--namespace", NAMESPACE, "--output", "json"))
    return dict(listed)


def remember(release: Release, names: list[str]) -> None:
    """Keep the pods' assignments for the cases after this one."""
    for name in names:
        release.pods[name] = release.cluster.pod(name).metadata.annotations[ANNOTATION_ASSIGNMENT]


def test_helm_install_gives_a_scheduler_that_places_gpu_pods_on_their_devices(release: Release) -> None:
    cluster = release.cluster
    assert releases(release.helm)["status"] == "deployed"
    release.cluster.create(gpu_pod("kept-gpu", {GPU: 1}))
    release.cluster.create(gpu_pod("kept-mig", {STATIC_MIG[0]: 1}))
    (gpu_uuid,) = check_devices(cluster, "kept-gpu")
    check_devices(cluster, "kept-mig")
    (slot,) = cluster.assignment("kept-gpu")
    assert slot.index in WHOLE_GPUS and not slot.mig and gpu_uuid == cluster.gpus().gpus()[slot.index].uuid
    assert [(s.index, s.mig) for s in cluster.assignment("kept-mig")] == [(4, "2g.20gb")]
    remember(release, ["kept-gpu", "kept-mig"])


# ------------------------------------------------------------------ upgrade


def apps(cluster: NodeCluster) -> Any:
    """`kubernetes.client.AppsV1Api` on the admin client."""
    from kubernetes import client

    return client.AppsV1Api(cluster.plane.api_client())


def gpupack_pods(cluster: NodeCluster) -> list[Any]:
    """The scheduler's and the agent's pods that are not being deleted."""
    core = cluster.core()
    pods = [*core.list_namespaced_pod(NAMESPACE).items, *core.list_namespaced_pod(AGENT_NAMESPACE).items]
    return [pod for pod in pods if pod.metadata.deletion_timestamp is None]


def rolled(cluster: NodeCluster, image: str) -> bool:
    """The Deployment and the DaemonSet are done rolling, and every pod of theirs runs `image`, ready."""
    deployment = apps(cluster).read_namespaced_deployment("gpupack-scheduler", NAMESPACE)
    daemonset = apps(cluster).read_namespaced_daemon_set("gpupack-agent", AGENT_NAMESPACE)
    status, ds = deployment.status, daemonset.status
    for observed, generation in ((status, deployment), (ds, daemonset)):
        if (observed.observed_generation or 0) < generation.metadata.generation:
            return False
    if not status.replicas == status.updated_replicas == status.ready_replicas == deployment.spec.replicas:
        return False
    if not ds.desired_number_scheduled == ds.updated_number_scheduled == ds.number_ready == 1:
        return False
    pods = gpupack_pods(cluster)
    images = {c.image for pod in pods for c in pod.spec.containers if c.name != "kube-scheduler"}
    ready = all(c.ready for pod in pods for c in pod.status.container_statuses or [])
    return len(pods) == 2 and images == {image} and ready


def scheduler_pod(cluster: NodeCluster) -> Any:
    """The one scheduler pod that runs now."""
    (pod,) = [pod for pod in gpupack_pods(cluster) if pod.metadata.namespace == NAMESPACE]
    return pod


def stopping(cluster: NodeCluster, uid: str) -> bool:
    """The pod `uid` of gpupack-system is gone or being deleted."""
    pods = cluster.core().list_namespaced_pod(NAMESPACE).items
    return all(pod.metadata.deletion_timestamp is not None for pod in pods if pod.metadata.uid == uid)


def policy(cluster: NodeCluster) -> dict[str, Any]:
    """gpupack's configuration as the ConfigMap gpupack-policy holds it."""
    config_map = cluster.core().read_namespaced_config_map("gpupack-policy", NAMESPACE)
    return dict(yaml.safe_load(config_map.data["policy.yaml"]))


def template_annotations(cluster: NodeCluster) -> dict[str, str]:
    """The scheduler Deployment's pod template annotations."""
    deployment = apps(cluster).read_namespaced_deployment("gpupack-scheduler", NAMESPACE)
    return dict(deployment.spec.template.metadata.annotations or {})


def scheduled_times(cluster: NodeCluster, names: list[str]) -> dict[str, str]:
    """When each pod was bound (its PodScheduled condition turned true)."""
    times = {}
    for name in names:
        conditions = cluster.pod(name).status.conditions or []
        times[name] = str(next(c.last_transition_time for c in conditions if c.type == "PodScheduled"))
    return times


def running_unchanged(cluster: NodeCluster, name: str, uid: str, assignment: str) -> None:
    """The pod is the same one, Running, never restarted, with the assignment it had."""
    pod = cluster.pod(name)
    assert (pod.metadata.uid, pod.status.phase) == (uid, "Running"), name
    assert pod.metadata.annotations[ANNOTATION_ASSIGNMENT] == assignment, name
    assert [c.restart_count for c in pod.status.container_statuses] == [0], name


def test_helm_upgrade_to_a_new_policy_and_tag_keeps_running_pods_and_loses_no_pending_one(release: Release) -> None:
    """Pods are created as the upgrade starts, and once the old scheduler pod is stopping: its successor starts
    only after it is gone (one replica on the host network, rolled one at a time), so those wait for it."""
    cluster = release.cluster
    kept = {name: cluster.pod(name).metadata.uid for name in release.pods}
    visible = {name: check_devices(cluster, name) for name in kept}
    assert policy(cluster)["policy"]["weights"]["packing"] == 0.05
    checksum = template_annotations(cluster)["checksum/policy"]
    old_scheduler = scheduler_pod(cluster).metadata.uid
    new_image = f"{release.image}-e2e-upgrade"
    cluster.node.ctr("images", "tag", release.image, new_image)

    # the policy value as the README's upgrade command sets it
    release.helm.upgrade(e2e_values(new_image), cluster.plane.apiserver_port, "--set", "policy.weights.packing=0.1")
    cluster.create(gpu_pod("during-gpu", {GPU: 1}))
    rolled_at_creation = [rolled(cluster, new_image)]
    wait_for("the old scheduler pod to stop", lambda: stopping(cluster, old_scheduler), 120, 0.1)
    cluster.create(gpu_pod("during-pair", {GPU: 2}))
    cluster.create(gpu_pod("during-mig", {STATIC_MIG[1]: 1}))
    rolled_at_creation.append(rolled(cluster, new_image))
    assert rolled_at_creation == [False, False], "the pods were to be created while the release rolled"

    started = time.monotonic()
    wait_for(f"the scheduler and the agent to roll to {new_image}", lambda: rolled(cluster, new_image), 300)
    during = {name: check_devices(cluster, name, timeout=240) for name in ("during-gpu", "during-pair", "during-mig")}
    print(f"rolled and every pod running {time.monotonic() - started:.0f} s after the pods were created")
    print(f"bound: {scheduled_times(cluster, list(during))}; new scheduler: {scheduler_pod(cluster).status.start_time}")
    for name, uid in kept.items():
        running_unchanged(cluster, name, uid, release.pods[name])
        assert check_devices(cluster, name) == visible[name], name
    whole = [slot.index for name in ("kept-gpu", "during-gpu", "during-pair") for slot in cluster.assignment(name)]
    assert sorted(whole) == sorted(WHOLE_GPUS), f"whole GPUs handed out: {whole}"
    migs = [(s.index, s.mig, s.start) for name in ("kept-mig", "during-mig") for s in cluster.assignment(name)]
    assert len(set(migs)) == 2 and len({uuid for uuids in [*visible.values(), *during.values()] for uuid in uuids}) == 6

    assert int(releases(release.helm)["revision"]) == 2
    assert policy(cluster)["policy"]["weights"]["packing"] == 0.1
    assert template_annotations(cluster)["checksum/policy"] != checksum
    assert scheduler_pod(cluster).metadata.uid != old_scheduler
    remember(release, list(during))


# ------------------------------------------------------------------ uninstall


def dynamic(cluster: NodeCluster) -> Any:
    """`kubernetes.dynamic.DynamicClient` on the admin client."""
    from kubernetes.dynamic import DynamicClient

    return DynamicClient(cluster.plane.api_client())


def resource(client: Any, kind: str) -> Any:
    """The API resource of `kind` (its preferred version)."""
    return client.resources.get(kind=kind, preferred=True)


def still_there(client: Any, objects: list[dict[str, Any]]) -> list[str]:
    """`kind/namespace/name` of each of `objects` the API server still has; a Namespace being deleted counts
    as gone (its controller empties it, then deletes it)."""
    from kubernetes.dynamic.exceptions import NotFoundError

    left = []
    for body in objects:
        meta = body["metadata"]
        api = client.resources.get(api_version=body["apiVersion"], kind=body["kind"])
        try:
            found = api.get(name=meta["name"], namespace=meta.get("namespace") if api.namespaced else None)
        except NotFoundError:
            continue
        if body["kind"] != "Namespace" or not found.metadata.deletionTimestamp:
            left.append(f"{body['kind']}/{meta.get('namespace', '')}/{meta['name']}")
    return left


def labelled(client: Any) -> list[str]:
    """`kind/namespace/name` of what carries app.kubernetes.io/part-of=gpupack, anywhere; Namespaces being
    deleted left out."""
    found = []
    for kind in (*LEFT_KINDS, *CLUSTER_KINDS):
        for item in resource(client, kind).get(label_selector="app.kubernetes.io/part-of=gpupack").items:
            if kind != "Namespace" or not item.metadata.deletionTimestamp:
                found.append(f"{kind}/{item.metadata.namespace or ''}/{item.metadata.name}")
    return found


def left_in_namespace(client: Any) -> dict[str, set[str]]:
    """Names of each kind of object in gpupack-system (kinds without any left out)."""
    left = {}
    for kind in LEFT_KINDS:
        names = {item.metadata.name for item in resource(client, kind).get(namespace=NAMESPACE).items}
        if names:
            left[kind] = names
    return left


def test_helm_uninstall_leaves_only_what_the_docs_say(release: Release) -> None:
    """docs/helm.md: the release namespace, kube-scheduler's Lease in it, the agent's Node annotations and
    the user pods' assignments stay; every object of the chart, and the agent's namespace, go."""
    cluster = release.cluster
    client = dynamic(cluster)
    objects = release.helm.manifest()
    assert {o["kind"] for o in objects} >= {"Deployment", "DaemonSet", "ClusterRole", "ValidatingAdmissionPolicy"}
    assert labelled(client), "nothing carries the label before: the check would be vacuous"
    before = cluster.core().read_node(cluster.node.name).metadata.annotations

    release.helm.uninstall()
    wait_for("the chart's objects to go", lambda: not still_there(client, objects), 120)
    # the pods are deleted after their owners, and the scheduler's have 30 s to stop
    wait_for("everything labelled part-of=gpupack to go", lambda: not labelled(client), 120)
    assert left_in_namespace(client) == LEFT_IN_NAMESPACE
    assert cluster.core().read_namespace(NAMESPACE).status.phase == "Active"
    assert not still_there(client, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": AGENT_NAMESPACE}}])
    after = cluster.core().read_node(cluster.node.name).metadata.annotations
    assert {key: after.get(key) for key in AGENT_ANNOTATIONS} == {key: before[key] for key in AGENT_ANNOTATIONS}
    for name, assignment in release.pods.items():
        pod = cluster.pod(name)
        assert pod.metadata.annotations[ANNOTATION_ASSIGNMENT] == assignment and pod.status.phase == "Running", name
