"""manifests/agent: valid Kubernetes 1.37 objects, and RBAC that grants the agent exactly what it calls."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import yaml

AGENT = Path(__file__).resolve().parents[2] / "manifests" / "agent"


def _objects() -> list[dict]:
    return [doc for path in sorted(AGENT.glob("*.yaml")) if path.name != "kustomization.yaml"
            for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_objects_are_valid() -> None:
    for obj in _objects():
        kubernetes_validate.validate(obj, "1.37", strict=True)


def test_rbac_is_what_the_agent_calls() -> None:
    role = next(o for o in _objects() if o["kind"] == "ClusterRole")
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    # agent/node_publisher.KubeNodeApi: read_node, patch_node; agent/pods.KubePods: list_pod_for_all_namespaces
    assert granted == {("", "nodes", "get"), ("", "nodes", "patch"), ("", "pods", "list")}


def test_the_daemonset_sees_the_kubelet_sockets_and_its_node_name() -> None:
    ds = next(o for o in _objects() if o["kind"] == "DaemonSet")
    container = ds["spec"]["template"]["spec"]["containers"][0]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/var/lib/kubelet/device-plugins" in mounts
    assert any(e["name"] == "NODE_NAME" for e in container["env"])


def test_the_agent_runs_as_root_in_a_namespace_that_admits_it() -> None:
    """A non-root agent cannot enter the kubelet's 0750 root-owned device-plugins folder to register
    (tests/e2e/test_real_node.py shows it on a real kubelet); Pod Security must admit a privileged pod."""
    ds = next(o for o in _objects() if o["kind"] == "DaemonSet")
    security = ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    assert security["runAsUser"] == 0 and security["privileged"] is True
    (namespace,) = [o for o in _objects() if o["kind"] == "Namespace"]
    assert ds["metadata"]["namespace"] == namespace["metadata"]["name"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
