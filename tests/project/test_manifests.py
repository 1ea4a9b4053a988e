"""Offline checks of manifests/: Kubernetes schemas, the scheduler config, RBAC and the example cluster.

Every Kubernetes object is validated with kubernetes-validate against the pinned Kubernetes version
(strict: unknown fields are errors). The KubeSchedulerConfiguration and gpupack's policy config live
inside ConfigMaps and are not API objects; their structure is checked here by hand.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpupack.scoring.geometry import FAMILIES, MAX_FIT, SHAPES, slice_bits

K8S_VERSION = "1.37"  # the newest supported minor (manifests/kubernetes-versions)
ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
EXAMPLES = MANIFESTS / "examples"
CLUSTER_FILE = EXAMPLES / "cluster.yaml"
NAMESPACE = "gpupack-system"
AGENT_NAMESPACE = "gpupack-agent"
AGENT_FILES = tuple(f"agent/{path.name}#" for path in (MANIFESTS / "agent").glob("*.yaml"))
SERVICE_ACCOUNT = "gpupack-scheduler"
IMAGE_NAME = "ghcr.io/gpupack/gpupack"  # as the chart names it; manifests/kustomization.yaml's images set it
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

GANG_GROUPS = ("scheduling.x-k8s.io", "scheduling.volcano.sh")  # the API groups of the PodGroups gangs read
# The gpupack sidecar's ClusterRole, exactly: (API group, resource, verb).
EXTENDER_RULES = {  # what kube/sources/kube_api.py calls (tests/extender/test_rbac_usage.py derives it)
    *{("", "nodes", verb) for verb in ("list", "watch")},
    *{("", "pods", verb) for verb in ("list", "watch")},
    ("", "pods/binding", "create"),
    *{("events.k8s.io", "events", verb) for verb in ("create", "patch")},
    *{("policy", "poddisruptionbudgets", verb) for verb in ("list", "watch")},  # preemption's victims (#28)
    *{(group, "podgroups", verb) for group in GANG_GROUPS for verb in ("list", "watch")},  # gangs' sizes (#29)
    *{  # the DRA inventory (#30)
        ("resource.k8s.io", kind, verb)
        for kind in ("resourceslices", "resourceclaims", "deviceclasses")
        for verb in ("list", "watch")
    },
    ("resource.k8s.io", "resourceclaims", "get"),  # DRA's device chooser (#30 item 2, dra.allocation.enabled)
    ("resource.k8s.io", "resourceclaims", "update"),
    ("resource.k8s.io", "resourceclaims/status", "update"),
    ("resource.k8s.io", "resourceclaims/binding", "update"),
    ("", "pods", "patch"),  # the DRA gate removed (admission.yaml's gpupack-gate-remover allows nothing else)
}


# --- loading -----------------------------------------------------------------------------------


def _docs(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


COMPONENT_FOLDERS = ("agent",)  # kustomizations of their own, listed by folder (the node agent's DaemonSet)
FILE_FOLDERS = ("grafana",)  # folders whose files kustomization.yaml lists one by one
# what a user adds (the DRA gate, Kubernetes 1.36+; the defrag loop, off by default): not in `apply -k manifests/`
OPTIONAL_FOLDERS = ("dra", "defrag")


def _manifest_files() -> list[Path]:
    """The files `kubectl apply -k manifests/` applies (everything but kustomizations and examples)."""
    folders = [MANIFESTS, *(MANIFESTS / name for name in (*COMPONENT_FOLDERS, *FILE_FOLDERS))]
    return sorted(
        p
        for folder in folders
        for p in folder.glob("*.yaml")
        if p.name not in ("kustomization.yaml", "kustomization.yml")
    )


def _example_files() -> list[Path]:
    return sorted(EXAMPLES.glob("*.yaml"))


def _objects(files: list[Path]) -> list[tuple[str, dict[str, Any]]]:
    """(id, object) for every object in `files`, with `kind: List` flattened."""
    out = []
    for path in files:
        for i, doc in enumerate(_docs(path)):
            items = doc["items"] if doc.get("kind") == "List" else [doc]
            for j, obj in enumerate(items):
                name = (obj.get("metadata") or {}).get("name", "?")
                suffix = f"{i}.{j}" if doc.get("kind") == "List" else f"{i}"
                out.append((f"{path.relative_to(MANIFESTS)}#{suffix}:{obj.get('kind')}/{name}", obj))
    return out


ALL_OBJECTS = _objects(_manifest_files()) + _objects(_example_files())
# Custom resources kubernetes-validate has no schema for: tests/report/test_monitoring.py checks their fields
CUSTOM_RESOURCES = {("monitoring.coreos.com/v1", "ServiceMonitor")}
SCHEMA_OBJECTS = [(i, obj) for i, obj in ALL_OBJECTS if (obj["apiVersion"], obj["kind"]) not in CUSTOM_RESOURCES]


def _find(kind: str, name: str) -> dict[str, Any]:
    matches = [obj for _, obj in _objects(_manifest_files()) if obj["kind"] == kind and obj["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name} in manifests/, found {len(matches)}"
    return matches[0]


def _of_kind(kind: str) -> list[dict[str, Any]]:
    """The scheduler's objects of one kind (the agent's folder has its own tests: tests/agent/)."""
    scheduler_files = [p for p in _manifest_files() if p.parent == MANIFESTS]
    return [obj for _, obj in _objects(scheduler_files) if obj["kind"] == kind]


def _scheduler_config() -> dict[str, Any]:
    return yaml.safe_load(_find("ConfigMap", "gpupack-scheduler-config")["data"]["config.yaml"])


def _policy_config() -> dict[str, Any]:
    return yaml.safe_load(_find("ConfigMap", "gpupack-policy")["data"]["policy.yaml"])


def _deployment() -> dict[str, Any]:
    return _find("Deployment", "gpupack-scheduler")


def _container(name: str) -> dict[str, Any]:
    (container,) = [c for c in _deployment()["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return container


def _cluster() -> dict[str, Any]:
    (doc,) = _docs(CLUSTER_FILE)
    return doc


def _cluster_nodes() -> list[dict[str, Any]]:
    return [obj for obj in _cluster()["items"] if obj["kind"] == "Node"]


def _cluster_pods() -> list[dict[str, Any]]:
    return [obj for obj in _cluster()["items"] if obj["kind"] == "Pod"]


def expected_mig_profiles() -> set[str]:
    """Every MIG profile name the code knows, plus the media-extension variants as resource names spell
    them (docs/contracts.md#mig-geometry): the smallest 1g profile of each family and A30's 2g.12gb."""
    names: set[str] = set()
    for family in FAMILIES.values():
        names.update(family.profiles)
        smallest_1g = min(
            (p for p, sid in family.profiles.items() if SHAPES[sid].compute == 1),
            key=lambda p: SHAPES[family.profiles[p]].size,
        )
        names.add(f"{smallest_1g}.me")
    names.add("2g.12gb.me")
    return names


def _me_profiles(family_name: str) -> set[str]:
    family = FAMILIES[family_name]
    return {p for p in expected_mig_profiles() if p.endswith(".me") and p.removesuffix(".me") in family.profiles}


def _family_of(product: str):
    from gpupack.scoring.gpu_models import lookup_model

    return lookup_model(product).mig_family


# --- Kubernetes schemas ------------------------------------------------------------------------


def test_pinned_kubernetes_version_has_schemas() -> None:
    obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}
    assert kubernetes_validate.validate(obj, K8S_VERSION, strict=True) == K8S_VERSION


def test_strict_validation_rejects_unknown_fields() -> None:
    """Guard against a vacuous schema check: a misspelt field must fail."""
    obj = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "x", "nmespace": "y"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize(("obj_id", "obj"), SCHEMA_OBJECTS, ids=[i for i, _ in SCHEMA_OBJECTS])
def test_every_object_validates_against_kubernetes_schema(obj_id: str, obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_only_the_known_custom_resources_skip_the_schemas() -> None:
    skipped = [i for i, obj in ALL_OBJECTS if (obj["apiVersion"], obj["kind"]) in CUSTOM_RESOURCES]
    assert skipped == []  # `kubectl apply -k manifests/` must work on a cluster without any CRD


def test_the_service_monitor_is_kept_apart_and_valid_in_shape() -> None:
    (monitor,) = _docs(MANIFESTS / "prometheus-operator" / "servicemonitor.yaml")
    assert (monitor["apiVersion"], monitor["kind"]) in CUSTOM_RESOURCES
    assert monitor["metadata"]["namespace"] == NAMESPACE
    (kustomization,) = _docs(MANIFESTS / "prometheus-operator" / "kustomization.yaml")
    assert kustomization["resources"] == ["servicemonitor.yaml"]


def test_the_defrag_loop_is_kept_apart_as_a_dry_run_of_the_same_image() -> None:
    folder = MANIFESTS / "defrag"
    (kustomization,) = _docs(folder / "kustomization.yaml")
    files = sorted(p.name for p in folder.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(kustomization["resources"]) == files
    assert kustomization["images"] == [{"name": IMAGE_NAME, "newName": IMAGE_NAME, "newTag": VERSION}]
    (deployment,) = [d for d in _docs(folder / "deployment.yaml") if d["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["defrag", "--loop"] and "--execute" not in args


def test_cluster_file_is_a_v1_list() -> None:
    doc = _cluster()
    assert doc["apiVersion"] == "v1"
    assert doc["kind"] == "List"
    assert isinstance(doc["items"], list)
    assert {obj["kind"] for obj in doc["items"]} == {"Node", "Pod"}


def test_namespaced_objects_live_in_gpupack_system() -> None:
    """Everything but the node agent, which has a namespace of its own that admits privileged pods."""
    cluster_scoped = {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    for obj_id, obj in _objects(_manifest_files()):
        if obj_id.startswith(AGENT_FILES):
            assert obj["kind"] in cluster_scoped or obj["metadata"]["namespace"] == AGENT_NAMESPACE, obj_id
        elif obj["kind"] in cluster_scoped:
            assert "namespace" not in obj["metadata"], obj_id
        elif (obj["kind"], obj["metadata"]["name"]) == (
            "RoleBinding",
            "gpupack-scheduler-extension-apiserver-authentication-reader",
        ):
            assert obj["metadata"]["namespace"] == "kube-system"
        else:
            assert obj["metadata"]["namespace"] == NAMESPACE, obj_id


# --- kustomization -----------------------------------------------------------------------------


def test_kustomization_lists_every_manifest_and_no_example() -> None:
    (kustomization,) = _docs(MANIFESTS / "kustomization.yaml")
    assert kustomization["kind"] == "Kustomization"
    resources = kustomization["resources"]
    assert len(resources) == len(set(resources))
    listed = [
        str(p.relative_to(MANIFESTS))
        for p in _manifest_files()
        if p.parent.name not in (*COMPONENT_FOLDERS, *OPTIONAL_FOLDERS)
    ]
    assert sorted(resources) == sorted([*listed, *COMPONENT_FOLDERS])
    assert not any(r.startswith("examples") for r in resources)
    assert "namespace" not in kustomization, "a kustomize namespace would move the kube-system RoleBinding"


def _images(objects: list[dict[str, Any]]) -> list[str]:
    """The image of every container and init container of `objects`' pod templates."""
    pods = [obj["spec"]["template"]["spec"] for obj in objects if obj["kind"] in ("Deployment", "DaemonSet")]
    return [c["image"] for pod in pods for c in pod["containers"] + pod.get("initContainers", [])]


def test_the_gpupack_image_is_one_kustomize_setting() -> None:
    """#27: registry and tag were written out in three containers; now the chart renders them from its one
    image value, and manifests/kustomization.yaml's `images` sets both for all three, at the project's version."""
    gpupack = [i for i in _images([obj for _, obj in _objects(_manifest_files())]) if "kube-scheduler" not in i]
    assert gpupack == [f"{IMAGE_NAME}:{VERSION}"] * 3  # the sidecar, the metrics proxy, the node agent
    (kustomization,) = _docs(MANIFESTS / "kustomization.yaml")
    assert kustomization["images"] == [{"name": IMAGE_NAME, "newName": IMAGE_NAME, "newTag": VERSION}]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_the_rendered_manifests_run_the_gpupack_image_at_the_project_version() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    images = _images(_rendered())
    assert sorted(i for i in images if "kube-scheduler" not in i) == [f"{IMAGE_NAME}:{version}"] * 3


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_the_default_render_needs_no_custom_resource_definition() -> None:
    """#27: `kubectl apply -k manifests/` must work on a cluster without the Prometheus Operator or any
    other CRD: every rendered kind is a built-in one kubernetes-validate has a schema for."""
    for obj in _rendered():
        group = obj["apiVersion"].rpartition("/")[0]  # "" for the core group
        assert "." not in group or group.endswith(".k8s.io"), f"{obj['kind']} of {group}: a CRD's"
        assert (obj["apiVersion"], obj["kind"]) not in CUSTOM_RESOURCES
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def _rendered() -> list[dict[str, Any]]:
    """`kubectl kustomize manifests/`, as objects."""
    out = subprocess.run(
        ["kubectl", "kustomize", str(MANIFESTS)], check=True, capture_output=True, text=True, timeout=60
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_kustomize_build_renders_every_object() -> None:
    rendered = _rendered()
    assert len(rendered) == len(_objects(_manifest_files()))
    for obj in rendered:
        if (obj["apiVersion"], obj["kind"]) not in CUSTOM_RESOURCES:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


# --- KubeSchedulerConfiguration ----------------------------------------------------------------


def test_scheduler_config_structure() -> None:
    config = _scheduler_config()
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert config["leaderElection"]["leaderElect"] is True
    assert config["leaderElection"]["resourceNamespace"] == NAMESPACE
    assert config["leaderElection"]["resourceName"] == "gpupack-scheduler"
    assert config.get("leaderElection", {}).get("resourceLock", "leases") == "leases"
    assert config["percentageOfNodesToScore"] == 100
    assert [p["schedulerName"] for p in config["profiles"]] == ["gpupack"]
    (extender,) = config["extenders"]
    assert extender["urlPrefix"] == "http://127.0.0.1:8888"
    assert extender["filterVerb"] == "filter"
    assert extender["prioritizeVerb"] == "prioritize"
    assert extender["bindVerb"] == "bind"
    assert extender["weight"] == 1
    assert extender["enableHTTPS"] is False
    assert extender["nodeCacheCapable"] is True
    assert extender["ignorable"] is False
    assert extender["httpTimeout"] == "5s"
    assert extender["preemptVerb"] == "preempt"  # gpupack picks the victims (#28, docs/contracts.md)


def test_scheduler_config_has_no_unknown_keys() -> None:
    """kube-scheduler's strict decoding rejects unknown fields; check the ones used here by hand."""
    config = _scheduler_config()
    assert set(config) <= {
        "apiVersion", "kind", "parallelism", "leaderElection", "clientConnection",
        "healthzBindAddress", "metricsBindAddress", "enableProfiling", "enableContentionProfiling",
        "percentageOfNodesToScore", "podInitialBackoffSeconds", "podMaxBackoffSeconds", "profiles",
        "extenders", "delayCacheUntilActive",
    }  # fmt: skip
    assert set(config["leaderElection"]) <= {
        "leaderElect", "leaseDuration", "renewDeadline", "retryPeriod", "resourceLock", "resourceName",
        "resourceNamespace",
    }  # fmt: skip
    (extender,) = config["extenders"]
    assert set(extender) <= {
        "urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb", "enableHTTPS",
        "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources", "ignorable",
    }  # fmt: skip
    for resource in extender["managedResources"]:
        assert set(resource) == {"name", "ignoredByScheduler"}


def test_managed_resources_are_exactly_the_gpu_resources_gpupack_understands() -> None:
    (extender,) = _scheduler_config()["extenders"]
    managed = extender["managedResources"]
    names = [r["name"] for r in managed]
    assert len(names) == len(set(names)), "duplicate managedResources"
    expected = {"nvidia.com/gpu", "gpupack.io/gpu-milli"} | {f"nvidia.com/mig-{p}" for p in expected_mig_profiles()}
    assert set(names) == expected
    ignored = {r["name"]: r["ignoredByScheduler"] for r in managed}
    assert all(value is False for value in ignored.values())  # gpu-milli too: gpupack agent advertises it


def test_expected_mig_profiles_match_design() -> None:
    """docs/contracts.md#mig-geometry spelled out, so a change to scoring.geometry is noticed here too."""
    assert {p for p in expected_mig_profiles() if p.endswith(".me")} == {
        "1g.5gb.me", "1g.10gb.me", "1g.12gb.me", "1g.18gb.me", "1g.6gb.me", "2g.12gb.me",
    }  # fmt: skip
    assert {"1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"} <= expected_mig_profiles()
    assert len(expected_mig_profiles()) == 26 + 6


# --- RBAC --------------------------------------------------------------------------------------


def _rule_tuples(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def _subjects_are_our_service_account(binding: dict[str, Any]) -> None:
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]


def test_extender_cluster_role_grants_exactly_what_the_sidecar_needs() -> None:
    role = _find("ClusterRole", "gpupack-extender")
    assert "aggregationRule" not in role
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}, "no resourceNames / nonResourceURLs"
        assert "*" not in rule["apiGroups"] + rule["resources"] + rule["verbs"]
    assert _rule_tuples(role["rules"]) == EXTENDER_RULES
    binding = _find("ClusterRoleBinding", "gpupack-extender")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "gpupack-extender",
    }
    _subjects_are_our_service_account(binding)


def test_kube_scheduler_binds_the_builtin_cluster_roles() -> None:
    bound = {}
    for binding in _of_kind("ClusterRoleBinding"):
        _subjects_are_our_service_account(binding)
        bound[binding["roleRef"]["name"]] = binding["roleRef"]["kind"]
    assert bound == {
        "system:kube-scheduler": "ClusterRole",
        "system:volume-scheduler": "ClusterRole",
        "gpupack-extender": "ClusterRole",
    }
    # bound, not copied: the only ClusterRole defined here is the sidecar's
    assert [r["metadata"]["name"] for r in _of_kind("ClusterRole")] == ["gpupack-extender"]


def test_leader_election_role_is_leases_in_own_namespace_only() -> None:
    (role,) = _of_kind("Role")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert _rule_tuples(role["rules"]) == {
        ("coordination.k8s.io", "leases", verb) for verb in ("get", "create", "update")
    }
    for rule in role["rules"]:
        if "resourceNames" in rule:
            assert rule["resourceNames"] == [_scheduler_config()["leaderElection"]["resourceName"]]
    bindings = {b["metadata"]["name"]: b for b in _of_kind("RoleBinding")}
    lease_binding = bindings.pop("gpupack-scheduler-leader-election")
    assert lease_binding["metadata"]["namespace"] == NAMESPACE
    assert lease_binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    _subjects_are_our_service_account(lease_binding)
    # the only other RoleBinding: the built-in read-only role for delegated authentication
    (auth,) = bindings.values()
    assert auth["metadata"]["namespace"] == "kube-system"
    assert auth["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "extension-apiserver-authentication-reader",
    }
    _subjects_are_our_service_account(auth)


# --- policy config -----------------------------------------------------------------------------


def test_policy_config() -> None:
    policy = _policy_config()
    assert policy["policy"]["name"] == "gpupack"
    weights = policy["policy"]["weights"]
    assert weights and all(isinstance(w, int | float) and w >= 0 for w in weights.values())
    assert policy["spot"]["nonInterruptibleOnSpot"] in ("avoid", "forbid")
    assert policy["reservationTTLSeconds"] == 30
    assert policy["port"] == 8888
    seen = set()
    for row in policy["prices"]:
        assert set(row) == {"instanceType", "capacityType", "hourly"}
        assert row["capacityType"] in ("spot", "on-demand")
        assert isinstance(row["hourly"], int | float) and row["hourly"] > 0
        key = (row["instanceType"], row["capacityType"])
        assert key not in seen
        seen.add(key)
    assert ("p5.48xlarge", "on-demand") in seen
    # every cloud node of the example cluster without its own price is in the table
    for node in _cluster_nodes():
        labels = node["metadata"]["labels"]
        if "gpupack.io/hourly-cost" in node["metadata"]["annotations"]:
            continue
        assert (labels["node.kubernetes.io/instance-type"], labels["karpenter.sh/capacity-type"]) in seen


# --- Deployment --------------------------------------------------------------------------------


def test_deployment_runs_upstream_scheduler_and_gpupack_sidecar() -> None:
    deployment = _deployment()
    spec = deployment["spec"]
    assert spec["replicas"] in (1, 2)
    if spec["replicas"] > 1:
        assert _scheduler_config()["leaderElection"]["leaderElect"] is True
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == SERVICE_ACCOUNT
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    assert [c["name"] for c in pod["containers"]] == ["kube-scheduler", "gpupack", "metrics"]  # metrics: #16

    scheduler = _container("kube-scheduler")
    assert scheduler["image"].startswith("registry.k8s.io/kube-scheduler:v1.")  # tag: test_kube_versions.py
    assert "--config=/etc/kubernetes/scheduler/config.yaml" in scheduler["args"]
    probe = scheduler["livenessProbe"]["httpGet"]
    assert (probe["port"], probe["path"], probe["scheme"]) == (10259, "/healthz", "HTTPS")

    gpupack = _container("gpupack")
    assert gpupack["image"] == f"{IMAGE_NAME}:{VERSION}"  # test_the_gpupack_image_is_one_kustomize_setting
    assert gpupack["args"] == [
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "8888",
        "--config",
        "/etc/gpupack/policy.yaml",
    ]
    assert gpupack["args"][gpupack["args"].index("--port") + 1] == str(_policy_config()["port"])
    for probe_name, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        command = gpupack[probe_name]["exec"]["command"]
        assert command[:2] == ["python", "-c"]
        assert f"'http://127.0.0.1:8888{path}'" in command[2]
        compile(command[2], probe_name, "exec")  # the probe is valid Python


def test_deployment_mounts_the_config_maps_where_the_commands_read_them() -> None:
    pod = _deployment()["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}

    def mounted(container: str, path: str) -> dict[str, Any]:
        (mount,) = [m for m in _container(container)["volumeMounts"] if m["mountPath"] == path]
        return volumes[mount["name"]]

    assert mounted("kube-scheduler", "/etc/kubernetes/scheduler")["configMap"]["name"] == "gpupack-scheduler-config"
    assert mounted("gpupack", "/etc/gpupack")["configMap"]["name"] == "gpupack-policy"
    assert "config.yaml" in _find("ConfigMap", "gpupack-scheduler-config")["data"]
    assert "policy.yaml" in _find("ConfigMap", "gpupack-policy")["data"]
    assert "emptyDir" in mounted("gpupack", "/tmp")  # numba cache on a read-only root filesystem
    env = {e["name"]: e.get("value") for e in _container("gpupack")["env"]}
    assert env["NUMBA_CACHE_DIR"].startswith("/tmp/")


def test_the_image_default_command_listens_on_loopback_only() -> None:
    """Like the sidecar: a plain `docker run` must not serve the extender to the network (#13)."""
    (cmd,) = [line for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("CMD ")]
    args = json.loads(cmd.removeprefix("CMD "))
    assert args[args.index("--host") + 1] == "127.0.0.1"


def test_the_image_ships_its_kernels_compiled() -> None:
    """The image compiles every kernel into the seed cache `gpupack serve` copies from (#13)."""
    from gpupack.extender.numba_cache import SEED_ENV

    text = (ROOT / "Dockerfile").read_text()
    seed = re.search(rf"{SEED_ENV}=(\S+)", text)
    assert seed, f"the image sets no {SEED_ENV}"
    assert re.search(rf"RUN NUMBA_CACHE_DIR={re.escape(seed[1])} python -c \\\n.*warm_up\(ClusterState\(", text)


def test_deployment_is_locked_down() -> None:
    pod = _deployment()["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    for container in pod["containers"]:
        ctx = container["securityContext"]
        assert ctx["runAsNonRoot"] is True
        assert isinstance(ctx["runAsUser"], int) and ctx["runAsUser"] > 0
        assert ctx["readOnlyRootFilesystem"] is True
        assert ctx["allowPrivilegeEscalation"] is False
        assert ctx["capabilities"] == {"drop": ["ALL"]}
        assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
        assert not ctx.get("privileged")
        resources = container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"])
        assert "memory" in resources["limits"]


# --- example pods ------------------------------------------------------------------------------


def _pod_limits(pod: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for container in pod["spec"]["containers"]:
        out.update(container.get("resources", {}).get("limits", {}))
    return out


def test_example_pods_cover_every_request_kind() -> None:
    pods = _docs(EXAMPLES / "pods.yaml")
    assert all(p["kind"] == "Pod" for p in pods)
    assert all(p["spec"]["schedulerName"] == "gpupack" for p in pods)
    limits = [_pod_limits(p) for p in pods]
    assert any(lim.get("nvidia.com/gpu") == 1 for lim in limits)
    assert any(lim.get("nvidia.com/gpu") == 4 for lim in limits)
    assert any(lim.get("nvidia.com/mig-3g.40gb") == 1 for lim in limits)
    shared = [p for p, lim in zip(pods, limits, strict=True) if lim.get("gpupack.io/gpu-milli") == 250]
    assert shared and shared[0]["metadata"]["annotations"]["gpupack.io/interruptible"] == "true"
    assert any("nvidia.com/gpu.product" in p["spec"].get("nodeSelector", {}) for p in pods)
    managed = {r["name"] for r in _scheduler_config()["extenders"][0]["managedResources"]}
    for lim in limits:  # one kind per pod, and kube-scheduler calls gpupack for it
        assert len(set(lim) & managed) == 1


# --- example cluster ---------------------------------------------------------------------------


def _alloc(node: dict[str, Any]) -> dict[str, str]:
    return node["status"]["allocatable"]


def _layout(node: dict[str, Any]) -> dict[int, list[tuple[str, int]]]:
    raw = json.loads(node["metadata"]["annotations"]["gpupack.io/mig-layout"])
    return {int(gpu): [(i.split("@")[0], int(i.split("@")[1])) for i in insts] for gpu, insts in raw.items()}


def test_cluster_has_a_realistic_mix_of_nodes() -> None:
    nodes = _cluster_nodes()
    assert 12 <= len(nodes) <= 16
    names = [n["metadata"]["name"] for n in nodes]
    assert len(names) == len(set(names))
    products = Counter(n["metadata"]["labels"]["nvidia.com/gpu.product"] for n in nodes)
    for product in (
        "NVIDIA-H100-80GB-HBM3",
        "NVIDIA-A100-SXM4-80GB",
        "NVIDIA-A30",
        "Tesla-V100-SXM2-32GB",
        "NVIDIA-L4",
    ):
        assert products[product] >= 1, product
    capacity_types = Counter(n["metadata"]["labels"].get("karpenter.sh/capacity-type") for n in nodes)
    assert capacity_types["spot"] >= 2 and capacity_types["on-demand"] >= 2
    modes = Counter(
        "dynamic" if "gpupack.io/mig" in n["metadata"]["annotations"]
        else "static" if "gpupack.io/mig-layout" in n["metadata"]["annotations"]
        else "none"
        for n in nodes
    )  # fmt: skip
    assert modes["dynamic"] >= 2 and modes["static"] >= 1 and modes["none"] >= 3
    assert sum("gpupack.io/hourly-cost" in n["metadata"]["annotations"] for n in nodes) >= 2


@pytest.mark.parametrize("node", _cluster_nodes(), ids=lambda n: n["metadata"]["name"])
def test_cluster_node_labels_and_status(node: dict[str, Any]) -> None:
    meta, status = node["metadata"], node["status"]
    labels, annotations = meta["labels"], meta["annotations"]
    assert labels["kubernetes.io/hostname"] == meta["name"]
    assert labels["node.kubernetes.io/instance-type"]
    assert labels.get("karpenter.sh/capacity-type", "on-demand") in ("spot", "on-demand")
    count = int(labels["nvidia.com/gpu.count"])
    assert 1 <= count <= 16
    assert int(labels["nvidia.com/gpu.memory"]) > 0
    assert "unschedulable" not in node.get("spec", {})
    assert not node.get("spec", {}).get("taints")
    ready = [c for c in status["conditions"] if c["type"] == "Ready"]
    assert len(ready) == 1 and ready[0]["status"] == "True"
    alloc = _alloc(node)
    for key in ("cpu", "memory", "pods", "nvidia.com/gpu"):
        assert key in alloc and key in status["capacity"], key
    for key, value in alloc.items():
        assert isinstance(value, str), f"{key}: quantities are strings in API objects"
    for key in alloc:
        assert key in status["capacity"]
    if "gpupack.io/hourly-cost" in annotations:
        assert float(annotations["gpupack.io/hourly-cost"]) > 0
    mig_resources = {
        k.removeprefix("nvidia.com/mig-"): int(v) for k, v in alloc.items() if k.startswith("nvidia.com/mig-")
    }
    family = _family_of(labels["nvidia.com/gpu.product"])

    if annotations.get("gpupack.io/mig") == "dynamic":
        assert family is not None
        assert "gpupack.io/mig-layout" not in annotations
        assert int(alloc["nvidia.com/gpu"]) == count
        assert int(alloc["gpupack.io/gpu-milli"]) == 1000 * count
        # the node agent advertises each profile's upper bound: instances per GPU x GPUs
        expected = {p: int(MAX_FIT[sid, 0]) * count for p, sid in family.profiles.items()}
        expected |= {p: count for p in _me_profiles(family.name)}
        assert mig_resources == expected
    elif "gpupack.io/mig-layout" in annotations:
        assert family is not None
        layout = _layout(node)
        assert set(layout) <= set(range(count))
        counts: Counter[str] = Counter()
        for gpu, instances in layout.items():
            used, compute = 0, 0
            for profile, start in instances:
                shape = SHAPES[family.profiles[profile]]
                assert start in shape.starts, f"GPU {gpu}: {profile}@{start}"
                bits = slice_bits(shape.size, start)
                assert used & bits == 0, f"GPU {gpu}: {profile}@{start} overlaps"
                used |= bits
                compute += shape.compute
                counts[profile] += 1
            assert compute <= shape.compute_total, f"GPU {gpu}: {compute} compute slices"
        assert mig_resources == dict(counts)
        assert int(alloc["nvidia.com/gpu"]) == count - len(layout)
        assert int(alloc.get("gpupack.io/gpu-milli", "0")) == 1000 * (count - len(layout))
    else:
        assert not mig_resources
        assert int(alloc["nvidia.com/gpu"]) == count
        assert int(alloc["gpupack.io/gpu-milli"]) == 1000 * count

    if "gpupack.io/gpu-topology" in annotations:
        topology = json.loads(annotations["gpupack.io/gpu-topology"])
        nvlink, numa = topology["nvlink"], topology["numa"]
        assert len(nvlink) == count and all(len(row) == count for row in nvlink)
        assert all(nvlink[i][j] == nvlink[j][i] for i in range(count) for j in range(count)), "symmetric"
        assert all(nvlink[i][i] == 0 for i in range(count))
        assert len(numa) == count


def test_v100_node_is_a_dgx1_hybrid_cube_mesh() -> None:
    (node,) = [
        n for n in _cluster_nodes() if n["metadata"]["labels"]["nvidia.com/gpu.product"] == "Tesla-V100-SXM2-32GB"
    ]
    nvlink = json.loads(node["metadata"]["annotations"]["gpupack.io/gpu-topology"])["nvlink"]
    # nvidia-smi topo -m on a DGX-1V
    nv = {(0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2, (2, 3): 2,
          (2, 6): 1, (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2}  # fmt: skip
    for i in range(8):
        for j in range(8):
            assert nvlink[i][j] == nv.get((min(i, j), max(i, j)), 0), (i, j)
        assert sum(nvlink[i]) == 6  # six NVLinks per V100
        assert sum(1 for n in nvlink[i] if n) == 4  # each GPU links to four others


def _assignment(pod: dict[str, Any]) -> dict[str, Any] | None:
    raw = (pod["metadata"].get("annotations") or {}).get("gpupack.io/assignment")
    return None if raw is None else json.loads(raw)


def test_cluster_pods_are_running_and_bound() -> None:
    """Every pod of the example cluster is bound and running, but the README's pending `train-0`."""
    everything = _cluster_pods()
    pending = [p for p in everything if "nodeName" not in p["spec"]]
    assert [p["metadata"]["name"] for p in pending] == ["train-0"]
    assert pending[0]["status"]["phase"] == "Pending" and pending[0]["spec"]["schedulerName"] == "gpupack"
    pods = [p for p in everything if p not in pending]
    assert 4 <= len(pods) <= 8
    node_names = {n["metadata"]["name"] for n in _cluster_nodes()}
    for pod in pods:
        assert pod["spec"]["nodeName"] in node_names
        assert pod["status"]["phase"] == "Running"
        for container in pod["spec"]["containers"]:
            resources = container["resources"]
            assert resources["requests"] == resources["limits"]
    assert sum(_assignment(p) is not None for p in pods) >= 4
    unassigned = [p for p in pods if _assignment(p) is None]
    assert any(p["spec"]["schedulerName"] != "gpupack" and "nvidia.com/gpu" in _pod_limits(p) for p in unassigned)


@pytest.mark.parametrize("pod", [p for p in _cluster_pods() if _assignment(p)], ids=lambda p: p["metadata"]["name"])
def test_cluster_assignment_matches_node_and_request(pod: dict[str, Any]) -> None:
    assignment = _assignment(pod)
    assert assignment is not None
    assert set(assignment) == {"node", "gpus"}
    assert assignment["node"] == pod["spec"]["nodeName"]
    assert pod["spec"]["schedulerName"] == "gpupack"
    (node,) = [n for n in _cluster_nodes() if n["metadata"]["name"] == assignment["node"]]
    count = int(node["metadata"]["labels"]["nvidia.com/gpu.count"])
    gpus = assignment["gpus"]
    indices = [g["index"] for g in gpus]
    assert all(0 <= i < count for i in indices)
    assert len(indices) == len(set(indices))
    limits = _pod_limits(pod)
    annotations = node["metadata"]["annotations"]
    if "nvidia.com/gpu" in limits:
        assert all(set(g) == {"index"} for g in gpus)
        assert len(gpus) == int(limits["nvidia.com/gpu"])
        if "gpupack.io/mig-layout" in annotations:
            assert not set(indices) & set(_layout(node)), "whole GPUs carry no MIG instance"
    elif "gpupack.io/gpu-milli" in limits:
        (gpu,) = gpus
        assert set(gpu) == {"index", "milli"} and gpu["milli"] == int(limits["gpupack.io/gpu-milli"])
    else:
        (key,) = [k for k in limits if k.startswith("nvidia.com/mig-")]
        profile = key.removeprefix("nvidia.com/mig-")
        assert len(gpus) == int(limits[key])
        family = _family_of(node["metadata"]["labels"]["nvidia.com/gpu.product"])
        for gpu in gpus:
            assert set(gpu) == {"index", "mig", "start"} and gpu["mig"] == profile
            assert gpu["start"] in SHAPES[family.profiles[profile]].starts
            if "gpupack.io/mig-layout" in annotations:
                assert (profile, gpu["start"]) in _layout(node)[gpu["index"]]
            else:
                assert annotations["gpupack.io/mig"] == "dynamic"


def test_cluster_nodes_load_with_the_extender() -> None:
    """The cluster file is what `gpupack serve --cluster-file` reads: every node must convert cleanly."""
    node_facts = pytest.importorskip("gpupack.kube.node_facts")
    from gpupack.scoring.facts import MigMode

    for node in _cluster_nodes():
        facts = node_facts.facts_from_node(node)
        annotations = node["metadata"]["annotations"]
        assert facts.gpu_count == int(node["metadata"]["labels"]["nvidia.com/gpu.count"])
        if annotations.get("gpupack.io/mig") == "dynamic":
            assert facts.mig_mode == MigMode.DYNAMIC
        elif "gpupack.io/mig-layout" in annotations:
            assert facts.mig_mode == MigMode.STATIC
        else:
            assert facts.mig_mode == MigMode.NONE
        assert node_facts.node_is_schedulable(node)
