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


def test_the_agents_root_filesystem_is_read_only_with_a_writable_tmp() -> None:
    """#26 low: the agent runs privileged as root, so nothing in its image may be writable; numba's
    cache ($NUMBA_CACHE_DIR under /tmp, Dockerfile) is the one thing it writes (the real-node e2e runs it)."""
    ds = next(o for o in _objects() if o["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    (tmp,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == tmp["name"])
