"""The agent's ClusterRole and its admission policy follow the agent's code (#26 item 4).

- RBAC: every `self._core.<method>` under agent/ is resolved through the installed Kubernetes client to
  its (apiGroup, resource, verb), as tests/extender/test_rbac_usage.py does for the extender; the
  gpupack-agent ClusterRole grants exactly those, and no other API client is made under agent/.
- Admission: the node annotations that policy lets the agent change are exactly the keys the agent's
  loop publishes, found by running a step against a Node whose every gpupack annotation is stale.
The policy's behaviour on a real API server is tests/e2e/test_authorization.py's.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import yaml

from gpupack.agent.fake_nvml import FakeNvml
from gpupack.agent.main import AgentLoop
from gpupack.agent.pods import MemoryPods
from gpupack.kube import keys
from tests.agent.conftest import NODE
from tests.agent.test_node_publisher import FakeNodeApi
from tests.extender.test_rbac_usage import rbac_of

ROOT = Path(__file__).resolve().parents[2]
AGENT_CODE = ROOT / "agent"
AGENT_MANIFESTS = ROOT / "manifests" / "agent"
USERNAME = re.compile(r"request\.userInfo\.username == '(?P<user>[^']+)'")


def _objects(file_name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((AGENT_MANIFESTS / file_name).read_text()) if doc]


def _one(file_name: str, kind: str) -> dict[str, Any]:
    (found,) = [o for o in _objects(file_name) if o["kind"] == kind]
    return found


def calls_in_agent_code() -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) of every CoreV1Api call under agent/ (`self._core.<method>`)."""
    used = set()
    for path in AGENT_CODE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and _is_self_core(node.value):
                used.add(rbac_of(node.attr, watched=False))
    return used


def _is_self_core(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "_core"
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def test_the_agent_code_makes_these_calls() -> None:
    # node_publisher.KubeNodeApi: read_node, patch_node; pods.KubePods: list_pod_for_all_namespaces
    assert calls_in_agent_code() == {("", "nodes", "get"), ("", "nodes", "patch"), ("", "pods", "list")}


def test_the_cluster_role_grants_exactly_the_agents_calls() -> None:
    rules = _one("rbac.yaml", "ClusterRole")["rules"]
    assert all(set(rule) == {"apiGroups", "resources", "verbs"} for rule in rules), "no resourceNames or more"
    granted = {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    assert granted == calls_in_agent_code()


def test_no_other_kubernetes_api_client_in_the_agent() -> None:
    constructed: dict[str, set[str]] = {}
    for path in AGENT_CODE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if re.fullmatch(r"[A-Z]\w*V\d\w*Api|CustomObjectsApi|DynamicClient", name):
                    constructed.setdefault(path.name, set()).add(name)
    assert constructed == {"main.py": {"CoreV1Api"}}


def test_the_policy_holds_the_agents_service_account() -> None:
    policy = _one("admission.yaml", "ValidatingAdmissionPolicy")
    account = _one("rbac.yaml", "ServiceAccount")["metadata"]
    (condition,) = policy["spec"]["matchConditions"]
    match = USERNAME.fullmatch(condition["expression"])
    assert match and match["user"] == f"system:serviceaccount:{account['namespace']}:{account['name']}"
    daemonset = _one("daemonset.yaml", "DaemonSet")
    assert daemonset["spec"]["template"]["spec"]["serviceAccountName"] == account["name"]
    assert daemonset["metadata"]["namespace"] == account["namespace"]
    binding = _one("admission.yaml", "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}


def published_by_the_policy() -> list[str]:
    """The annotation keys the agent policy lets the agent change (its `published` variable)."""
    variables = _one("admission.yaml", "ValidatingAdmissionPolicy")["spec"]["variables"]
    (expression,) = [v["expression"] for v in variables if v["name"] == "published"]
    listed = ast.literal_eval(expression)
    assert isinstance(listed, list) and all(isinstance(key, str) for key in listed)
    return listed


def test_the_policy_lets_the_agent_change_exactly_the_annotations_its_loop_publishes(plugin_dir, kubelet) -> None:
    every_key = {value for name, value in vars(keys).items() if name.startswith("ANNOTATION_")}
    node_api = FakeNodeApi(dict.fromkeys(every_key, "stale"))  # every key the agent owns differs from its value
    loop = AgentLoop(NODE, FakeNvml.build(count=2, mig_enabled=True), MemoryPods([]), node_api, plugin_dir)
    try:
        loop.step()
    finally:
        loop.manager.stop()
    written = {key for patch in node_api.patches for key in patch}
    assert written == {keys.ANNOTATION_GPU_TOPOLOGY, keys.ANNOTATION_MIG_LAYOUT, keys.ANNOTATION_DEVICES_IN_USE}
    assert sorted(published_by_the_policy()) == sorted(written)
