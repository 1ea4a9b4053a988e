"""The admission policies `kubectl apply -k manifests/` installs (#26 items 2 and 4), offline.

What they name is checked against the rest of the manifests and kube/keys.py: the identity each one
holds (the scheduler Deployment's and the agent DaemonSet's ServiceAccounts), the annotation the
assignment policy guards, and what each matches. How they behave on a real API server is
tests/e2e/test_authorization.py's; the agent's annotation list against its code,
tests/agent/test_agent_authorization.py's.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupack.kube.keys import ANNOTATION_ASSIGNMENT

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
ASSIGNMENT_POLICY = "gpupack-assignment-writer"
AGENT_POLICY = "gpupack-agent-own-node"
NODE_CLAIM = "authentication.kubernetes.io/node-name"
USERNAME = re.compile(r"request\.userInfo\.username (?P<op>==|!=) '(?P<user>[^']+)'")

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")


def rendered() -> list[dict[str, Any]]:
    """`kubectl kustomize manifests/`: what `kubectl apply -k manifests/` applies."""
    out = subprocess.run(
        ["kubectl", "kustomize", str(MANIFESTS)], check=True, capture_output=True, text=True, timeout=60
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return rendered()


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def service_account_user(objects: list[dict[str, Any]], workload_kind: str) -> str:
    """The user name of the ServiceAccount a shipped workload's pods run as."""
    (workload,) = [o for o in objects if o["kind"] == workload_kind and o["metadata"]["name"].startswith("gpupack")]
    account = workload["spec"]["template"]["spec"]["serviceAccountName"]
    one(objects, "ServiceAccount", account)  # shipped too
    return f"system:serviceaccount:{workload['metadata']['namespace']}:{account}"


def held_identity(policy: dict[str, Any]) -> tuple[str, str]:
    """(operator, user name) of the policy's one match condition on the caller."""
    (condition,) = policy["spec"]["matchConditions"]
    match = USERNAME.fullmatch(condition["expression"])
    assert match, condition["expression"]
    return match["op"], match["user"]


@pytest.mark.parametrize("name", [ASSIGNMENT_POLICY, AGENT_POLICY])
def test_each_policy_is_installed_and_denies(objects: list[dict[str, Any]], name: str) -> None:
    policy = one(objects, "ValidatingAdmissionPolicy", name)
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert "paramKind" not in policy["spec"]
    binding = one(objects, "ValidatingAdmissionPolicyBinding", name)
    assert binding["spec"] == {"policyName": name, "validationActions": ["Deny"]}


def test_the_assignment_policy_exempts_only_the_schedulers_service_account(objects: list[dict[str, Any]]) -> None:
    policy = one(objects, "ValidatingAdmissionPolicy", ASSIGNMENT_POLICY)
    assert held_identity(policy) == ("!=", service_account_user(objects, "Deployment"))


def test_the_assignment_policy_guards_the_assignment_on_every_pod_write(objects: list[dict[str, Any]]) -> None:
    """pods (create, update), pods/binding (whose annotations the API server copies onto the pod in
    storage) and pods/status (which may change metadata too)."""
    spec = one(objects, "ValidatingAdmissionPolicy", ASSIGNMENT_POLICY)["spec"]
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], sorted(rule["operations"]), sorted(rule["resources"])) == (
        [""],
        ["CREATE", "UPDATE"],
        ["pods", "pods/*"],
    )
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert set(re.findall(r"'(gpupack\.io/[^']+)'", " ".join(variables.values()))) == {ANNOTATION_ASSIGNMENT}
    assert [v["expression"] for v in spec["validations"]] == ["variables.after == variables.before"]
    assert ANNOTATION_ASSIGNMENT in spec["validations"][0]["message"]


def test_the_agent_policy_holds_the_agents_service_account_to_its_node_claim(objects: list[dict[str, Any]]) -> None:
    policy = one(objects, "ValidatingAdmissionPolicy", AGENT_POLICY)
    assert held_identity(policy) == ("==", service_account_user(objects, "DaemonSet"))
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (sorted(rule["operations"]), sorted(rule["resources"])) == (
        ["CREATE", "DELETE", "UPDATE"],
        ["nodes", "nodes/*"],
    )
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert f"request.userInfo.extra['{NODE_CLAIM}']" in variables["claim"]
    assert "object.metadata.name == variables.claim[0]" in variables["ownNode"]
