"""Who may write gpupack's annotations, on the real API server of each release (#26 items 2 and 4).

The shipped ValidatingAdmissionPolicies, their bindings and the shipped ClusterRoles (as `kubectl
kustomize manifests/` renders them) are applied for one test and removed after it: `gpupack serve` of
the shared control plane binds as the admin, which the assignment policy would refuse. Callers are
impersonated by the admin (tests/e2e/impersonation.py):
- a tenant, with a Role to create, bind and edit pods of the test's namespace, cannot create a pod with
  a forged `gpupack.io/assignment`, bind with one, or change or remove one, while gpupack's scheduler
  ServiceAccount binds with it and the tenant's other edits pass;
- the agent's ServiceAccount with the node claim of node A writes A's three annotations and nothing
  else: not on B, not a label, taint or other annotation, and nothing at all without the claim;
- the defrag hold (#31, with manifests/defrag's ClusterRole): the tenant cannot write `gpupack.io/defrag-hold`,
  the defrag loop's ServiceAccount and an admin can, and the loop's ServiceAccount changes nothing else of a pod.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from gpupack.harness.controlplane import ControlPlane, ControlPlaneError, pod_body, wait_until
from gpupack.kube.keys import (
    ANNOTATION_ASSIGNMENT,
    ANNOTATION_DEFRAG_HOLD,
    ANNOTATION_DEVICES_IN_USE,
    ANNOTATION_GPU_TOPOLOGY,
    ANNOTATION_HOURLY_COST,
    ANNOTATION_INTERRUPTIBLE,
    ANNOTATION_MIG,
    ANNOTATION_MIG_LAYOUT,
)
from tests.e2e import deploy
from tests.e2e.catalogue import L4, all_to_all_nvlink, whole_gpu_node
from tests.e2e.cluster import E2ECluster
from tests.e2e.impersonation import MERGE_PATCH, SCHEDULER, Answer, ApiAs, Identity, binding, service_account

ADMISSION = "/apis/admissionregistration.k8s.io/v1"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
COLLECTIONS = {  # the kinds applied, and where each is created
    "ValidatingAdmissionPolicy": f"{ADMISSION}/validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": f"{ADMISSION}/validatingadmissionpolicybindings",
    "ClusterRole": f"{RBAC}/clusterroles",
    "ClusterRoleBinding": f"{RBAC}/clusterrolebindings",
}
ASSIGNMENT_POLICY = "gpupack-assignment-writer"
AGENT_POLICY = "gpupack-agent-own-node"
GATE_POLICY = "gpupack-gate-remover"  # the DRA gate (#30): gpupack's pod patches remove its gate, nothing else
HOLD_POLICY = "gpupack-defrag-hold-writer"  # #31: who may write gpupack.io/defrag-hold
HOLD_ONLY_POLICY = "gpupack-defrag-hold-only"  # the defrag loop's pod patches write that hold, nothing else
DEFRAG = service_account("gpupack-system", "gpupack-defrag")
DRA_GATE = "gpupack.io/dra-allocation"
TENANT = Identity("e2e-tenant")
AGENT = ("gpupack-agent", "gpupack-agent")
JSON_PATCH = "application/json-patch+json"
DEFRAG_MANIFESTS = deploy.MANIFESTS / "defrag"
NOBODY = "e2e-nobody"  # a scheduler name no scheduler answers to: the test's pods stay as it leaves them


@functools.cache
def shipped_objects() -> tuple[dict[str, Any], ...]:
    """The cluster-wide authorization objects `kubectl apply -k manifests/` and `-k manifests/defrag` install."""
    rendered = [*deploy.render(deploy.kubectl(), deploy.MANIFESTS), *deploy.render(deploy.kubectl(), DEFRAG_MANIFESTS)]
    objects = tuple(o for o in rendered if o["kind"] in COLLECTIONS)
    policies = {o["metadata"]["name"] for o in objects if o["kind"].startswith("ValidatingAdmissionPolicy")}
    assert policies == {ASSIGNMENT_POLICY, AGENT_POLICY, GATE_POLICY, HOLD_POLICY, HOLD_ONLY_POLICY}, policies
    return objects


def path_of(obj: dict[str, Any]) -> str:
    """The URL path of a cluster-scoped object of COLLECTIONS."""
    return f"{COLLECTIONS[obj['kind']]}/{obj['metadata']['name']}"


class Applied:
    """Objects created on the API server by the admin, deleted again by `remove`."""

    def __init__(self, plane: ControlPlane) -> None:
        self.admin = ApiAs(plane)
        self.created: list[dict[str, Any]] = []

    def create(self, objects: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> None:
        """Create each object (replacing one of the same name a failed run left)."""
        for obj in objects:
            self.admin.delete(path_of(obj))
            answer = self.admin.post(COLLECTIONS[obj["kind"]], obj)
            assert answer.status == 201, (obj["kind"], obj["metadata"]["name"], answer.body)
            self.created.append(obj)

    def remove(self) -> None:
        """Delete everything created, newest first."""
        for obj in reversed(self.created):
            self.admin.delete(path_of(obj))
        self.created.clear()


def forged_pod_probe(admin: ApiAs, namespace: str) -> Callable[[], Answer]:
    """A dry-run create, as the admin, of a pod carrying an assignment: refused while the policy is in force."""
    body = pod_body("probe", {}, {ANNOTATION_ASSIGNMENT: "{}"}, scheduler_name=NOBODY)
    return lambda: admin.post(f"/api/v1/namespaces/{namespace}/pods?dryRun=All", body)


def wait_refused_by(policy: str, probe: Callable[[], Answer], refused: bool = True) -> None:
    """Wait until the API server answers `probe` with `policy`'s refusal (or, `refused=False`, without it)."""
    last: list[Answer] = []

    def in_step() -> bool:
        last[:] = [probe()]
        return (policy in last[0].message) == refused

    try:
        wait_until(f"{policy} to {'take' if refused else 'lose'} effect", in_step, timeout=30, interval=0.3)
    except ControlPlaneError as exc:
        raise ControlPlaneError(f"{exc}; the probe's last answer: {last[0]}") from None


@pytest.fixture
def shipped(control_plane: ControlPlane, cluster: E2ECluster) -> Iterator[Applied]:
    """The shipped policies, bindings and ClusterRoles, in force for one test; the admin's client."""
    applied = Applied(control_plane)
    probe = forged_pod_probe(applied.admin, cluster.namespace)
    try:
        applied.create(shipped_objects())
        wait_refused_by(ASSIGNMENT_POLICY, probe)
        yield applied
    finally:
        applied.remove()
        wait_refused_by(ASSIGNMENT_POLICY, probe, refused=False)  # gpupack serve binds as the admin


@pytest.fixture
def tenant(cluster: E2ECluster) -> ApiAs:
    """An ordinary user who may create, bind, update and patch pods (and their status) in the namespace."""
    rules = [
        {
            "apiGroups": [""],
            "resources": ["pods", "pods/binding", "pods/status"],
            "verbs": ["create", "get", "update", "patch"],
        }
    ]
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "tenant"},
        "rules": rules,
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "tenant"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": TENANT.user}],
    }
    admin = ApiAs(cluster.plane)
    for kind, body in (("roles", role), ("rolebindings", binding)):
        assert admin.post(f"{RBAC}/namespaces/{cluster.namespace}/{kind}", body).status == 201
    acting = ApiAs(cluster.plane, TENANT)
    wait_until("the tenant's Role", lambda: acting.get(pods_path(cluster)).status == 404, 30)
    return acting


# ============================================================ pods: gpupack.io/assignment
def pods_path(cluster: E2ECluster, name: str = "no-such-pod", sub: str = "") -> str:
    """The path of a pod of the test's namespace (or of one of its subresources)."""
    return f"/api/v1/namespaces/{cluster.namespace}/pods/{name}" + (f"/{sub}" if sub else "")


def gpu_pod(name: str, annotations: dict[str, str] | None = None, node: str | None = None) -> dict[str, Any]:
    """A one-GPU pod no scheduler picks up, bound to `node` from the start when given."""
    body = pod_body(name, {"nvidia.com/gpu": 1}, annotations, scheduler_name=NOBODY)
    if node:
        body["spec"]["nodeName"] = node
    return body


def assignment(node: str, index: int) -> str:
    """A whole-GPU assignment as gpupack writes it."""
    return json.dumps({"node": node, "gpus": [{"index": index}]}, separators=(",", ":"))


def one_gpu_node(cluster: E2ECluster, suffix: str = "a") -> str:
    """A two-GPU L4 node of the test; its name."""
    name = f"{cluster.prefix}-{suffix}"
    cluster.add_nodes([whole_gpu_node(name, L4, 2, "on-demand", 1.6, all_to_all_nvlink(2, 4))])
    return name


def assert_refused_naming_the_assignment(answer: Answer) -> None:
    """A refusal by the assignment policy, whose message names the annotation."""
    assert answer.status == 403, answer.body
    assert ASSIGNMENT_POLICY in answer.message and ANNOTATION_ASSIGNMENT in answer.message, answer.message


def test_a_pod_created_with_a_forged_assignment_is_refused_at_admission(
    cluster: E2ECluster, shipped: Applied, tenant: ApiAs
) -> None:
    node = one_gpu_node(cluster)
    forged = gpu_pod("forged", {ANNOTATION_ASSIGNMENT: assignment(node, 0)}, node)
    assert_refused_naming_the_assignment(tenant.post(pods_path(cluster, ""), forged))
    empty = gpu_pod("empty", {ANNOTATION_ASSIGNMENT: ""})  # present but empty is set all the same
    assert_refused_naming_the_assignment(tenant.post(pods_path(cluster, ""), empty))
    assert cluster.pods() == []
    # the same tenant creates pods without it, bound or not, with gpupack's other annotation
    allowed = [gpu_pod("bound", node=node), gpu_pod("plain", {ANNOTATION_INTERRUPTIBLE: "true"})]
    assert [tenant.post(pods_path(cluster, ""), body).status for body in allowed] == [201, 201]


def test_only_the_scheduler_may_bind_with_an_assignment(cluster: E2ECluster, shipped: Applied, tenant: ApiAs) -> None:
    node = one_gpu_node(cluster)
    assert tenant.post(pods_path(cluster, ""), gpu_pod("mine")).status == 201
    pod = tenant.get(pods_path(cluster, "mine")).body
    placed = {ANNOTATION_ASSIGNMENT: assignment(node, 1)}
    assert_refused_naming_the_assignment(tenant.post(pods_path(cluster, "mine", "binding"), binding(pod, node, placed)))
    unchanged = tenant.get(pods_path(cluster, "mine")).body
    assert "nodeName" not in unchanged["spec"] and "annotations" not in unchanged["metadata"]

    scheduler = ApiAs(cluster.plane, SCHEDULER)
    assert scheduler.post(pods_path(cluster, "mine", "binding"), binding(pod, node, placed)).status == 201
    bound = tenant.get(pods_path(cluster, "mine")).body
    assert (bound["spec"]["nodeName"], bound["metadata"]["annotations"]) == (node, placed)
    # a Binding without the annotation stays the tenant's right
    assert tenant.post(pods_path(cluster, ""), gpu_pod("other")).status == 201
    other = tenant.get(pods_path(cluster, "other")).body
    assert tenant.post(pods_path(cluster, "other", "binding"), binding(other, node, {})).status == 201


def test_only_the_scheduler_may_change_or_remove_an_assignment(
    cluster: E2ECluster, shipped: Applied, tenant: ApiAs
) -> None:
    node = one_gpu_node(cluster)
    assert tenant.post(pods_path(cluster, ""), gpu_pod("mine")).status == 201
    pod = tenant.get(pods_path(cluster, "mine")).body
    placed = assignment(node, 0)
    by_scheduler = binding(pod, node, {ANNOTATION_ASSIGNMENT: placed})
    assert ApiAs(cluster.plane, SCHEDULER).post(pods_path(cluster, "mine", "binding"), by_scheduler).status == 201

    for sub in ("", "status"):  # pods/status writes metadata too
        for value in (assignment(node, 1), None):
            patch = {"metadata": {"annotations": {ANNOTATION_ASSIGNMENT: value}}}
            assert_refused_naming_the_assignment(tenant.merge_patch(pods_path(cluster, "mine", sub), patch))
    current = tenant.get(pods_path(cluster, "mine")).body
    current["metadata"]["annotations"].pop(ANNOTATION_ASSIGNMENT)
    assert_refused_naming_the_assignment(tenant.request("PUT", pods_path(cluster, "mine"), current))

    other = {"metadata": {"annotations": {"example.com/owner": "team-a"}, "labels": {"team": "a"}}}
    assert tenant.merge_patch(pods_path(cluster, "mine"), other).status == 200
    status = {"status": {"conditions": [{"type": "example.com/Checked", "status": "True"}]}}
    assert tenant.merge_patch(pods_path(cluster, "mine", "status"), status).status == 200  # as a kubelet's update
    annotations = tenant.get(pods_path(cluster, "mine")).body["metadata"]["annotations"]
    assert annotations[ANNOTATION_ASSIGNMENT] == placed and annotations["example.com/owner"] == "team-a"


def test_only_the_defrag_loop_and_the_hold_writers_may_write_a_defrag_hold(
    cluster: E2ECluster, shipped: Applied, tenant: ApiAs
) -> None:
    """#31: gpupack.io/defrag-hold makes the extender hold capacity for a pod; the tenant who owns the pod may
    not write it, the defrag loop's ServiceAccount and the admins (defragHoldWriters: system:masters) may."""
    hold = json.dumps({"node": one_gpu_node(cluster), "gpus": [{"index": 0}]})
    forged = gpu_pod("forged", {ANNOTATION_DEFRAG_HOLD: hold})
    wait_refused_by(HOLD_POLICY, lambda: tenant.post(pods_path(cluster, "") + "?dryRun=All", forged))
    assert tenant.post(pods_path(cluster, ""), gpu_pod("mine")).status == 201
    patch = {"metadata": {"annotations": {ANNOTATION_DEFRAG_HOLD: hold}}}
    answer = tenant.merge_patch(pods_path(cluster, "mine"), patch)
    assert answer.status == 403 and HOLD_POLICY in answer.message and ANNOTATION_DEFRAG_HOLD in answer.message

    assert ApiAs(cluster.plane, DEFRAG).merge_patch(pods_path(cluster, "mine"), patch).status == 200
    for value in (hold.replace("0", "1"), None):  # the tenant may neither change nor remove it
        changed = {"metadata": {"annotations": {ANNOTATION_DEFRAG_HOLD: value}}}
        assert tenant.merge_patch(pods_path(cluster, "mine"), changed).status == 403
    removed = {"metadata": {"annotations": {ANNOTATION_DEFRAG_HOLD: None}}}
    assert ApiAs(cluster.plane).merge_patch(pods_path(cluster, "mine"), removed).status == 200  # an admin may
    other = {"metadata": {"annotations": {"example.com/owner": "team-a"}}}
    assert tenant.merge_patch(pods_path(cluster, "mine"), other).status == 200  # other annotations stay the tenant's


def test_the_defrag_loop_may_change_nothing_of_a_pod_but_its_hold(
    cluster: E2ECluster, shipped: Applied, tenant: ApiAs
) -> None:
    assert tenant.post(pods_path(cluster, ""), gpu_pod("mine")).status == 201
    defrag = ApiAs(cluster.plane, DEFRAG)
    labelled = {"metadata": {"labels": {"team": "a"}}}
    probe = lambda: defrag.request("PATCH", pods_path(cluster, "mine") + "?dryRun=All", labelled, MERGE_PATCH)  # noqa: E731
    wait_refused_by(HOLD_ONLY_POLICY, probe)
    for patch in (
        labelled,
        {"metadata": {"annotations": {"example.com/owner": "team-b"}}},
        {"spec": {"activeDeadlineSeconds": 60}},
    ):
        answer = defrag.merge_patch(pods_path(cluster, "mine"), patch)
        assert answer.status == 403 and HOLD_ONLY_POLICY in answer.message, (patch, answer.body)
    hold = {"metadata": {"annotations": {ANNOTATION_DEFRAG_HOLD: json.dumps({"node": "n", "gpus": []})}}}
    assert defrag.merge_patch(pods_path(cluster, "mine"), hold).status == 200


def held_pod(name: str) -> dict[str, Any]:
    """A pod under gpupack's DRA gate and another's. Its claim never exists, so the `gpupack serve` of the
    session's plane waits for it and leaves the gate alone (a gated pod without claims it would ungate)."""
    body = gpu_pod(name)
    body["spec"]["schedulingGates"] = [{"name": DRA_GATE}, {"name": "example.com/quota"}]
    body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "never-made"}]
    return body


def test_the_scheduler_may_remove_only_its_own_scheduling_gate_from_a_pod(
    cluster: E2ECluster, shipped: Applied, tenant: ApiAs
) -> None:
    """RBAC lets gpupack's ServiceAccount patch pods (#30: it lifts gpupack.io/dra-allocation once it has
    allocated a pod's claims); gpupack-gate-remover refuses every other change it would make."""
    assert tenant.post(pods_path(cluster, ""), held_pod("held")).status == 201
    scheduler = ApiAs(cluster.plane, SCHEDULER)

    def gates(*names: str) -> list[dict[str, Any]]:
        return [{"op": "replace", "path": "/spec/schedulingGates", "value": [{"name": n} for n in names]}]

    refused = [
        gates(DRA_GATE),  # another's gate lifted
        gates(),  # both
        [{"op": "add", "path": "/metadata/labels", "value": {"team": "a"}}],
        [{"op": "add", "path": "/metadata/annotations", "value": {"example.com/x": "y"}}],
        [*gates("example.com/quota"), {"op": "add", "path": "/metadata/labels", "value": {"team": "a"}}],
    ]
    # the shipped fixture waits for the assignment policy; this one may load a moment later
    probe = lambda: scheduler.request("PATCH", pods_path(cluster, "held") + "?dryRun=All", gates(), JSON_PATCH)  # noqa: E731
    wait_refused_by(GATE_POLICY, probe)
    for patch in refused:
        answer = scheduler.request("PATCH", pods_path(cluster, "held"), patch, JSON_PATCH)
        assert answer.status == 403 and GATE_POLICY in answer.message, (patch, answer.body)
    assert tenant.post(pods_path(cluster, ""), held_pod("held-too")).status == 201
    answer = scheduler.request("PATCH", pods_path(cluster, "held-too"), gates("example.com/quota"), JSON_PATCH)
    assert answer.status == 200, answer.body
    assert answer.body["spec"]["schedulingGates"] == [{"name": "example.com/quota"}]


def test_a_policy_on_pods_alone_does_not_see_the_binding(cluster: E2ECluster, tenant: ApiAs) -> None:
    """Why the shipped policy also matches pods/binding: the API server copies a Binding's annotations
    onto the pod inside storage, with no pods UPDATE for admission to see."""
    named = {o["kind"]: copy.deepcopy(o) for o in shipped_objects() if o["metadata"]["name"] == ASSIGNMENT_POLICY}
    policy, policy_binding = named["ValidatingAdmissionPolicy"], named["ValidatingAdmissionPolicyBinding"]
    policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] = ["pods"]
    applied = Applied(cluster.plane)
    probe = forged_pod_probe(applied.admin, cluster.namespace)
    node = one_gpu_node(cluster)
    try:
        applied.create([policy, policy_binding])
        wait_refused_by(ASSIGNMENT_POLICY, probe)
        assert tenant.post(pods_path(cluster, ""), gpu_pod("mine")).status == 201
        pod = tenant.get(pods_path(cluster, "mine")).body
        placed = {ANNOTATION_ASSIGNMENT: assignment(node, 0)}
        assert tenant.post(pods_path(cluster, "mine", "binding"), binding(pod, node, placed)).status == 201
        assert tenant.get(pods_path(cluster, "mine")).body["metadata"]["annotations"] == placed
    finally:
        applied.remove()
        wait_refused_by(ASSIGNMENT_POLICY, probe, refused=False)


# ============================================================ nodes: the agent's own annotations
def agent_of(cluster: E2ECluster, node: str | None) -> ApiAs:
    """The agent's ServiceAccount, its token's node claim `node` (None: a token without one)."""
    return ApiAs(cluster.plane, service_account(*AGENT, node))


def node_path(name: str) -> str:
    """The URL path of a Node."""
    return f"/api/v1/nodes/{name}"


def annotations_patch(annotations: Mapping[str, str | None]) -> dict[str, Any]:
    """A merge patch of these Node annotations only, as the agent sends it."""
    return {"metadata": {"annotations": annotations}}


def nodes_with_agent_policy(cluster: E2ECluster) -> tuple[str, str]:
    """Nodes A and B of the test, once the agent policy is in force (probed with a claimless dry run)."""
    a, b = one_gpu_node(cluster, "a"), one_gpu_node(cluster, "b")
    claimless = agent_of(cluster, None)
    probe = annotations_patch({ANNOTATION_GPU_TOPOLOGY: None})
    wait_refused_by(AGENT_POLICY, lambda: claimless.merge_patch(f"{node_path(a)}?dryRun=All", probe))
    return a, b


def assert_refused_by_agent_policy(answer: Answer, *words: str) -> None:
    """A refusal by the agent policy whose message holds `words`."""
    assert answer.status == 403, answer.body
    assert AGENT_POLICY in answer.message and all(word in answer.message for word in words), answer.message


def test_an_agent_writes_its_three_annotations_on_its_own_node_only(cluster: E2ECluster, shipped: Applied) -> None:
    a, b = nodes_with_agent_policy(cluster)
    agent = agent_of(cluster, a)
    published = {
        ANNOTATION_GPU_TOPOLOGY: all_to_all_nvlink(2, 18),
        ANNOTATION_DEVICES_IN_USE: json.dumps({"blocked": [{"index": 1, "reason": "e2e"}]}),
    }
    assert agent.merge_patch(node_path(a), annotations_patch({**published, ANNOTATION_MIG_LAYOUT: None})).status == 200
    assert agent.merge_patch(node_path(a), annotations_patch({ANNOTATION_DEVICES_IN_USE: None})).status == 200
    held = shipped.admin.get(node_path(a)).body["metadata"]["annotations"]
    assert held[ANNOTATION_GPU_TOPOLOGY] == published[ANNOTATION_GPU_TOPOLOGY] and ANNOTATION_DEVICES_IN_USE not in held

    before_b = shipped.admin.get(node_path(b)).body
    refused = agent.merge_patch(node_path(b), annotations_patch(published))
    assert_refused_by_agent_policy(refused, f"node {a} may not change node {b}")
    assert shipped.admin.get(node_path(b)).body["metadata"] == before_b["metadata"]


@pytest.mark.parametrize(
    "patch",
    [
        {"metadata": {"labels": {"nvidia.com/gpu.product": "NVIDIA-H200"}}},
        {"metadata": {"labels": {"nvidia.com/gpu.count": None}}},
        {"spec": {"taints": [{"key": "example.com/evict", "effect": "NoExecute"}]}},
        {"spec": {"unschedulable": True}},
        annotations_patch({ANNOTATION_MIG: "dynamic"}),
        annotations_patch({ANNOTATION_HOURLY_COST: "0"}),
        annotations_patch({ANNOTATION_HOURLY_COST: None}),
        {"metadata": {"annotations": {ANNOTATION_GPU_TOPOLOGY: all_to_all_nvlink(2, 18)}, "labels": {"x": "y"}}},
        {"metadata": {"finalizers": ["example.com/keep"]}},
    ],
    ids=[
        "label",
        "label-removed",
        "taint",
        "unschedulable",
        "mig",
        "hourly-cost",
        "hourly-cost-removed",
        "own-annotation-with-a-label",
        "finalizer",
    ],
)
def test_an_agent_changes_nothing_else_on_its_node(
    cluster: E2ECluster, shipped: Applied, patch: dict[str, Any]
) -> None:
    a, _ = nodes_with_agent_policy(cluster)
    before = shipped.admin.get(node_path(a)).body
    assert_refused_by_agent_policy(agent_of(cluster, a).merge_patch(node_path(a), patch), "may ")
    after = shipped.admin.get(node_path(a)).body
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


def test_an_agent_credential_without_a_node_claim_changes_no_node(cluster: E2ECluster, shipped: Applied) -> None:
    a, _ = nodes_with_agent_policy(cluster)
    refused = agent_of(cluster, None).merge_patch(node_path(a), annotations_patch({ANNOTATION_GPU_TOPOLOGY: None}))
    assert_refused_by_agent_policy(refused, "no node claim")
    # the policy holds the agent's identity only: an operator still sets what is the operator's
    assert shipped.admin.merge_patch(node_path(a), annotations_patch({ANNOTATION_MIG: "static"})).status == 200
