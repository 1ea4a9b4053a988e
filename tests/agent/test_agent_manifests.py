"""manifests/agent: valid Kubernetes 1.28 objects, and RBAC that grants the agent exactly what it calls."""

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
        kubernetes_validate.validate(obj, "1.28", strict=True)


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
