"""The Helm chart (charts/gpupack) against the real API server of every Kubernetes version of the matrix (#27).

Control plane only: conftest's `control_plane` of each version of CONTROL_PLANE_VERSIONS, which runs no
controllers and has no node, so a Deployment never gets pods (nor needs them here). What each part proves:
- lint: `helm lint --strict` passes for several value sets and does fail on a refused one; manifests/ is
  what the chart renders (`python -m gpupack.harness.manifests --check`).
- the values matrix (VALUE_SETS): each set, rendered with `--kube-version` of a control plane, is accepted
  by that version's API server (`kubectl apply --dry-run=server`: schema, defaulting, validation and
  admission, nothing stored, no warning) and renders what its values say (images, namespaces, the
  admission policies' ServiceAccounts, exactly the objects of the switches that are on).
- install: `helm install` of the default values asks the cluster for its version and deploys a
  kube-scheduler of that minor; `helm uninstall` leaves no object of the chart behind.
- refused values: a value the schema or the templates refuse fails `helm install` with their message
  before anything is created.
- the policy: gpupack's own settings loader reads the rendered policy.yaml as the values say, and every
  bound of the schema's policy section is the settings model's bound too.

Namespaces in the dry run: a dry run stores nothing, so the API server (NamespaceLifecycle admission) refuses
every object of a namespace that only a dry run made. The release namespace is made for real first, as
`--create-namespace` would, with the Pod Security level the chart gives it (`namespace.create`), so a pod
template the level would refuse shows up as a warning. The agent's namespace is the chart's own object:
it is dry-run alone, then created for real exactly as rendered (its Pod Security level is what admits the
privileged agent), then the whole set is dry-run, then the namespace is removed again, so the install
and refusal cases after it find the cluster without it (helm will not adopt an object it did not make).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from gpupack.extender.settings import Settings, SettingsError, load_settings
from gpupack.harness.controlplane import ControlPlane, wait_until
from gpupack.harness.kube_programs import CONTROL_PLANE_VERSIONS, NEWEST, MissingBinary
from gpupack.harness.manifests import rendered_files, stale
from tests.e2e.conftest import missing_program
from tests.e2e.deploy import kubectl
from tests.e2e.helm_deploy import CHART, NAMESPACE, RELEASE, Helm

Objects = list[dict[str, Any]]
Key = tuple[str, str]  # (kind, name)

DEFAULTS: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
SCHEMA: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
APP_VERSION = str(yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"])
PART_OF = "app.kubernetes.io/part-of=gpupack"
DIGEST = "sha256:" + "0123456789abcdef" * 4
# the chart's Pod Security level of the release namespace (templates/namespace.yaml)
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
ADMISSION_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
MUTATING_KINDS = ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")  # the DRA gate (#30), 1.36+
SERVICE_MONITOR_CRD = "servicemonitors.monitoring.coreos.com"
# what the chart renders whatever the switches
ALWAYS: frozenset[Key] = frozenset(
    {
        ("Deployment", "gpupack-scheduler"),
        ("ServiceAccount", "gpupack-scheduler"),
        ("ConfigMap", "gpupack-policy"),
        ("ConfigMap", "gpupack-scheduler-config"),
        ("ClusterRole", "gpupack-extender"),
        ("ClusterRoleBinding", "gpupack-extender"),
        ("ClusterRoleBinding", "gpupack-scheduler-as-kube-scheduler"),
        ("ClusterRoleBinding", "gpupack-scheduler-as-volume-scheduler"),
        ("Role", "gpupack-scheduler-leader-election"),
        ("RoleBinding", "gpupack-scheduler-leader-election"),
        ("RoleBinding", "gpupack-scheduler-extension-apiserver-authentication-reader"),
    }
)


@dataclass(frozen=True)
class ValueSet:
    """Chart values (dotted keys, passed typed with `--set-json`) and the release namespace."""

    name: str
    values: Mapping[str, Any] = field(default_factory=dict)
    namespace: str = NAMESPACE

    def args(self) -> list[str]:
        """`--namespace` and one `--set-json` per value (plain `--set` would pass 0.1 as a string)."""
        return ["--namespace", self.namespace, *(a for k, v in self.values.items() for a in set_json(k, v))]

    def effective(self) -> dict[str, Any]:
        """values.yaml with these values set: what the templates see."""
        merged = copy.deepcopy(DEFAULTS)
        for key, value in self.values.items():
            *parents, leaf = key.split(".")
            node = merged
            for part in parents:
                node = node[part]
            node[leaf] = value
        return merged


VALUE_SETS = (
    ValueSet("defaults"),
    ValueSet("one-replica", {"scheduler.replicas": 1}),
    ValueSet("agent-off", {"agent.enabled": False}),
    ValueSet(
        "every-switch-on",
        {
            "namespace.create": True,
            "metrics.service.enabled": True,
            "metrics.serviceMonitor.enabled": True,
            "metrics.serviceMonitor.labels": {"release": "prometheus"},
            "metrics.grafanaDashboard.enabled": True,
            "scheduler.podDisruptionBudget.enabled": True,
            "admissionPolicies.enabled": True,
            "agent.enabled": True,
            "defrag.enabled": True,
            "defrag.execute": True,
        },
    ),
    ValueSet("defrag-dry-run", {"defrag.enabled": True, "defrag.goals": ["free-gpu"], "defrag.namespace": "ml"}),
    ValueSet("admission-policies-off", {"admissionPolicies.enabled": False}),
    ValueSet("dra-allocation-off", {"dra.allocation.enabled": False}),
    ValueSet(
        "monitoring-and-pdb-off",
        {
            "metrics.service.enabled": False,
            "metrics.grafanaDashboard.enabled": False,
            "scheduler.podDisruptionBudget.enabled": False,
        },
    ),
    ValueSet(
        "own-registry-by-digest",
        {
            "image.registry": "registry.example.com:5000",
            "image.repository": "team/gpupack",
            "image.tag": "not-used",
            "image.digest": DIGEST,
            "imagePullSecrets": [{"name": "team-registry"}],
            "kubeScheduler.image.registry": "registry.example.com:5000",
            "kubeScheduler.image.repository": "mirror/kube-scheduler",
        },
    ),
    ValueSet("kube-scheduler-tag", {"kubeScheduler.image.tag": "v1.33.4"}),
    ValueSet("other-namespaces", {"agent.namespace": "gpu-agents"}, namespace="gpu-sched"),
)
LINTED = ("defaults", "every-switch-on", "agent-off", "other-namespaces")


def set_json(key: str, value: Any) -> list[str]:
    """`--set-json key=<value as JSON>`."""
    return ["--set-json", f"{key}={json.dumps(value)}"]


def by_name(name: str) -> ValueSet:
    """The value set called `name`."""
    (found,) = [value_set for value_set in VALUE_SETS if value_set.name == name]
    return found


def minor(version: str) -> str:
    """`v1.33` of `v1.33.13`."""
    return ".".join(version.split(".")[:2])


# ------------------------------------------------------------------ helm and kubectl


def helm_on(workdir: Path, kubeconfig: Path | None = None) -> Helm:
    """helm with its homes under `workdir`; the suite fails (skips only when allowed) without it."""
    try:
        return Helm(workdir, kubeconfig)
    except MissingBinary as exc:
        missing_program(exc)
        raise


def attempt(helm: Helm, *args: str) -> subprocess.CompletedProcess[str]:
    """Run helm as Helm does (its own homes, its kubeconfig) and hand back exit code and both outputs."""
    homes = {f"HELM_{kind}_HOME": str(helm.workdir / kind.lower()) for kind in ("CACHE", "CONFIG", "DATA")}
    argv = [str(helm.binary), *args]
    if helm.kubeconfig is not None:
        argv.append(f"--kubeconfig={helm.kubeconfig}")
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, **homes}, check=False)


def kubectl_on(plane: ControlPlane, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """kubectl (the suite's, deploy.kubectl) as the admin of `plane`."""
    argv = [str(kubectl()), f"--kubeconfig={plane.kubeconfig}", *args]
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120, check=False)


def ok(done: subprocess.CompletedProcess[str]) -> str:
    """stdout of a command that must succeed; its outputs in the failure otherwise."""
    assert done.returncode == 0, f"{' '.join(done.args[:4])} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def as_yaml(objects: Objects) -> str:
    """Objects as one multi-document YAML stream."""
    return yaml.safe_dump_all(objects, sort_keys=False)


def keys(objects: Objects) -> set[Key]:
    """(kind, name) of every object."""
    return {(o["kind"], o["metadata"]["name"]) for o in objects}


def find(objects: Objects, kind: str, name: str) -> dict[str, Any]:
    """The one object of `kind` called `name`."""
    (found,) = [o for o in objects if (o["kind"], o["metadata"]["name"]) == (kind, name)]
    return found


def resource(obj: Mapping[str, Any]) -> str:
    """The kind as kubectl takes it with its group: `deployment.apps`, `configmap`."""
    group = obj["apiVersion"].rpartition("/")[0]
    return f"{obj['kind'].lower()}.{group}" if group else obj["kind"].lower()


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """helm for what needs no cluster: lint and template."""
    return helm_on(tmp_path_factory.mktemp("helm"))


class Renders:
    """`helm template` of each value set for each Kubernetes version, rendered once."""

    def __init__(self, helm: Helm) -> None:
        self.helm = helm
        self._cache: dict[tuple[str, str], Objects] = {}

    def __call__(self, value_set: ValueSet, version: str) -> Objects:
        """The objects `value_set` renders for a cluster of `version`."""
        if (value_set.name, version) not in self._cache:
            text = self.helm("template", RELEASE, str(CHART), "--kube-version", version, *value_set.args())
            self._cache[value_set.name, version] = [doc for doc in yaml.safe_load_all(text) if doc]
        return copy.deepcopy(self._cache[value_set.name, version])


@pytest.fixture(scope="module")
def renders(helm: Helm) -> Renders:
    """The module's renders."""
    return Renders(helm)


@pytest.fixture(scope="module")
def plane(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    """The control plane of one version with a ServiceMonitor CRD, which the chart's ServiceMonitor needs."""
    ok(kubectl_on(control_plane, "apply", "-f", "-", stdin=yaml.safe_dump(service_monitor_crd())))
    ok(kubectl_on(control_plane, "wait", "--for=condition=Established", f"crd/{SERVICE_MONITOR_CRD}", "--timeout=60s"))
    try:
        yield control_plane
    finally:
        kubectl_on(control_plane, "delete", "crd", SERVICE_MONITOR_CRD, "--ignore-not-found", "--timeout=60s")


def service_monitor_crd() -> dict[str, Any]:
    """The least CustomResourceDefinition that serves monitoring.coreos.com/v1 ServiceMonitor (any content)."""
    names = {"kind": "ServiceMonitor", "listKind": "ServiceMonitorList", "plural": "servicemonitors"}
    version = {
        "name": "v1",
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": SERVICE_MONITOR_CRD},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {**names, "singular": "servicemonitor"},
            "versions": [version],
        },
    }


# ------------------------------------------------------------------ namespaces


def namespace_state(plane: ControlPlane, name: str) -> str:
    """`absent`, `terminating` or `active`."""
    try:
        namespace = plane.core().read_namespace(name)
    except ApiException as exc:
        if exc.status == 404:
            return "absent"
        raise
    return "terminating" if namespace.metadata.deletion_timestamp else "active"


def make_release_namespace(plane: ControlPlane, name: str) -> None:
    """The release namespace at the chart's Pod Security level, by kubectl apply (as a user would make it)."""
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": RESTRICTED}}
    ok(kubectl_on(plane, "apply", "-f", "-", stdin=yaml.safe_dump(body)))


def remove_namespace(plane: ControlPlane, name: str) -> None:
    """Delete an emptied namespace and finish its deletion as the namespace controller would.

    That controller (kube-controller-manager) does not run here, so a deleted namespace would stay
    Terminating for good; once it holds nothing, dropping its `kubernetes` finalizer and deleting it again
    is all that controller has left to do.
    """
    core = plane.core()
    if namespace_state(plane, name) == "absent":
        return
    core.delete_namespace(name)
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}, "spec": {"finalizers": []}}
    core.replace_namespace_finalize(name, body)
    try:
        core.delete_namespace(name)
    except ApiException as exc:
        if exc.status != 404:
            raise
    wait_until(f"namespace {name} to be gone", lambda: namespace_state(plane, name) == "absent", timeout=30)


# ------------------------------------------------------------------ 1. lint and manifests/


@pytest.mark.parametrize("version", CONTROL_PLANE_VERSIONS)
def test_the_chart_passes_helm_lint_strict(helm: Helm, version: str) -> None:
    for name in LINTED:
        output = helm("lint", "--strict", str(CHART), "--kube-version", version, *by_name(name).args())
        assert "1 chart(s) linted, 0 chart(s) failed" in output, output


def test_helm_lint_strict_fails_on_a_value_the_schema_refuses(helm: Helm) -> None:
    """The lint above is not vacuous: it checks the values against the schema.

    (helm lint reports a template's `fail` only as [INFO] and passes; the install cases below hold those.)
    """
    args = set_json("policy.weights.order", -1)
    done = attempt(helm, "lint", "--strict", str(CHART), "--kube-version", NEWEST, *args)
    assert done.returncode != 0 and "at '/policy/weights/order': minimum" in done.stdout, done.stdout


def test_manifests_are_what_the_chart_renders() -> None:
    outdated = stale(rendered_files())
    assert outdated == [], f"run make manifests: {[str(path) for path in outdated]} differ from the chart's render"


# ------------------------------------------------------------------ 2. the values matrix, rendered


def governed(values: Mapping[str, Any], namespace: str, version: str = NEWEST) -> list[tuple[bool, set[Key]]]:
    """Each switch: whether the values turn it on (for a cluster of `version`), and the objects it makes."""
    agent, admission = values["agent"]["enabled"], values["admissionPolicies"]["enabled"]
    dra = values["dra"]["allocation"]["enabled"]
    gate_served = int(minor(version).split(".")[1]) >= 36  # MutatingAdmissionPolicy v1
    metrics, scheduler = values["metrics"], values["scheduler"]
    budget = scheduler["podDisruptionBudget"]["enabled"] and scheduler["replicas"] > 1
    agent_objects = {
        (kind, "gpupack-agent") for kind in ("DaemonSet", "ServiceAccount", "ClusterRole", "ClusterRoleBinding")
    }
    defrag = values["defrag"]["enabled"]
    defrag_objects = {
        *((kind, "gpupack-defrag") for kind in ("Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding")),
        *((kind, "gpupack-defrag-leader-election") for kind in ("Role", "RoleBinding")),
    }
    return [
        (agent, {("Namespace", values["agent"]["namespace"]), *agent_objects}),
        (admission, {(kind, "gpupack-assignment-writer") for kind in ADMISSION_KINDS}),
        (agent and admission, {(kind, "gpupack-agent-own-node") for kind in ADMISSION_KINDS}),
        (dra and gate_served, {(kind, "gpupack-dra-gate") for kind in MUTATING_KINDS}),
        (dra and admission, {(kind, "gpupack-gate-remover") for kind in ADMISSION_KINDS}),
        (defrag, defrag_objects),
        (admission, {(kind, "gpupack-defrag-hold-writer") for kind in ADMISSION_KINDS}),
        (defrag and admission, {(kind, "gpupack-defrag-hold-only") for kind in ADMISSION_KINDS}),
        (metrics["service"]["enabled"], {("Service", "gpupack-metrics")}),
        (metrics["serviceMonitor"]["enabled"], {("ServiceMonitor", "gpupack")}),
        (metrics["grafanaDashboard"]["enabled"], {("ConfigMap", "gpupack-grafana-dashboard")}),
        (budget, {("PodDisruptionBudget", "gpupack-scheduler")}),
        (values["namespace"]["create"], {("Namespace", namespace)}),
    ]


def images(objects: Objects) -> dict[str, str]:
    """Container name -> image, of the Deployment's and the DaemonSet's pods."""
    workloads = [o for o in objects if o["kind"] in ("Deployment", "DaemonSet")]
    return {c["name"]: c["image"] for o in workloads for c in o["spec"]["template"]["spec"]["containers"]}


def image_ref(image: Mapping[str, str], default_tag: str) -> str:
    """registry/repository@digest, else registry/repository:tag (the tag defaulting to `default_tag`)."""
    name = "/".join(part for part in (image["registry"], image["repository"]) if part)
    return f"{name}@{image['digest']}" if image["digest"] else f"{name}:{image['tag'] or default_tag}"


def scheduler_config(objects: Objects) -> dict[str, Any]:
    """The KubeSchedulerConfiguration the chart's ConfigMap holds."""
    return dict(yaml.safe_load(find(objects, "ConfigMap", "gpupack-scheduler-config")["data"]["config.yaml"]))


def check_switches(objects: Objects, values: Mapping[str, Any], namespace: str, version: str) -> None:
    """Exactly the objects of the switches that are on, and those of no switch."""
    rendered = keys(objects)
    expected = set(ALWAYS)
    for on, made in governed(values, namespace, version):
        if on:
            expected |= made
        else:
            assert not made & rendered, f"switched off, yet rendered: {sorted(made & rendered)}"
    assert rendered == expected


def check_images(objects: Objects, values: Mapping[str, Any], version: str) -> None:
    """The gpupack image of the values; kube-scheduler of the cluster's version unless a tag is set."""
    found = images(objects)
    gpupack = image_ref(values["image"], APP_VERSION)
    wanted = {
        "gpupack": gpupack,
        "metrics": gpupack,
        "kube-scheduler": image_ref(values["kubeScheduler"]["image"], version),
    }
    if values["agent"]["enabled"]:
        wanted["agent"] = gpupack
    if values["defrag"]["enabled"]:
        wanted["defrag"] = gpupack
    assert found == wanted
    tag = found["kube-scheduler"].rsplit(":", 1)[1]
    override = values["kubeScheduler"]["image"]["tag"]
    assert tag == override if override else minor(tag) == minor(version)
    workloads = [o for o in objects if o["kind"] in ("Deployment", "DaemonSet")]
    assert all(
        o["spec"]["template"]["spec"].get("imagePullSecrets", []) == values["imagePullSecrets"] for o in workloads
    )


def check_namespaces(objects: Objects, values: Mapping[str, Any], namespace: str) -> None:
    """Namespaced objects in the release's or the agent's namespace (one RoleBinding in kube-system)."""
    agent_namespace = values["agent"]["namespace"]
    placed = {(o["kind"], o["metadata"]["name"]): o["metadata"].get("namespace") for o in objects}
    for (kind, name), where in placed.items():
        if kind in ("Namespace",) or kind.startswith(("Cluster", "ValidatingAdmission", "MutatingAdmission")):
            assert where is None, (kind, name)
        elif name == "gpupack-scheduler-extension-apiserver-authentication-reader":
            assert where == "kube-system"
        else:
            assert where == (agent_namespace if name == "gpupack-agent" else namespace), (kind, name, where)
    bindings = [o for o in objects if o["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    for binding in bindings:
        (subject,) = binding["subjects"]
        wanted = agent_namespace if subject["name"] == "gpupack-agent" else namespace
        assert subject["namespace"] == wanted, binding["metadata"]["name"]
    assert scheduler_config(objects)["leaderElection"]["resourceNamespace"] == namespace


def check_admission_policies(objects: Objects, values: Mapping[str, Any], namespace: str) -> None:
    """The policies exempt the release's scheduler ServiceAccount and hold the agent's, by namespace."""
    policies = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"}
    if "gpupack-assignment-writer" in policies:
        writer = policies["gpupack-assignment-writer"]["spec"]
        (condition,) = writer["matchConditions"]
        scheduler = f"system:serviceaccount:{namespace}:gpupack-scheduler"
        assert condition["expression"] == f"request.userInfo.username != '{scheduler}'"
        assert f"ServiceAccount {namespace}/gpupack-scheduler" in writer["validations"][0]["message"]
    if "gpupack-agent-own-node" in policies:
        (condition,) = policies["gpupack-agent-own-node"]["spec"]["matchConditions"]
        agent = f"system:serviceaccount:{values['agent']['namespace']}:gpupack-agent"
        assert condition["expression"] == f"request.userInfo.username == '{agent}'"
    defrag_user = f"system:serviceaccount:{namespace}:gpupack-defrag"
    if "gpupack-defrag-hold-writer" in policies:
        (condition,) = policies["gpupack-defrag-hold-writer"]["spec"]["matchConditions"]
        assert f"request.userInfo.username != '{defrag_user}'" in condition["expression"]
    if "gpupack-defrag-hold-only" in policies:
        (condition,) = policies["gpupack-defrag-hold-only"]["spec"]["matchConditions"]
        assert condition["expression"] == f"request.userInfo.username == '{defrag_user}'"
    for binding in (o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"):
        assert binding["spec"]["policyName"] in policies and binding["spec"]["validationActions"] == ["Deny"]


@pytest.mark.parametrize("version", CONTROL_PLANE_VERSIONS)
@pytest.mark.parametrize("value_set", VALUE_SETS, ids=lambda value_set: value_set.name)
def test_each_value_set_renders_what_its_values_say(renders: Renders, value_set: ValueSet, version: str) -> None:
    objects = renders(value_set, version)
    values = value_set.effective()
    check_switches(objects, values, value_set.namespace, version)
    check_images(objects, values, version)
    check_namespaces(objects, values, value_set.namespace)
    check_admission_policies(objects, values, value_set.namespace)
    check_defrag_arguments(objects, values)
    config = scheduler_config(objects)
    assert (config["apiVersion"], config["kind"]) == ("kubescheduler.config.k8s.io/v1", "KubeSchedulerConfiguration")
    assert all(o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpupack" for o in objects)


def check_defrag_arguments(objects: Objects, values: Mapping[str, Any]) -> None:
    """The loop's arguments say what its values say: a dry run unless execute, its goals and namespace."""
    if not values["defrag"]["enabled"]:
        return
    (container,) = find(objects, "Deployment", "gpupack-defrag")["spec"]["template"]["spec"]["containers"]
    args, defrag = container["args"], values["defrag"]
    assert args[:2] == ["defrag", "--loop"]
    assert ("--execute" in args) == defrag["execute"]
    assert [a.removeprefix("--goal=") for a in args if a.startswith("--goal=")] == defrag["goals"]
    assert (f"--namespace={defrag['namespace']}" in args) == bool(defrag["namespace"])
    assert f"--window-evictions={defrag['window']['evictions']}" in args


def test_the_matrix_turns_every_switch_both_ways(renders: Renders) -> None:
    """Each switch is off in some value set and on in another, so the checks above see both sides."""
    seen = [[on for on, _ in governed(v.effective(), v.namespace)] for v in VALUE_SETS]
    assert all(any(column) and not all(column) for column in zip(*seen, strict=True))


# ------------------------------------------------------------------ 2. the values matrix, on the API server


def dry_run(plane: ControlPlane, objects: Objects) -> list[str]:
    """`kubectl apply --dry-run=server` of `objects`: the names the API server accepted; no warning allowed."""
    done = kubectl_on(plane, "apply", "--dry-run=server", "-o", "name", "-f", "-", stdin=as_yaml(objects))
    assert done.returncode == 0 and done.stderr == "", f"refused or warned:\n{done.stdout}\n{done.stderr}"
    return done.stdout.split()


@pytest.mark.parametrize("value_set", VALUE_SETS, ids=lambda value_set: value_set.name)
def test_each_value_set_passes_a_server_side_dry_run(
    plane: ControlPlane, renders: Renders, value_set: ValueSet
) -> None:
    objects = renders(value_set, plane.version)
    values = value_set.effective()
    make_release_namespace(plane, value_set.namespace)
    namespaces = [o for o in objects if o["kind"] == "Namespace"]
    new = [o for o in namespaces if namespace_state(plane, o["metadata"]["name"]) == "absent"]
    agent_namespace = [values["agent"]["namespace"]] if values["agent"]["enabled"] else []
    assert [o["metadata"]["name"] for o in new] == agent_namespace
    try:
        if new:
            assert dry_run(plane, new) == [f"namespace/{o['metadata']['name']}" for o in new]
            ok(kubectl_on(plane, "apply", "-f", "-", stdin=as_yaml(new)))
        accepted = dry_run(plane, objects)
        assert sorted(accepted) == sorted(f"{resource(o)}/{o['metadata']['name']}" for o in objects)
    finally:
        for namespace in new:
            remove_namespace(plane, namespace["metadata"]["name"])


# ------------------------------------------------------------------ 3. install and uninstall


AGENT_NAMESPACE = str(DEFAULTS["agent"]["namespace"])


@dataclass
class Installed:
    """The default values installed by helm on one control plane."""

    plane: ControlPlane
    helm: Helm
    before: set[tuple[str, str]]  # what other cases on this shared plane left labelled as gpupack's
    uninstalled: bool = False


def labelled(plane: ControlPlane, renders: Renders) -> list[tuple[str, str, bool]]:
    # other modules on the session's plane apply the rendered manifests under their own names and leave
    # them: the cases compare with what was there before they acted
    """(kind, name, being deleted) of every object labelled as gpupack's, of every kind the chart makes."""
    kinds = sorted({resource(o) for o in renders(by_name("every-switch-on"), plane.version)})
    listed = ok(kubectl_on(plane, "get", ",".join(kinds), "--all-namespaces", "-l", PART_OF, "-o", "json"))
    items = json.loads(listed)["items"]
    return [(i["kind"], i["metadata"]["name"], "deletionTimestamp" in i["metadata"]) for i in items]


def releases(helm: Helm) -> list[Any]:
    """Every release in every namespace, whatever its state (`helm list --all`)."""
    return list(json.loads(ok(attempt(helm, "list", "--all", "--all-namespaces", "--output", "json"))))


def release_secrets(plane: ControlPlane) -> list[str]:
    """The Secrets helm keeps its releases in, in every namespace."""
    args = ("get", "secrets", "--all-namespaces", "--field-selector", "type=helm.sh/release.v1", "-o", "name")
    return ok(kubectl_on(plane, *args)).split()


def apps(plane: ControlPlane) -> Any:
    """`kubernetes.client.AppsV1Api` on the admin client."""
    from kubernetes import client

    return client.AppsV1Api(plane.api_client())


@pytest.fixture(scope="module")
def installed(plane: ControlPlane, renders: Renders, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """`helm install` of the default values as the README says it; uninstalled afterwards if a case did not."""
    helm = helm_on(tmp_path_factory.mktemp("helm-install"), plane.kubeconfig)
    assert namespace_state(plane, AGENT_NAMESPACE) == "absent"
    before = {(kind, name) for kind, name, _ in labelled(plane, renders)}
    # no --kube-version: helm asks the API server which version it is
    helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace")
    release = Installed(plane, helm, before)
    try:
        yield release
    finally:
        if not release.uninstalled:
            attempt(helm, "uninstall", RELEASE, "--namespace", NAMESPACE)
        remove_namespace(plane, AGENT_NAMESPACE)


def test_the_default_values_deploy_a_kube_scheduler_of_the_clusters_minor(
    installed: Installed, renders: Renders
) -> None:
    plane = installed.plane
    deployment = apps(plane).read_namespaced_deployment("gpupack-scheduler", NAMESPACE)
    (image,) = [c.image for c in deployment.spec.template.spec.containers if c.name == "kube-scheduler"]
    assert image == f"registry.k8s.io/kube-scheduler:{plane.version}"
    assert minor(image.rsplit(":", 1)[1]) == minor(plane.version)
    config_map = plane.core().read_namespaced_config_map("gpupack-scheduler-config", NAMESPACE)
    config = yaml.safe_load(config_map.data["config.yaml"])
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["profiles"] == [{"schedulerName": "gpupack"}]
    # what helm made from the cluster's answer is the render for this version, object for object
    manifest = [doc for doc in yaml.safe_load_all(installed.helm("get", "manifest", RELEASE, "-n", NAMESPACE)) if doc]
    assert manifest == renders(by_name("defaults"), plane.version)
    assert [(r["name"], r["status"]) for r in releases(installed.helm)] == [(RELEASE, "deployed")]
    assert release_secrets(plane) == [f"secret/sh.helm.release.v1.{RELEASE}.v1"]


def test_helm_uninstall_leaves_no_object_of_the_chart(installed: Installed, renders: Renders) -> None:
    plane = installed.plane
    kinds = {kind for kind, _, _ in labelled(plane, renders)}
    made = {"Deployment", "DaemonSet", "Namespace", "ClusterRole", "ClusterRoleBinding", *ADMISSION_KINDS}
    assert kinds >= made, "the check below would be vacuous"
    # no --wait: the agent's namespace stays Terminating on a plane without the namespace controller
    ok(attempt(installed.helm, "uninstall", RELEASE, "--namespace", NAMESPACE))
    installed.uninstalled = True
    try:
        left = {
            (kind, name) for kind, name, deleting in labelled(plane, renders) if not (kind == "Namespace" and deleting)
        }
        assert left - installed.before == set()
        assert namespace_state(plane, AGENT_NAMESPACE) in ("absent", "terminating")
        assert releases(installed.helm) == [] and release_secrets(plane) == []
    finally:
        remove_namespace(plane, AGENT_NAMESPACE)  # the namespace controller's part, for the cases after this one


# ------------------------------------------------------------------ 4. refused values


REFUSED_NAMESPACE = "gpupack-refused"
REFUSED = (
    pytest.param(
        ["--set", "policy.weights.fragmentation=-1"],
        ["at '/policy/weights/fragmentation'", "minimum: got -1, want 0"],
        id="negative-weight",
    ),
    pytest.param(
        ["--set", "policy.spot.nonInterruptibleOnSpot=sometimes"],
        ["at '/policy/spot/nonInterruptibleOnSpot'", "value must be one of 'avoid', 'forbid'"],
        id="unknown-spot-rule",
    ),
    pytest.param(
        ["--set", "policy.weight.packing=1"],
        ["at '/policy'", "additional properties 'weight' not allowed"],
        id="unknown-key",
    ),
    pytest.param(
        ["--set", "scheduler.replicas=2", "--set", "scheduler.leaderElection=false"],
        ["scheduler.replicas above 1 needs scheduler.leaderElection: true"],
        id="two-replicas-without-leader-election",
    ),
)


@pytest.mark.parametrize(("args", "messages"), REFUSED)
def test_a_wrong_value_fails_helm_install_before_anything_is_created(
    plane: ControlPlane, renders: Renders, tmp_path: Path, args: list[str], messages: list[str]
) -> None:
    helm = helm_on(tmp_path, plane.kubeconfig)
    namespaces = (REFUSED_NAMESPACE, AGENT_NAMESPACE)
    assert [namespace_state(plane, name) for name in namespaces] == ["absent", "absent"]
    before = labelled(plane, renders)
    argv = ["install", RELEASE, str(CHART), "--namespace", REFUSED_NAMESPACE, "--create-namespace", *args]
    done = attempt(helm, *argv)
    assert done.returncode != 0
    assert all(message in done.stderr for message in messages), done.stderr
    assert releases(helm) == [] and release_secrets(plane) == []
    assert labelled(plane, renders) == before
    assert [namespace_state(plane, name) for name in namespaces] == ["absent", "absent"]


# ------------------------------------------------------------------ 5. the policy and gpupack's settings


@pytest.fixture
def file_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPUPACK_* variable: the environment outranks the config file in gpupack's settings."""
    for name in [name for name in os.environ if name.startswith("GPUPACK_")]:
        monkeypatch.delenv(name)


def policy_yaml(helm: Helm, *args: str) -> subprocess.CompletedProcess[str]:
    """`helm template` of the policy ConfigMap alone (exit code and outputs)."""
    show = ("--show-only", "templates/policy-config.yaml")
    return attempt(helm, "template", RELEASE, str(CHART), "--kube-version", NEWEST, *show, *args)


def load_policy(rendered: str, folder: Path) -> Settings:
    """gpupack's settings from the policy.yaml of the rendered ConfigMap, as `gpupack serve --config` loads it."""
    path = folder / "policy.yaml"
    path.write_text(yaml.safe_load(rendered)["data"]["policy.yaml"])
    return load_settings(path)


def test_the_default_policy_is_gpupacks_default_settings(helm: Helm, tmp_path: Path, file_alone: None) -> None:
    loaded, defaults = load_policy(ok(policy_yaml(helm)), tmp_path), load_settings()
    assert loaded.model_dump(exclude={"prices"}) == defaults.model_dump(exclude={"prices"})
    prices = DEFAULTS["policy"]["prices"]
    assert len(loaded.prices) == len(prices)
    assert loaded.price_table() == {(row["instanceType"], row["capacityType"]): row["hourly"] for row in prices}


def test_changed_policy_values_reach_gpupacks_settings(helm: Helm, tmp_path: Path, file_alone: None) -> None:
    args = [*set_json("policy.weights.packing", 0.1), "--set", "policy.spot.nonInterruptibleOnSpot=forbid"]
    args += ["--set", "policy.reservationTTLSeconds=12"]
    loaded, expected = load_policy(ok(policy_yaml(helm, *args)), tmp_path).model_dump(), load_settings().model_dump()
    assert loaded != expected
    expected["policy"]["weights"]["packing"] = 0.1
    expected["spot"]["non_interruptible_on_spot"] = "forbid"
    expected["reservation_ttl_seconds"] = 12
    assert {**loaded, "prices": None} == {**expected, "prices": None}


@dataclass(frozen=True)
class Bound:
    """One bound of the schema on a value under `policy` (a list's items at index 0)."""

    path: tuple[str | int, ...]
    keyword: str  # minimum, exclusiveMinimum, maximum, minLength or enum
    limit: Any
    integer: bool

    def __str__(self) -> str:
        return f"{'.'.join(map(str, self.path))}:{self.keyword}"

    def outside(self) -> Any:
        """A value just outside the bound."""
        step = 1 if self.integer else 0.001
        return {
            "minimum": lambda: self.limit - step,
            "exclusiveMinimum": lambda: self.limit,
            "maximum": lambda: self.limit + step,
            "minLength": lambda: "x" * (self.limit - 1),
            "enum": lambda: "sometimes",
        }[self.keyword]()

    def inside(self) -> list[Any]:
        """The values at the edge of the bound, inside it."""
        step = 1 if self.integer else 0.001
        return {
            "minimum": lambda: [self.limit],
            "exclusiveMinimum": lambda: [self.limit + step],
            "maximum": lambda: [self.limit],
            "minLength": lambda: ["x" * self.limit],
            "enum": lambda: list(self.limit),
        }[self.keyword]()


KEYWORDS = {"minimum": "minimum", "exclusiveMinimum": "exclusiveMinimum", "maximum": "maximum",
            "minLength": "minLength", "enum": "value must be one of"}  # fmt: skip
# Bounds of the chart that the settings model does not have, each with why it belongs to the chart alone.
CHART_ONLY = {
    "policy.limits.verbTimeoutSeconds:maximum": "the chart's kube-scheduler gives up on the extender after httpTimeout",
}


def bounds(schema: Mapping[str, Any], path: tuple[str | int, ...]) -> Iterator[Bound]:
    """Every bound in `schema` (the part of values.schema.json at `path`) and below it."""
    for keyword in KEYWORDS:
        if keyword in schema:
            yield Bound(path, keyword, schema[keyword], schema.get("type") == "integer")
    for name, sub in schema.get("properties", {}).items():
        yield from bounds(sub, (*path, name))
    if "items" in schema:
        yield from bounds(schema["items"], (*path, 0))


POLICY_BOUNDS = tuple(bounds(SCHEMA["properties"]["policy"], ("policy",)))


def policy_with(path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """The default policy values with `value` at `path`; a list is cut to the one item the path names."""
    policy = copy.deepcopy(DEFAULTS)
    node: Any = policy
    for part in path[:-1]:
        if isinstance(part, int):
            node[:] = [node[part]]
            part = 0
        node = node[part]
    node[path[-1]] = value
    return dict(policy["policy"])


def seconds(duration: str) -> float:
    """`5s` -> 5.0."""
    assert duration.endswith("s") and duration[:-1].replace(".", "").isdigit(), duration
    return float(duration[:-1])


@pytest.mark.parametrize("bound", POLICY_BOUNDS, ids=str)
def test_the_schema_and_gpupacks_settings_share_each_policy_bound(
    helm: Helm, renders: Renders, tmp_path: Path, file_alone: None, bound: Bound
) -> None:
    outside = set_json("policy", policy_with(bound.path, bound.outside()))
    refused = policy_yaml(helm, *outside)
    where = "/".join(map(str, bound.path))
    assert refused.returncode != 0 and f"at '/{where}': {KEYWORDS[bound.keyword]}" in refused.stderr, refused.stderr
    unchecked = ok(policy_yaml(helm, "--skip-schema-validation", *outside))
    if str(bound) in CHART_ONLY:
        load_policy(unchecked, tmp_path)  # the model has no such bound: the chart's reason must still hold
        extender = scheduler_config(renders(by_name("defaults"), NEWEST))["extenders"][0]
        assert bound.limit == seconds(extender["httpTimeout"])
    else:
        name = str(bound.path[-1])
        with pytest.raises(SettingsError, match=name):  # each chart key is the settings' own name
            load_policy(unchecked, tmp_path)
    for value in bound.inside():
        load_policy(ok(policy_yaml(helm, *set_json("policy", policy_with(bound.path, value)))), tmp_path)


def test_the_bounds_cover_every_weight_and_limit() -> None:
    """The case above is not vacuous: every weight has its bound, every limit its lower one."""
    found = {(bound.path[1:], bound.keyword) for bound in POLICY_BOUNDS}
    for weight in DEFAULTS["policy"]["weights"]:
        assert (("weights", weight), "minimum") in found
    for limit in DEFAULTS["policy"]["limits"]:
        assert {(("limits", limit), "minimum"), (("limits", limit), "exclusiveMinimum")} & found, limit
