"""The shipped pods pass the API server's admission (Pod Security at the shipped namespaces' levels).

The real-node cases must lower gpupack-system's level for host networking (deploy.py), so the shipped
levels are checked here, on each version: a namespace with each shipped Namespace's labels, the shipped
ServiceAccounts, and a server-side dry run of a Pod made from each shipped workload's pod template.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from gpupack.harness.controlplane import ControlPlane
from tests.e2e import deploy
from tests.e2e.deploy import kubectl

WORKLOADS = {("Deployment", "gpupack-scheduler"), ("DaemonSet", "gpupack-agent")}


@pytest.fixture
def shipped(control_plane: ControlPlane) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The shipped namespaces made under fresh names (labels as shipped); (shipped -> made, objects)."""
    objects = deploy.render(kubectl(), deploy.MANIFESTS)
    short = uuid.uuid4().hex[:5]
    core = control_plane.core()
    made = {}
    for namespace in (o for o in objects if o["kind"] == "Namespace"):
        name = namespace["metadata"]["name"]
        made[name] = f"{name}-{short}"
        control_plane.create_namespace(made[name], namespace["metadata"]["labels"])
    for account in (o for o in objects if o["kind"] == "ServiceAccount"):
        body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account["metadata"]["name"]}}
        core.create_namespaced_service_account(made[account["metadata"]["namespace"]], body)
    return made, objects


def dry_run_pod(control_plane: ControlPlane, namespace: str, workload: dict[str, Any]) -> None:
    """Create (dry run, all admission) a Pod of `workload`'s template in `namespace`."""
    template = workload["spec"]["template"]
    metadata = {"generateName": f"{workload['metadata']['name']}-", "labels": template["metadata"]["labels"]}
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]}
    control_plane.core().create_namespaced_pod(namespace, body, dry_run="All")


def test_each_shipped_workloads_pods_are_admitted_in_its_namespace(
    control_plane: ControlPlane, shipped: tuple[dict[str, str], list[dict[str, Any]]]
) -> None:
    made, objects = shipped
    workloads = [o for o in objects if (o["kind"], o["metadata"]["name"]) in WORKLOADS]
    assert len(workloads) == len(WORKLOADS)
    for workload in workloads:
        dry_run_pod(control_plane, made[workload["metadata"]["namespace"]], workload)


def test_the_agents_pods_would_be_refused_in_the_restricted_namespace(
    control_plane: ControlPlane, shipped: tuple[dict[str, str], list[dict[str, Any]]]
) -> None:
    """The check above is not vacuous: Pod Security does refuse the agent where the scheduler lives."""
    made, objects = shipped
    (agent,) = [o for o in objects if o["kind"] == "DaemonSet"]
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "gpupack-agent"}}
    control_plane.core().create_namespaced_service_account(made["gpupack-system"], account)
    with pytest.raises(ApiException) as refused:
        dry_run_pod(control_plane, made["gpupack-system"], agent)
    assert refused.value.status == 403 and "violates PodSecurity" in str(refused.value.body)
