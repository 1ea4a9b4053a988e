"""The defrag loop's RBAC (manifests/defrag/rbac.yaml) grants exactly the API calls its code makes (#31 item 1).

Read from the code as tests/extender/test_rbac_usage.py reads the extender's: the loop reads the cluster
through kube/sources/kube_api.py's lists and watches (`report.snapshot.read_live_cluster`), writes Events
through its `create_event`, evicts and writes the hold through defrag/evictions.py, and elects a leader
through defrag/lease.py (the Role of its one Lease in the release namespace).
"""

from __future__ import annotations

from typing import Any

import yaml
from kubernetes import client

from tests.extender.test_rbac_usage import CUSTOM_RESOURCES, KUBE_API, ROOT, calls_in, granted

DEFRAG_RBAC = ROOT / "manifests" / "defrag" / "rbac.yaml"
EVICTIONS = ROOT / "defrag" / "evictions.py"
LEASE = ROOT / "defrag" / "lease.py"
EVENTS_CREATE = ("events.k8s.io", "events", "create")  # execute.py's Events, through kube_api's create_event


def cluster_calls() -> set[tuple[str, str, str]]:
    reads = {call for call in calls_in(KUBE_API, CUSTOM_RESOURCES) if call[2] in ("list", "watch")}
    writes = calls_in(EVICTIONS, [], {"_core": client.CoreV1Api})
    return reads | writes | {EVENTS_CREATE}


def lease_role() -> dict[str, Any]:
    (role,) = [d for d in yaml.safe_load_all(DEFRAG_RBAC.read_text()) if d and d["kind"] == "Role"]
    return role


def test_the_defrag_code_makes_the_calls_its_role_grants() -> None:
    evictions = calls_in(EVICTIONS, [], {"_core": client.CoreV1Api})
    assert evictions == {("", "pods/eviction", "create"), ("", "pods", "patch")}
    assert cluster_calls() == granted(DEFRAG_RBAC, "ClusterRole", "gpupack-defrag")


def test_the_lease_role_grants_the_calls_of_the_elector_on_its_own_lease_only() -> None:
    calls = calls_in(LEASE, [], {"_api": client.CoordinationV1Api})
    assert calls == {("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")}
    rules = lease_role()["rules"]
    named = {(g, r, v) for rule in rules if "resourceNames" in rule for g in rule["apiGroups"]
             for r in rule["resources"] for v in rule["verbs"]}  # fmt: skip
    unnamed = {(g, r, v) for rule in rules if "resourceNames" not in rule for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}  # fmt: skip
    assert unnamed == {("coordination.k8s.io", "leases", "create")}  # create cannot be limited by name
    assert named | unnamed == calls
    assert all(rule.get("resourceNames", ["gpupack-defrag"]) == ["gpupack-defrag"] for rule in rules)
