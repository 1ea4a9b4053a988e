"""Load nodes and pods from a YAML or JSON file of Kubernetes Node / Pod objects.

Accepted layouts: a plain list of objects, a `kind: List` (or any `...List`) with `items`, a single object,
or multi-document YAML whose documents are any of these. Objects of other kinds are ignored, so one cluster
file can hold both the Nodes and the Pods. The conversion itself is the extender's
(`kube.node_facts.facts_from_node`, `kube.pod_request.request_from_pod`, `pod_key`), so the
simulator sees exactly what the live extender would.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from gpupack.scoring.facts import NodeFacts
from gpupack.sim.workload import TraceError, TracePod

JSON_SUFFIXES = (".json",)
YAML_SUFFIXES = (".yaml", ".yml")


def _documents(path: Path) -> list[Any]:
    """The parsed documents of a JSON file (one) or YAML file (one or more; empty ones dropped)."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not UTF-8 text: {exc}") from exc
    if path.suffix.lower() in JSON_SUFFIXES:
        try:
            return [json.loads(text)]
        except json.JSONDecodeError as exc:
            raise TraceError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from exc
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise TraceError(f"{where}: invalid YAML: {exc}") from exc


def _flatten(path: Path, value: Any, out: list[dict[str, Any]]) -> None:
    if isinstance(value, list):
        for item in value:
            _flatten(path, item, out)
        return
    if not isinstance(value, dict):
        raise TraceError(f"{path}: expected Kubernetes objects, found a {type(value).__name__}")
    kind = value.get("kind")
    if isinstance(kind, str) and kind.endswith("List") and "items" in value:
        items = value["items"] if value["items"] is not None else []
        if not isinstance(items, list):
            raise TraceError(f"{path}: {kind}.items is not a list")
        _flatten(path, items, out)
        return
    out.append(value)


def load_objects(path: str | Path) -> list[dict[str, Any]]:
    """Every Kubernetes object in a YAML/JSON file, in file order, Lists and multi-documents flattened."""
    path = Path(path)
    objects: list[dict[str, Any]] = []
    for doc in _documents(path):
        _flatten(path, doc, objects)
    return objects


def _label(obj: dict[str, Any], index: int) -> str:
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return f"{obj.get('kind')} #{index + 1} ({name})" if name else f"{obj.get('kind')} #{index + 1}"


def load_object_nodes(path: str | Path) -> list[NodeFacts]:
    """The Node objects of a YAML/JSON file as NodeFacts (via `kube.node_facts.facts_from_node`)."""
    from gpupack.kube.node_facts import facts_from_node

    path = Path(path)
    nodes: list[NodeFacts] = []
    seen: set[str] = set()
    for index, obj in enumerate(load_objects(path)):
        if obj.get("kind") != "Node":
            continue
        try:
            facts = facts_from_node(obj)
        except (ValueError, KeyError, TypeError) as exc:
            raise TraceError(f"{path}: {_label(obj, index)}: {exc}") from exc
        if facts.name in seen:
            raise TraceError(f"{path}: {_label(obj, index)}: duplicate node name {facts.name!r}")
        seen.add(facts.name)
        nodes.append(facts)
    return nodes


def load_object_pods(path: str | Path) -> list[TracePod]:
    """The Pod objects of a YAML/JSON file as TracePods named "namespace/name", in file order.

    Requests come from `kube.pod_request.request_from_pod`; `qos` is the Pod's `status.qosClass`
    (empty when absent). Pods already bound (spec.nodeName set) are included like any other.
    """
    from gpupack.kube.pod_request import request_from_pod
    from gpupack.kube.pods import pod_key

    path = Path(path)
    pods: list[TracePod] = []
    seen: set[str] = set()
    for index, obj in enumerate(load_objects(path)):
        if obj.get("kind") != "Pod":
            continue
        try:
            name = pod_key(obj)
            request = request_from_pod(obj)
        except (ValueError, KeyError, TypeError) as exc:  # RequestError is a ValueError
            raise TraceError(f"{path}: {_label(obj, index)}: {exc}") from exc
        if name in seen:
            raise TraceError(f"{path}: {_label(obj, index)}: duplicate pod {name!r}")
        seen.add(name)
        status = obj.get("status")
        qos = status.get("qosClass", "") if isinstance(status, dict) else ""
        pods.append(TracePod(name=name, request=request, qos=str(qos or "")))
    return pods
