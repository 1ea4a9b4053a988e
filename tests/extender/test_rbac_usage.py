"""The gpupack-extender ClusterRole grants exactly the API calls the extender's code makes.

The calls are read from the code, not listed by hand: every `self._post("<method>", ...)` (a
kube/sources/lean_post.py POST named after the generated method whose request it sends), every
`self._core.<method>` (CoreV1Api),
`self._events.<method>` (EventsV1Api), `self._policy.<method>` (PolicyV1Api) and `self._custom.<method>`
(CustomObjectsApi) of kube/sources/kube_api.py and kube/sources/dra_writes.py (DRA's device chooser, #30:
its custom objects calls are on ResourceClaims only) is resolved through the installed Kubernetes client to its
HTTP method and path (`<Api>._<method>_serialize`), which gives the RBAC (apiGroup, resource, verb); a
list method handed to `self._watch` (directly or in a `partial`) is the `watch` verb. A custom objects
call's path has the group and plural as parameters: kube_api.py makes those calls for each kind of
`POD_GROUP_KINDS` and of `DRA_KINDS`, whose group and plural fill them in. Any other Kubernetes API object
constructed anywhere under extender/ would bypass that scan, so the test refuses it too.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from gpupack.kube.sources.kube_api import DRA_KINDS, POD_GROUP_KINDS
from gpupack.kube.sources.lean_post import LEAN_POSTS

ROOT = Path(__file__).resolve().parents[2]
SERVICE_COMPONENTS = ("gpupack", "scoring", "kube", "extender")  # the agent has RBAC of its own
KUBE_API = ROOT / "kube" / "sources" / "kube_api.py"
DRA_WRITES = ROOT / "kube" / "sources" / "dra_writes.py"
RBAC = ROOT / "manifests" / "rbac.yaml"

_SERIALIZE = re.compile(r"method='(?P<method>[A-Z]+)',\s*resource_path='(?P<path>[^']+)'")
_VERBS = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}
CLIENTS = {  # attribute of OfficialKubeApi -> its class
    "_core": client.CoreV1Api,
    "_events": client.EventsV1Api,
    "_policy": client.PolicyV1Api,
    "_custom": client.CustomObjectsApi,
}
CUSTOM_RESOURCES = [(kind.group, kind.plural) for kind in (*POD_GROUP_KINDS, *DRA_KINDS)]  # what `self._custom` reads
# each file that calls the API, and the custom resources its `self._custom` calls are made on
CALLERS = {KUBE_API: CUSTOM_RESOURCES, DRA_WRITES: [("resource.k8s.io", "resourceclaims")]}
# From Kubernetes 1.36 the API server also checks `update` on resourceclaims/binding for a status write
# that sets status.allocation (DRAResourceClaimGranularStatusAuthorization): no client call names it.
SYNTHETIC = {
    ("resource.k8s.io", "resourceclaims/status", "update"): ("resource.k8s.io", "resourceclaims/binding", "update")
}


def rbac_of_call(
    api_method: str, watched: bool, api: type, custom: list[tuple[str, str]] = CUSTOM_RESOURCES
) -> set[tuple[str, str, str]]:
    """The (apiGroup, resource[/subresource], verb) of one call of a method of `api`: one, or for a custom
    objects method (group and plural are its parameters) one per custom resource of `custom`."""
    group, resource, verb = rbac_of(api_method, watched, api)
    if api is not client.CustomObjectsApi:
        return {(group, resource, verb)}
    assert group == "{group}" and resource.startswith("{plural}"), f"{api_method}: not a call on a custom resource"
    sub = resource.removeprefix("{plural}")
    return {(custom_group, plural + sub, verb) for custom_group, plural in custom}


def rbac_of(api_method: str, watched: bool, api: type = client.CoreV1Api) -> tuple[str, str, str]:
    """(apiGroup, resource[/subresource], verb) of one method of `api`, from its HTTP method and path."""
    source = inspect.getsource(getattr(api, f"_{api_method}_serialize"))
    match = _SERIALIZE.search(source)
    assert match, f"cannot read the HTTP call of {api.__name__}.{api_method}"
    parts = match["path"].strip("/").split("/")
    group = "" if parts[0] == "api" else parts[1]
    rest = parts[2:] if parts[0] == "api" else parts[3:]
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]  # namespaces/{namespace}/<resource>...
    resource, named, subresource = rest[0], len(rest) > 1, rest[2] if len(rest) > 2 else None
    reading = "get" if named else ("watch" if watched else "list")
    verb = reading if match["method"] == "GET" else _VERBS[match["method"]]
    return group, f"{resource}/{subresource}" if subresource else resource, verb


def calls_in_code() -> set[tuple[str, str, str]]:
    """Every (apiGroup, resource, verb) the extender's Kubernetes client makes, and the checks they set off."""
    used: set[tuple[str, str, str]] = set()
    for path, custom in CALLERS.items():
        used |= calls_in(path, custom)
    return used | {SYNTHETIC[call] for call in used if call in SYNTHETIC}


def calls_in(
    path: Path, custom: list[tuple[str, str]], clients: Mapping[str, type] = CLIENTS
) -> set[tuple[str, str, str]]:
    """The calls of one file, whose `self.<attribute>` of `clients` are Kubernetes API clients."""
    tree = ast.parse(path.read_text())
    used: set[tuple[str, str, str]] = set()
    watched: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _is_self_attr(node.func, "_watch"):
            watched.update(id(inner) for arg in node.args for inner in ast.walk(arg))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _is_self_attr(node.func, "_post"):  # a LeanPost, named by its method
            assert isinstance(node.args[0], ast.Constant), "a LeanPost names its generated method as a literal"
            method = str(node.args[0].value)
            used |= rbac_of_call(method, False, LEAN_POSTS[method][0], custom)
        for attribute, api in clients.items():
            if isinstance(node, ast.Attribute) and _is_self_attr(node.value, attribute):
                used |= rbac_of_call(node.attr, id(node) in watched, api, custom)
    return used


def _is_self_attr(node: ast.AST, name: str) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == name
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def granted(path: Path = RBAC, kind: str = "ClusterRole", name: str = "gpupack-extender") -> set[tuple[str, str, str]]:
    """The (apiGroup, resource, verb) triples of a role of the manifests (the gpupack-extender ClusterRole)."""
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
    (role,) = [d for d in documents if d["kind"] == kind and d["metadata"]["name"] == name]
    rules: list[dict[str, Any]] = role["rules"]
    assert all(set(rule) == {"apiGroups", "resources", "verbs"} for rule in rules)
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def test_the_code_makes_the_calls_gpupack_needs() -> None:
    assert calls_in_code() == {
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "pods/binding", "create"),
        ("events.k8s.io", "events", "create"),
        ("events.k8s.io", "events", "patch"),
        ("policy", "poddisruptionbudgets", "list"),  # preemption's victims (#28)
        ("policy", "poddisruptionbudgets", "watch"),
        ("scheduling.x-k8s.io", "podgroups", "list"),  # gangs' sizes (#29)
        ("scheduling.x-k8s.io", "podgroups", "watch"),
        ("scheduling.volcano.sh", "podgroups", "list"),
        ("scheduling.volcano.sh", "podgroups", "watch"),
        ("resource.k8s.io", "resourceslices", "list"),  # the DRA inventory (#30)
        ("resource.k8s.io", "resourceslices", "watch"),
        ("resource.k8s.io", "resourceclaims", "list"),
        ("resource.k8s.io", "resourceclaims", "watch"),
        ("resource.k8s.io", "deviceclasses", "list"),
        ("resource.k8s.io", "deviceclasses", "watch"),
        ("resource.k8s.io", "resourceclaims", "get"),  # DRA's device chooser (#30 item 2)
        ("resource.k8s.io", "resourceclaims", "update"),  # the delete-protection finalizer
        ("resource.k8s.io", "resourceclaims/status", "update"),  # status.allocation
        ("resource.k8s.io", "resourceclaims/binding", "update"),  # ... and its 1.36+ authorization check
        ("", "pods", "patch"),  # the gate removed
    }


def test_cluster_role_grants_nothing_the_code_does_not_use() -> None:
    rules = granted()
    assert rules - calls_in_code() == set(), "granted but never called"
    assert calls_in_code() - rules == set(), "called but not granted"
    assert not any("*" in part for rule in rules for part in rule)


def test_no_other_kubernetes_api_client_in_the_service() -> None:
    """Of what `gpupack serve` runs, only kube_api.py (through CoreV1Api, EventsV1Api, PolicyV1Api and
    CustomObjectsApi) and dra_writes.py (CoreV1Api, CustomObjectsApi) talk to the API server."""
    constructed: dict[str, set[str]] = {}
    for path in (path for folder in SERVICE_COMPONENTS for path in (ROOT / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if re.fullmatch(r"[A-Z]\w*V\d\w*Api|CustomObjectsApi|DynamicClient", name):
                    constructed.setdefault(str(path.relative_to(ROOT)), set()).add(name)
    assert constructed == {
        "kube/sources/kube_api.py": set(api.__name__ for api in CLIENTS.values()),
        "kube/sources/dra_writes.py": {"CoreV1Api", "CustomObjectsApi"},
    }


def test_each_lean_post_sends_to_the_path_of_the_generated_method_it_is_named_after() -> None:
    for method, (api, path) in LEAN_POSTS.items():
        match = _SERIALIZE.search(inspect.getsource(getattr(api, f"_{method}_serialize")))
        assert match is not None and (match["method"], match["path"]) == ("POST", path), method


def test_rbac_of_reads_the_client() -> None:
    assert rbac_of("list_node", watched=False) == ("", "nodes", "list")
    assert rbac_of("list_pod_for_all_namespaces", watched=True) == ("", "pods", "watch")
    assert rbac_of("read_namespaced_pod", watched=False) == ("", "pods", "get")
    assert rbac_of("create_namespaced_pod_binding", watched=False) == ("", "pods/binding", "create")
    assert rbac_of("create_namespaced_event", watched=False) == ("", "events", "create")
    events = client.EventsV1Api
    assert rbac_of("create_namespaced_event", watched=False, api=events) == ("events.k8s.io", "events", "create")
    assert rbac_of("patch_namespaced_event", watched=False, api=events) == ("events.k8s.io", "events", "patch")


def test_rbac_of_fills_in_the_custom_resources_of_a_custom_objects_call() -> None:
    custom = client.CustomObjectsApi
    assert rbac_of_call("list_cluster_custom_object", watched=True, api=custom) == {
        ("scheduling.x-k8s.io", "podgroups", "watch"),
        ("scheduling.volcano.sh", "podgroups", "watch"),
        ("resource.k8s.io", "resourceslices", "watch"),  # the DRA inventory (#30)
        ("resource.k8s.io", "resourceclaims", "watch"),
        ("resource.k8s.io", "deviceclasses", "watch"),
    }
    assert rbac_of("list_cluster_custom_object", watched=False, api=custom) == ("{group}", "{plural}", "list")
