"""`gpupack defrag` on the real control plane (#31 item 4): kube-apiserver, kube-controller-manager (ReplicaSets,
PodDisruptionBudgets) and kube-scheduler with gpupack as its extender, at the newest release.

A fragmented cluster, built bound (`spec.nodeName` and `gpupack.io/assignment`), where an 8-GPU pod and a
`7g.80gb` MIG pod are Pending:

- `a`, `b`, `c`: nodes of 8 whole H100s. `a` holds `guarded` (1 GPU; a ReplicaSet's, movable, but a
  PodDisruptionBudget with `maxUnavailable: 0` covers it), `b` holds `mover` (1 GPU; a ReplicaSet's,
  movable), `c` holds `pinned` (6 GPUs, a bare pod). No node has 8 GPUs free. Evicting `guarded` or
  `mover` frees a node alike (one eviction each, and another node takes the pod again); `a` comes first
  by name, so the plan routes around the budget to `b`.
- `m`: a node of two dynamic-MIG H100s, a 1g instance on each: `mig-mover` (a ReplicaSet's, movable) on
  GPU 0 and `mig-pinned` (bare) on GPU 1. No GPU is free for the `7g`; moving `mig-mover` beside
  `mig-pinned` frees GPU 0.

The dry run prints that plan and evicts nothing. `--execute` evicts exactly the planned pods through the
Eviction API; their ReplicaSets recreate them, kube-scheduler binds the new pods through gpupack, and the
two pending pods bind where the plan freed room. `guarded` and the bare pods are never touched.

The loop (`gpupack defrag --loop --execute`, two processes as the deployment runs two replicas) runs as the
ServiceAccount gpupack-defrag with a token the API server issued, under the RBAC of manifests/defrag/rbac.yaml
and the hold policies of manifests/admission.yaml: one leads, it moves once and then its budget of one
eviction a window is spent, so a second pending pod stays pending; stopped, it gives the Lease up, and the
other replica, taking over, finds the window's eviction in the Lease and evicts nothing either.

Pods carry `terminationGracePeriodSeconds: 0`: with no kubelet here a graceful deletion never completes
(tests/e2e/test_preemption.py says why); with 0 the API server removes an evicted pod at once.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from gpupack.cli import main
from gpupack.defrag.lease import ANNOTATION_EVICTIONS
from gpupack.harness.controlplane import ControlPlaneError, free_port, pod_body, wait_until
from gpupack.harness.kube_programs import NEWEST, REPO_ROOT, MissingBinary
from gpupack.kube.keys import ANNOTATION_ASSIGNMENT, LABEL_MOVABLE
from tests.e2e.catalogue import H100, dynamic_mig_node, whole_gpu_node
from tests.e2e.conftest import missing_program
from tests.e2e.impersonation import ApiAs
from tests.e2e.pod_events import notes_by_pod
from tests.e2e.realcluster import FullControlPlane

SETTLE = 90.0  # s for a pod to bind, or to be recreated and bind


@pytest.fixture(scope="module")
def plane() -> Iterator[FullControlPlane]:
    try:
        full = FullControlPlane(NEWEST).start(with_extender=True)
    except MissingBinary as exc:
        missing_program(exc)
    try:
        yield full
    finally:
        full.stop()


@pytest.fixture
def namespace(plane: FullControlPlane) -> Iterator[str]:
    """A fresh namespace; its ReplicaSets and pods, and the nodes named after it, are gone afterwards."""
    name = f"defrag-{uuid.uuid4().hex[:6]}"
    plane.create_namespace(name)
    yield name
    client.AppsV1Api(plane.api_client()).delete_collection_namespaced_replica_set(name)
    plane.delete_pods(name)
    plane.core().delete_namespace(name)
    for node in plane.core().list_node().items:
        if node.metadata.name.startswith(f"{name}-"):
            plane.core().delete_node(node.metadata.name)


def bound_pod(name: str, node: str, limits: dict[str, int], gpus: list[dict[str, Any]]) -> dict[str, Any]:
    body = pod_body(name, limits, {ANNOTATION_ASSIGNMENT: json.dumps({"node": node, "gpus": gpus})})
    body["spec"]["nodeName"] = node
    body["spec"]["terminationGracePeriodSeconds"] = 0
    body["metadata"]["labels"] = {"app": name}
    return body


def replica_set(name: str, limits: dict[str, int]) -> dict[str, Any]:
    """One replica of pods `app: name`, movable; it adopts the bound pod of that label created before it."""
    spec = pod_body(name, limits)["spec"]
    spec["terminationGracePeriodSeconds"] = 0
    template = {"metadata": {"labels": {"app": name, LABEL_MOVABLE: "true"}}, "spec": spec}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": template},
    }


def owned_pod(plane: FullControlPlane, namespace: str, body: dict[str, Any], limits: dict[str, int]) -> None:
    """The bound pod, movable, then its ReplicaSet; waits until the ReplicaSet has adopted it."""
    name = body["metadata"]["name"]
    body["metadata"]["labels"][LABEL_MOVABLE] = "true"
    plane.create_pod(namespace, body)
    body_of_set = client.V1ReplicaSet.from_dict(replica_set(name, limits))
    assert body_of_set is not None
    client.AppsV1Api(plane.api_client()).create_namespaced_replica_set(namespace, body_of_set)

    def adopted() -> bool:
        pod = plane.core().read_namespaced_pod(name, namespace)
        return any(o.controller and o.kind == "ReplicaSet" for o in pod.metadata.owner_references or [])

    wait_until(f"ReplicaSet {name} to adopt its pod", adopted, 30)


def pods(plane: FullControlPlane, namespace: str) -> dict[str, dict[str, Any]]:
    response: Any = plane.core().list_namespaced_pod(namespace, _preload_content=False)
    return {p["metadata"]["name"]: p for p in json.loads(response.data)["items"]}


def defrag(plane: FullControlPlane, namespace: str, capsys: pytest.CaptureFixture[str], *extra: str) -> Any:
    """`gpupack defrag --json` on the plane, moving only `namespace`'s pods, with `extra` arguments."""
    code = main(["defrag", "--kubeconfig", str(plane.kubeconfig), "-n", namespace, "--json", *extra])
    assert code == 0, capsys.readouterr()
    return json.loads(capsys.readouterr().out)


def test_defrag_moves_exactly_the_planned_pods_and_the_pending_pods_bind(
    plane: FullControlPlane, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = namespace
    a, b, c, m = (f"{prefix}-{n}" for n in "abcm")
    for name in (a, b, c):
        plane.create_node(whole_gpu_node(name, H100, 8, "on-demand", 40.0))
    plane.create_node(dynamic_mig_node(m, H100, 2, "on-demand", 40.0))
    one_gpu = {"nvidia.com/gpu": 1}
    one_g = {"nvidia.com/mig-1g.10gb": 1}
    owned_pod(plane, namespace, bound_pod("guarded", a, one_gpu, [{"index": 0}]), one_gpu)
    owned_pod(plane, namespace, bound_pod("mover", b, one_gpu, [{"index": 0}]), one_gpu)
    plane.create_pod(namespace, bound_pod("pinned", c, {"nvidia.com/gpu": 6}, [{"index": g} for g in range(6)]))
    owned_pod(plane, namespace, bound_pod("mig-mover", m, one_g, [{"index": 0, "mig": "1g.10gb", "start": 6}]), one_g)
    plane.create_pod(namespace, bound_pod("mig-pinned", m, one_g, [{"index": 1, "mig": "1g.10gb", "start": 6}]))
    budget = client.V1PodDisruptionBudget.from_dict(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "guarded"},
            "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "guarded"}}},
        }
    )
    assert budget is not None
    client.PolicyV1Api(plane.api_client()).create_namespaced_pod_disruption_budget(namespace, budget)
    plane.create_pod(namespace, pod_body("train", {"nvidia.com/gpu": 8}))
    plane.create_pod(namespace, pod_body("big", {"nvidia.com/mig-7g.80gb": 1}))
    before = {name: p["metadata"]["uid"] for name, p in pods(plane, namespace).items()}

    def unschedulable(name: str) -> bool:
        conditions = pods(plane, namespace)[name].get("status", {}).get("conditions") or []
        return any(x["type"] == "PodScheduled" and x.get("reason") == "Unschedulable" for x in conditions)

    wait_until("both GPU pods to be unschedulable", lambda: unschedulable("train") and unschedulable("big"), SETTLE)

    everything = defrag(plane, namespace, capsys)  # every goal: the budget's pod is named as unmovable
    assert "PodDisruptionBudget" in everything["skipped"][f"{a}/gpu-0"]
    plan = defrag(plane, namespace, capsys, "--goal", "schedule-pending-pod")
    assert plan["dry_run"] is True
    moves = {m["target"]: m for m in plan["moves"]}
    assert set(moves) == {f"{namespace}/train", f"{namespace}/big"}
    train, big = moves[f"{namespace}/train"], moves[f"{namespace}/big"]
    [moved] = train["evictions"]
    assert (moved["pod"], moved["from"]) == (f"{namespace}/mover", b) and moved["to"]["node"] in (a, c)
    assert train["placement"]["node"] == b
    assert [(e["pod"], e["from"], e["to"]["gpus"][0]["index"]) for e in big["evictions"]] == [
        (f"{namespace}/mig-mover", m, 1)
    ]
    assert big["placement"] == {"node": m, "gpus": [{"index": 0, "mig": "7g.80gb", "start": 0}]}
    assert {n: p["metadata"]["uid"] for n, p in pods(plane, namespace).items()} == before  # a dry run

    done = defrag(plane, namespace, capsys, "--goal", "schedule-pending-pod", "--execute")
    assert done["dry_run"] is False and done["carried_out"]["stopped"] == ""
    assert sorted((e["pod"], e["outcome"]) for e in done["carried_out"]["evictions"]) == [
        (f"{namespace}/mig-mover", "evicted"),
        (f"{namespace}/mover", "evicted"),
    ]

    def settled() -> bool:
        now = pods(plane, namespace)
        recreated = [p for n, p in now.items() if n not in before]
        return (
            all(now.get(n, {}).get("spec", {}).get("nodeName") for n in ("train", "big"))
            and len(recreated) == 2
            and all(p["spec"].get("nodeName") for p in recreated)
        )

    try:
        wait_until("the pending pods and the recreated ones to bind", settled, SETTLE, interval=1.0)
    except ControlPlaneError:
        log = [line for line in plane.gpupack_log().splitlines() if namespace in line][-30:]
        pytest.fail(f"not settled: {summary(pods(plane, namespace))}; gpupack's log:\n" + "\n".join(log))
    after = pods(plane, namespace)
    assert after["train"]["spec"]["nodeName"] == b
    assert json.loads(after["big"]["metadata"]["annotations"][ANNOTATION_ASSIGNMENT]) == big["placement"]
    recreated = {p["metadata"]["labels"]["app"]: p["spec"]["nodeName"] for n, p in after.items() if n not in before}
    assert recreated == {"mover": moved["to"]["node"], "mig-mover": m}  # where the simulation put them
    gone = {n for n in before if n not in after}
    assert gone == {"mover", "mig-mover"}  # exactly the planned pods; nothing else was evicted
    for untouched in ("guarded", "pinned", "mig-pinned"):
        assert after[untouched]["metadata"]["uid"] == before[untouched]
    notes = notes_by_pod(plane, namespace, "Defragmented")
    assert set(notes) == {"mover", "mig-mover"}


def summary(now: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Pod name -> its node, or why it is not bound (for a failure's message)."""
    out = {}
    for name, pod in now.items():
        conditions = pod.get("status", {}).get("conditions") or []
        why = next((c.get("message", "") for c in conditions if c["type"] == "PodScheduled"), "pending")
        assignment = (pod["metadata"].get("annotations") or {}).get(ANNOTATION_ASSIGNMENT, "")
        out[name] = f"{pod['spec']['nodeName']} {assignment}" if pod["spec"].get("nodeName") else why
    return out


# ------------------------------------------------------------------ the loop, as its ServiceAccount
RELEASE_NAMESPACE = "gpupack-system"
HOLD_POLICIES = {"gpupack-defrag-hold-writer", "gpupack-defrag-hold-only"}
RBAC_API = "/apis/rbac.authorization.k8s.io/v1"
ADMISSION_API = "/apis/admissionregistration.k8s.io/v1"


def collection(obj: dict[str, Any]) -> str:
    """The URL path where the admin creates `obj`."""
    namespace = obj["metadata"].get("namespace", "")
    return {
        "ServiceAccount": f"/api/v1/namespaces/{namespace}/serviceaccounts",
        "ClusterRole": f"{RBAC_API}/clusterroles",
        "ClusterRoleBinding": f"{RBAC_API}/clusterrolebindings",
        "Role": f"{RBAC_API}/namespaces/{namespace}/roles",
        "RoleBinding": f"{RBAC_API}/namespaces/{namespace}/rolebindings",
        "ValidatingAdmissionPolicy": f"{ADMISSION_API}/validatingadmissionpolicies",
        "ValidatingAdmissionPolicyBinding": f"{ADMISSION_API}/validatingadmissionpolicybindings",
    }[obj["kind"]]


def shipped_loop_authorization() -> list[dict[str, Any]]:
    """The loop's ServiceAccount and RBAC (manifests/defrag) and the two hold policies (manifests/admission.yaml)."""
    manifests = REPO_ROOT / "manifests"
    objects = [d for name in ("serviceaccount.yaml", "rbac.yaml") for d in load(manifests / "defrag" / name)]
    policies = [d for d in load(manifests / "admission.yaml") if d["metadata"]["name"] in HOLD_POLICIES]
    assert len(policies) == 4, [p["metadata"]["name"] for p in policies]  # two policies, two bindings
    return objects + policies


def load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.fixture
def loop_identity(plane: FullControlPlane, tmp_path: Path) -> Iterator[Path]:
    """The loop's authorization in force, and a kubeconfig with a token of its ServiceAccount; removed after."""
    admin = ApiAs(plane)
    if admin.get(f"/api/v1/namespaces/{RELEASE_NAMESPACE}").status == 404:
        plane.create_namespace(RELEASE_NAMESPACE)
    created = shipped_loop_authorization()
    try:
        for obj in created:
            answer = admin.post(collection(obj), obj)
            assert answer.status in (201, 409), (obj["kind"], answer.body)
        token_request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
        account = f"/api/v1/namespaces/{RELEASE_NAMESPACE}/serviceaccounts/gpupack-defrag"
        issued = admin.post(f"{account}/token", token_request)
        assert issued.status == 201, issued.body
        yield token_kubeconfig(plane, tmp_path / "defrag-kubeconfig", issued.body["status"]["token"])
    finally:
        for obj in reversed(created):
            admin.delete(f"{collection(obj)}/{obj['metadata']['name']}")
        admin.delete(f"/apis/coordination.k8s.io/v1/namespaces/{RELEASE_NAMESPACE}/leases/gpupack-defrag")


def token_kubeconfig(plane: FullControlPlane, path: Path, token: str) -> Path:
    config = yaml.safe_load(plane.kubeconfig.read_text())
    config["users"] = [{"name": "admin", "user": {"token": token}}]
    path.write_text(yaml.safe_dump(config))
    return path


class LoopProcess:
    """`gpupack defrag --loop --execute` as a process of its own, with its metrics port and log."""

    def __init__(self, kubeconfig: Path, namespace: str, log: Path) -> None:
        self.port = free_port()
        self.log = log
        argv = [sys.executable, "-m", "gpupack.cli", "defrag", "--loop", "--execute", "--kubeconfig", str(kubeconfig)]
        argv += ["-n", namespace, "--goal", "schedule-pending-pod", "--every", "1", "--window-evictions", "1"]
        argv += ["--lease-namespace", RELEASE_NAMESPACE, "--metrics-port", str(self.port)]
        self.process = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT)

    def metric(self, name: str, **labels: str) -> float:
        """One sample of its /metrics (0 when absent)."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5).read().decode()
        wanted = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.split(" ")[0] == wanted)

    def leading(self) -> bool:
        try:
            return self.metric("gpupack_defrag_leader") == 1
        except OSError:
            return False  # not serving yet

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def lease(plane: FullControlPlane) -> tuple[str, list[float]]:
    """The defrag Lease's holder and the eviction times it records."""
    answer = ApiAs(plane).get(f"/apis/coordination.k8s.io/v1/namespaces/{RELEASE_NAMESPACE}/leases/gpupack-defrag")
    if answer.status != 200:
        return "", []
    annotations = answer.body["metadata"].get("annotations") or {}
    return answer.body["spec"].get("holderIdentity") or "", json.loads(annotations.get(ANNOTATION_EVICTIONS, "[]"))


def test_the_loop_moves_within_its_budget_as_its_service_account_and_hands_its_lease_over(
    plane: FullControlPlane, namespace: str, loop_identity: Path, tmp_path: Path
) -> None:
    a, b, c = (f"{namespace}-{n}" for n in "abc")
    for name in (a, b, c):
        plane.create_node(whole_gpu_node(name, H100, 8, "on-demand", 40.0))
    one_gpu = {"nvidia.com/gpu": 1}
    owned_pod(plane, namespace, bound_pod("mover-a", a, one_gpu, [{"index": 0}]), one_gpu)
    owned_pod(plane, namespace, bound_pod("mover-b", b, one_gpu, [{"index": 0}]), one_gpu)
    plane.create_pod(namespace, bound_pod("pinned", c, {"nvidia.com/gpu": 6}, [{"index": g} for g in range(6)]))
    for name in ("train-1", "train-2"):  # each needs a whole node: one move each, but the budget is one eviction
        plane.create_pod(namespace, pod_body(name, {"nvidia.com/gpu": 8}))
    before = {name: p["metadata"]["uid"] for name, p in pods(plane, namespace).items()}

    loops = [LoopProcess(loop_identity, namespace, tmp_path / f"loop-{i}.log") for i in range(2)]
    try:
        wait_until("one replica to lead", lambda: sum(loop.leading() for loop in loops) == 1, SETTLE)
        [leader] = [loop for loop in loops if loop.leading()]
        [follower] = [loop for loop in loops if loop is not leader]

        def one_bound() -> bool:
            return sum(bool(pods(plane, namespace)[n]["spec"].get("nodeName")) for n in ("train-1", "train-2")) == 1

        wait_until("one pending pod to bind", one_bound, SETTLE, interval=1.0)
        wait_until("the leader to find its budget spent", lambda: leader.metric(
            "gpupack_defrag_rounds_total", outcome="budget-spent") >= 3, SETTLE)  # fmt: skip
        assert leader.metric("gpupack_defrag_evictions_total", outcome="evicted") == 1
        holder, evictions = lease(plane)
        assert holder and len(evictions) == 1

        leader.stop()  # gives the Lease up: the follower takes over at its next try, not after the Lease's expiry
        wait_until("the other replica to lead", follower.leading, 20)
        assert lease(plane)[0] not in ("", holder)
        wait_until("its rounds to find the budget spent", lambda: follower.metric(
            "gpupack_defrag_rounds_total", outcome="budget-spent") >= 2, SETTLE)  # fmt: skip
        assert follower.metric("gpupack_defrag_evictions_total", outcome="evicted") == 0
    finally:
        for loop in loops:
            loop.stop()
        logs = "\n".join(loop.log.read_text()[-3000:] for loop in loops)
    after = pods(plane, namespace)
    gone = {n for n in before if n not in after}
    assert len(gone) == 1 and gone <= {"mover-a", "mover-b"}, (gone, logs)  # one eviction, of a movable pod
    assert after["pinned"]["metadata"]["uid"] == before["pinned"]
    still_pending = [n for n in ("train-1", "train-2") if not after[n]["spec"].get("nodeName")]
    assert len(still_pending) == 1, summary(after)
