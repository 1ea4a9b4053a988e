"""Events on pods through the real control plane (#18 item 2): what `kubectl describe pod` shows.

- every bind of the running `gpupack serve` puts an `Assigned` event (events.k8s.io/v1) on its pod,
  whose note says what the pod's `gpupack.io/assignment` says;
- a pod gpupack keeps turning down gets a `FailedAssignment` warning with gpupack's reason;
- manifests/rbac.yaml's gpupack-extender role, applied to the real authorizer, lets gpupack's own
  client write an event and patch its series, and gives nothing more on events or pods.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpupack.extender.pod_events import REPEATED_FAILURES, WARNING_INTERVAL_SECONDS, PodEvents, PodRef
from gpupack.harness.controlplane import ControlPlane, pod_body, wait_until
from gpupack.kube.sources import OfficialKubeApi
from tests.e2e.catalogue import H100, L4, dynamic_mig_node, whole_gpu_node
from tests.e2e.cluster import E2ECluster
from tests.e2e.pod_events import events_by_pod
from tests.e2e.reasons import GPUPACK_REASONS
from tests.extender_helpers import ROOT, FakeClock

SERVICE_ACCOUNT_USER = "system:serviceaccount:gpupack-system:gpupack-scheduler"


def events_on(cluster: E2ECluster, reason: str) -> dict[str, list[dict[str, Any]]]:
    """Pod name -> the Events of `reason` regarding it, in this test's namespace."""
    return events_by_pod(cluster.plane, cluster.namespace, reason)


def test_every_bind_puts_an_assigned_event_saying_what_the_annotation_says(cluster: E2ECluster) -> None:
    prefix = cluster.prefix
    l4 = whole_gpu_node(f"{prefix}-l4", L4, 4, "on-demand", 1.6)
    cluster.add_nodes([l4, dynamic_mig_node(f"{prefix}-h100", H100, 2, "on-demand", 49.2)])
    bodies = [
        pod_body("whole", {"nvidia.com/gpu": 2}),
        pod_body("mig", {"nvidia.com/mig-3g.40gb": 1}),
        pod_body("share", {"gpupack.io/gpu-milli": 300}),
    ]
    cluster.wait_all_bound(cluster.create_pods(bodies), timeout=120)
    pods = {obj["metadata"]["name"]: obj for obj in cluster.pods()}
    wait_until("an Assigned event per pod", lambda: len(events_on(cluster, "Assigned")) == 3, 30)
    for name, events in events_on(cluster, "Assigned").items():
        (event,) = events
        obj = pods[name]
        placed = json.loads(obj["metadata"]["annotations"]["gpupack.io/assignment"])
        assert event["type"] == "Normal" and event["reportingController"] == "gpupack.io/extender"
        assert event["regarding"]["uid"] == obj["metadata"]["uid"]
        note = event["note"]
        assert note.startswith(f"node {obj['spec']['nodeName']}: GPU"), note
        for slot in placed["gpus"]:
            assert str(slot["index"]) in note, note
            if "mig" in slot:
                assert f"MIG {slot['mig']}@{slot['start']}" in note, note
            if "milli" in slot:
                assert f"share {slot['milli']}/1000" in note, note
    assert "MIG 3g.40gb@" in events_on(cluster, "Assigned")["mig"][0]["note"]
    assert "share 300/1000" in events_on(cluster, "Assigned")["share"][0]["note"]


def test_a_pod_gpupack_keeps_turning_down_gets_a_warning_with_the_reason(cluster: E2ECluster) -> None:
    name = f"{cluster.prefix}-l4"
    cluster.add_nodes([whole_gpu_node(name, L4, 2, "on-demand", 1.6)])
    # kube-scheduler's own fit counts 2000 gpu-milli; gpupack fits one 600 share per GPU: two of three
    shares = cluster.create_pods([pod_body(f"s{i}", {"gpupack.io/gpu-milli": 600}) for i in range(3)])
    cluster.wait_settled(shares, timeout=120)
    (pending,) = set(shares) - cluster.bound().keys()
    nudges = itertools.count()

    def warned() -> bool:
        # a node label change sends the pending pod back to kube-scheduler, which asks gpupack again
        labels = {"e2e-nudge": str(next(nudges))}
        cluster.plane.core().patch_node(
            name, {"metadata": {"labels": labels}}, _content_type="application/merge-patch+json"
        )
        time.sleep(1.0)
        return pending in events_on(cluster, "FailedAssignment")

    wait_until(f"a FailedAssignment warning on {pending}", warned, 120, interval=1.0)
    (warning,) = events_on(cluster, "FailedAssignment")[pending]
    assert warning["type"] == "Warning" and warning["note"].startswith("no node fits: 1 node: ")
    assert any(reason in warning["note"] for reason in GPUPACK_REASONS), warning["note"]
    assert events_on(cluster, "Assigned").keys() == set(shares) - {pending}


@pytest.fixture
def extender_role(control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    """manifests/rbac.yaml's gpupack-extender ClusterRole and its binding on the real API server, and a
    client that acts as the ServiceAccount they bind (impersonated by the admin)."""
    rbac = client.RbacAuthorizationV1Api(control_plane.api_client())
    documents = [d for d in yaml.safe_load_all((ROOT / "manifests" / "rbac.yaml").read_text()) if d]
    role = next(d for d in documents if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "gpupack-extender")
    binding = next(d for d in documents if d["kind"] == "ClusterRoleBinding" and d["roleRef"] == {**role_ref(role)})
    rbac.create_cluster_role(role)
    rbac.create_cluster_role_binding(binding)
    acting = client.ApiClient(control_plane.api_client().configuration)
    acting.set_default_header("Impersonate-User", SERVICE_ACCOUNT_USER)
    try:
        yield acting
    finally:
        rbac.delete_cluster_role_binding(binding["metadata"]["name"])
        rbac.delete_cluster_role(role["metadata"]["name"])


def role_ref(role: dict[str, Any]) -> dict[str, str]:
    """The roleRef of a binding to `role`."""
    return {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]}


def may(acting: client.ApiClient, namespace: str, group: str, resource: str, verb: str) -> bool:
    """What the authorizer answers the impersonated ServiceAccount (a SelfSubjectAccessReview)."""
    attributes = client.V1ResourceAttributes(namespace=namespace, group=group, resource=resource, verb=verb)
    review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(resource_attributes=attributes))
    answer: Any = client.AuthorizationV1Api(acting).create_self_subject_access_review(review, _preload_content=False)
    return bool(json.loads(answer.data)["status"].get("allowed"))


def test_the_extender_role_lets_gpupack_write_and_repeat_events_and_nothing_more(
    cluster: E2ECluster, extender_role: client.ApiClient
) -> None:
    namespace = cluster.namespace
    wait_until("the role to take effect", lambda: may(extender_role, namespace, "events.k8s.io", "events", "patch"), 30)
    cluster.create_pods([pod_body("waiting", {"cpu": "100m"}, scheduler_name="nobody")])  # stays pending
    (obj,) = cluster.pods()
    ref = PodRef(namespace, "waiting", obj["metadata"]["uid"])
    clock = FakeClock()
    api = OfficialKubeApi(extender_role)
    events = PodEvents(lambda: api, clock)
    for _ in range(REPEATED_FAILURES):
        events.failed(ref, lambda: "no node fits: 1 node: not enough free GPU capacity")
    clock.advance(WARNING_INTERVAL_SECONDS)
    events.failed(ref, lambda: "no node fits: 1 node: not enough free GPU capacity")  # the series: a patch
    assert events.flush(30)
    assert events.counts() == ({"FailedAssignment": 2}, {}), "the API server refused a write"
    (event,) = events_on(cluster, "FailedAssignment")["waiting"]
    assert event["series"]["count"] == 2 and event["regarding"]["uid"] == ref.uid
    assert event["note"] == "no node fits: 1 node: not enough free GPU capacity"
    # nothing more: no core/v1 events, no reading or updating pods beyond list/watch and the Binding (pods
    # `patch` it has, to lift the DRA gate, #30; admission's gpupack-gate-remover holds it to that)
    for group, resource, verb in (("", "events", "create"), ("", "pods", "get"), ("", "pods", "update")):
        assert not may(extender_role, namespace, group, resource, verb), (group, resource, verb)
    with pytest.raises(ApiException) as refused:
        client.CoreV1Api(extender_role).read_namespaced_pod("waiting", namespace)
    assert refused.value.status == 403
