"""A cluster served from a YAML/JSON file: the same events and writes as a live cluster, in memory.

Accepted file shapes: a list of objects, a ``kind: List`` (or ``NodeList``/``PodList``) object with
``items``, a single object, or several YAML documents of any of these. Node and Pod objects are kept,
PodGroups of ``scheduling.x-k8s.io`` and ``scheduling.volcano.sh`` (gang sizes, #29), and ResourceSlices,
ResourceClaims and DeviceClasses of ``resource.k8s.io`` (the DRA inventory, #30); other kinds are skipped
with a warning. Binds and annotation patches change the in-memory pods and emit
``PodUpserted`` like a watch would, and fail like the API server would (404 unknown pod, 409 uid
mismatch or pod already bound), raising the client's ``ApiException``.
Events on pods are not kept: they are logged.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client.exceptions import ApiException

from gpupack.kube.pods import pod_is_terminal, pod_key
from gpupack.kube.sources.errors import SourceError
from gpupack.kube.sources.events import (
    DraUpserted,
    Event,
    EventHandler,
    GroupUpserted,
    JsonObject,
    NodeUpserted,
    PodUpserted,
    Synced,
    api_group,
    dra_key,
    object_name,
)
from gpupack.kube.sources.kube_api import DRA_KINDS, POD_GROUP_KINDS

logger = logging.getLogger(__name__)

_UID_NAMESPACE = uuid.UUID("6f1c3f1e-8a43-4d1e-9a55-2b7c3c8e0a11")
_GROUP_APIS = frozenset(kind.group for kind in POD_GROUP_KINDS)
_DRA_KINDS = frozenset(kind.kind for kind in DRA_KINDS)
_DRA_API = DRA_KINDS[0].group


@dataclass(slots=True)
class ClusterObjects:
    """The Nodes, Pods, PodGroups and DRA objects of a cluster file, in file order."""

    nodes: list[JsonObject] = field(default_factory=list)
    pods: list[JsonObject] = field(default_factory=list)
    groups: list[JsonObject] = field(default_factory=list)  # PodGroups of either API group (#29)
    dra: list[JsonObject] = field(default_factory=list)  # ResourceSlices, ResourceClaims, DeviceClasses (#30)


def load_cluster_objects(path: str | Path) -> ClusterObjects:
    """Read the Nodes, Pods, PodGroups and DRA objects of a cluster file; raise ``SourceError`` naming file
    and item when malformed.

    Pods, PodGroups and ResourceClaims without ``metadata.namespace`` get ``default``; objects without ``metadata.uid``
    get a stable one derived from kind and name, as the API server would have assigned one.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError(f"{path}: cannot read cluster file: {exc}") from exc
    objects = ClusterObjects()
    seen: dict[tuple[str, str], str] = {}
    for where, item in _items(path, _documents(path, text)):
        kind = _check_object(path, where, item)
        if kind not in _KEPT:
            logger.warning(
                "%s: %s: kind %s ignored (%s; only Node, Pod, the PodGroups of %s and %s %s are used)",
                path, where, kind, item.get("apiVersion"), " and ".join(sorted(_GROUP_APIS)),
                _DRA_API, ", ".join(sorted(_DRA_KINDS)),
            )  # fmt: skip
            continue
        metadata = item["metadata"]
        if kind not in _CLUSTER_SCOPED:
            metadata.setdefault("namespace", "default")
        name = dra_key(item) if kind in _DRA_KINDS else object_name(item) if kind == "Node" else pod_key(item)
        if (kind, name) in seen:
            raise SourceError(f"{path}: {where}: duplicate {kind} {name} (first at {seen[kind, name]})")
        seen[kind, name] = where
        metadata.setdefault("uid", str(uuid.uuid5(_UID_NAMESPACE, f"{kind}/{name}")))
        _kept_list(objects, kind).append(item)
    return objects


def _kept_list(objects: ClusterObjects, kind: str) -> list[JsonObject]:
    """The list of ``objects`` an item of ``kind`` goes to."""
    if kind in _DRA_KINDS:
        return objects.dra
    return objects.nodes if kind == "Node" else objects.pods if kind == "Pod" else objects.groups


def empty_cluster_problem(path: str | Path, objects: ClusterObjects) -> str | None:
    """What is wrong with a cluster file that holds no Node (None when it holds one): every pod would
    find no node, which a server should say rather than serve in silence."""
    if objects.nodes:
        return None
    if objects.pods:
        return (
            f"{path}: no Node objects, only {len(objects.pods)} Pod(s): a pods file given as the cluster? "
            "No pod can be placed"
        )
    return f"{path}: no Node or Pod objects: the cluster is empty and no pod can be placed"


class ClusterFileSource:
    """Serve the cluster described by a file: emits its Nodes and live Pods, then ``Synced``.

    The file is read when the source is constructed, so a malformed file fails at once. Events are
    emitted from the calling thread: by ``start()``, then by every write.
    """

    def __init__(self, path: str | Path, on_event: EventHandler) -> None:
        self.path = Path(path)
        self._on_event = on_event
        loaded = load_cluster_objects(self.path)
        problem = empty_cluster_problem(self.path, loaded)
        if problem:
            logger.warning("%s", problem)
        self._nodes = {object_name(node): node for node in loaded.nodes}
        self._pods = {pod_key(pod): pod for pod in loaded.pods}
        self._groups = loaded.groups
        self._dra = loaded.dra
        self._lock = threading.RLock()
        self._started = False
        self._synced = threading.Event()

    @property
    def synced(self) -> bool:
        """True once ``start()`` emitted the whole file."""
        return self._synced.is_set()

    @property
    def nodes(self) -> list[JsonObject]:
        """Copies of the current Node objects."""
        with self._lock:
            return [copy.deepcopy(node) for node in self._nodes.values()]

    @property
    def pods(self) -> list[JsonObject]:
        """Copies of the current Pod objects, terminal ones included."""
        with self._lock:
            return [copy.deepcopy(pod) for pod in self._pods.values()]

    def start(self) -> None:
        """Emit ``NodeUpserted`` per node, ``PodUpserted`` per non-terminal pod, ``GroupUpserted`` per
        PodGroup, ``DraUpserted`` per ResourceSlice, ResourceClaim and DeviceClass, then ``Synced``."""
        with self._lock:
            if self._started:
                raise RuntimeError("ClusterFileSource already started")
            self._started = True
            for node in self._nodes.values():
                self._emit(NodeUpserted(copy.deepcopy(node)))
            for pod in self._pods.values():
                if not pod_is_terminal(pod):
                    self._emit(PodUpserted(copy.deepcopy(pod)))
            for group in self._groups:
                self._emit(GroupUpserted(copy.deepcopy(group)))
            for obj in self._dra:
                self._emit(DraUpserted(copy.deepcopy(obj)))
            self._emit(Synced())
            self._synced.set()

    def stop(self) -> None:
        """Nothing to stop; present for symmetry with ``KubernetesSource``."""

    def wait_synced(self, timeout: float | None = None) -> bool:
        """True once ``start()`` has run (waits up to ``timeout`` for it)."""
        return self._synced.wait(timeout)

    def create_binding(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        """Set the in-memory pod's ``spec.nodeName``, merge ``annotations`` into its own (both or
        neither, as the API server's Binding does) and emit ``PodUpserted``."""
        with self._lock:
            pod = self._get_pod(namespace, name)
            if uid and pod["metadata"].get("uid") != uid:
                raise ApiException(status=409, reason=f"pod {namespace}/{name}: uid is not {uid}")
            spec = pod.setdefault("spec", {})
            if spec.get("nodeName"):
                reason = f"pod {namespace}/{name} is already assigned to node {spec['nodeName']}"
                raise ApiException(status=409, reason=reason)
            spec["nodeName"] = node
            metadata = pod.setdefault("metadata", {})
            metadata["annotations"] = {**(metadata.get("annotations") or {}), **annotations}
            self._changed(pod)

    def create_event(self, namespace: str, event: JsonObject) -> None:
        """A cluster file keeps no Events: the event is logged (one line, what `kubectl describe` would show)."""
        regarding = event.get("regarding") or {}
        logger.info(
            "event %s %s on pod %s/%s: %s",
            event.get("type"), event.get("reason"), namespace, regarding.get("name"), event.get("note"),
        )  # fmt: skip

    def patch_event(self, namespace: str, name: str, patch: JsonObject) -> None:
        """A repeat of an event already logged: logged at debug level only."""
        logger.debug("event %s/%s seen again: %s", namespace, name, patch.get("series"))

    def _get_pod(self, namespace: str, name: str) -> JsonObject:
        pod = self._pods.get(f"{namespace}/{name}")
        if pod is None:
            raise ApiException(status=404, reason=f'pods "{name}" not found in namespace {namespace}')
        return pod

    def _changed(self, pod: JsonObject) -> None:
        """Replace the stored pod by a fresh copy (consumers may hold the old dict) and announce it."""
        fresh = copy.deepcopy(pod)
        self._pods[pod_key(fresh)] = fresh
        if self._started and not pod_is_terminal(fresh):
            self._emit(PodUpserted(copy.deepcopy(fresh)))

    def _emit(self, event: Event) -> None:
        self._on_event(event)


_KEPT = frozenset({"Node", "Pod", *(f"PodGroup.{group}" for group in _GROUP_APIS), *_DRA_KINDS})
_CLUSTER_SCOPED = frozenset({"Node", "ResourceSlice", "DeviceClass"})


def _documents(path: Path, text: str) -> list[Any]:
    """Parse the file: JSON for ``.json``, else (multi-document) YAML; empty documents are dropped."""
    try:
        if path.suffix.lower() == ".json":
            return [json.loads(text)]
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        return [doc for doc in yaml.load_all(text, Loader=loader) if doc is not None]
    except (ValueError, yaml.YAMLError) as exc:
        language = "JSON" if path.suffix.lower() == ".json" else "YAML"
        raise SourceError(f"{path}: not valid {language}: {exc}") from exc


def _items(path: Path, documents: list[Any]) -> Iterator[tuple[str, Any]]:
    """Flatten documents into ``(location, item)``; location reads "item 3" or "document 2, item 0"."""
    many = len(documents) > 1
    for number, document in enumerate(documents):
        prefix = f"document {number}, " if many else ""
        if isinstance(document, list):
            items, implied_kind = document, None
        elif isinstance(document, dict) and isinstance(document.get("items"), list):
            items, implied_kind = document["items"], _item_kind(document.get("kind"))
        elif isinstance(document, dict) and "kind" in document:
            yield f"{prefix}item 0", document
            continue
        else:
            raise SourceError(
                f"{path}: {prefix or 'document: '}expected a list of objects, a List with items or an object "
                f"with a kind, got {type(document).__name__}"
            )
        for index, item in enumerate(items):
            if implied_kind and isinstance(item, dict):
                item.setdefault("kind", implied_kind)
                item.setdefault("apiVersion", "v1")
            yield f"{prefix}item {index}", item


def _item_kind(list_kind: Any) -> str | None:
    """``NodeList`` → ``Node``; ``List`` and anything else → None."""
    if isinstance(list_kind, str) and list_kind.endswith("List") and list_kind != "List":
        return list_kind[: -len("List")]
    return None


def _check_object(path: Path, where: str, item: Any) -> str:
    """Validate the shape of one kept item and return its kind: ``Node``, ``Pod``, ``PodGroup.<API group>``,
    a DRA kind of resource.k8s.io or, for any other object (a DRA kind of another API group too), its kind
    as written."""
    if not isinstance(item, dict):
        raise SourceError(f"{path}: {where}: expected an object (mapping), got {type(item).__name__}")
    kind = item.get("kind")
    if not isinstance(kind, str) or not kind:
        raise SourceError(f"{path}: {where}: missing kind")
    if kind == "PodGroup" and api_group(item) in _GROUP_APIS:
        kind = f"PodGroup.{api_group(item)}"  # the two PodGroup kinds are distinct objects
    if kind in _DRA_KINDS and api_group(item) != _DRA_API:
        return f"{kind} of {api_group(item) or 'the core API'}"
    if kind not in _KEPT:
        return kind
    metadata = item.get("metadata")
    if not isinstance(metadata, dict) or not isinstance(metadata.get("name"), str) or not metadata["name"]:
        raise SourceError(f"{path}: {where}: {kind} without metadata.name")
    for section in ("spec", "status"):
        if section in item and not isinstance(item[section], dict):
            raise SourceError(f"{path}: {where}: {kind} {metadata['name']}: {section} must be an object")
    if not all(isinstance(metadata.get(part) or {}, dict) for part in ("annotations", "labels")):
        raise SourceError(f"{path}: {where}: {kind} {metadata['name']}: labels/annotations must be objects")
    return kind
