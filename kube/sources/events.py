"""The event vocabulary every cluster source speaks, and helpers on raw API objects.

Objects are plain JSON dicts exactly as the API server sends them (camelCase keys). A source emits:

- ``NodeUpserted`` / ``PodUpserted`` — the object exists in this state (new or changed);
- ``NodeDeleted`` / ``PodDeleted`` — the object is gone (a pod also "goes" when it turns terminal:
  a Succeeded or Failed pod no longer consumes resources);
- ``BudgetUpserted`` / ``BudgetDeleted`` — PodDisruptionBudgets, from sources that watch them (a live
  cluster whose API offers them; a cluster file has none);
- ``GroupUpserted`` / ``GroupDeleted`` — PodGroups of scheduler-plugins (``scheduling.x-k8s.io``) and
  Volcano (``scheduling.volcano.sh``), for gang placement (#29): from a live cluster that serves their
  CRDs, and from the PodGroup objects of a cluster file;
- ``DraUpserted`` / ``DraDeleted`` — ResourceSlices, ResourceClaims and DeviceClasses of ``resource.k8s.io``
  (#30, the DRA inventory): from a live cluster that serves that API (whichever of v1, v1beta2, v1beta1 it
  serves), and from those objects in a cluster file;
- ``Synced`` — the consumer's picture now equals a fresh list: emitted once after the initial lists of
  every kind have been applied, and again after every relist.

A relist is translated by the source itself into Deleted events for objects that vanished while the watch
was down plus Upserted events for everything present, so a consumer that simply applies events in order
converges to exactly the state of a fresh list; it never needs to diff on its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpupack.kube.pods import pod_key

JsonObject = dict[str, Any]


@dataclass(frozen=True, slots=True)
class NodeUpserted:
    """A Node exists with this content (added or modified)."""

    node: JsonObject

    @property
    def name(self) -> str:
        """The node's name."""
        return object_name(self.node)


@dataclass(frozen=True, slots=True)
class NodeDeleted:
    """The Node called ``name`` is gone."""

    name: str


@dataclass(frozen=True, slots=True)
class PodUpserted:
    """A non-terminal Pod exists with this content (added or modified)."""

    pod: JsonObject

    @property
    def key(self) -> str:
        """The pod's ``namespace/name``."""
        return pod_key(self.pod)

    @property
    def uid(self) -> str:
        """The pod's ``metadata.uid``."""
        return object_uid(self.pod)


@dataclass(frozen=True, slots=True)
class PodDeleted:
    """The Pod ``key`` (``namespace/name``) with ``uid`` is gone or terminal."""

    key: str
    uid: str


@dataclass(frozen=True, slots=True)
class BudgetUpserted:
    """A policy/v1 PodDisruptionBudget exists with this content (#28: victims that would break one)."""

    budget: JsonObject

    @property
    def key(self) -> str:
        """The budget's ``namespace/name``."""
        return pod_key(self.budget)


@dataclass(frozen=True, slots=True)
class BudgetDeleted:
    """The PodDisruptionBudget ``key`` (``namespace/name``) with ``uid`` is gone."""

    key: str
    uid: str


@dataclass(frozen=True, slots=True)
class GroupUpserted:
    """A PodGroup exists with this content (#29: the ``minMember`` of a gang)."""

    group: JsonObject

    @property
    def key(self) -> str:
        """The group's ``namespace/name``."""
        return pod_key(self.group)

    @property
    def uid(self) -> str:
        """The group's ``metadata.uid``."""
        return object_uid(self.group)

    @property
    def api(self) -> str:
        """The group's API group, from its apiVersion: ``scheduling.x-k8s.io`` or ``scheduling.volcano.sh``."""
        return api_group(self.group)


@dataclass(frozen=True, slots=True)
class GroupDeleted:
    """The PodGroup ``key`` (``namespace/name``) with ``uid`` of the API group ``api`` is gone."""

    key: str
    uid: str
    api: str


@dataclass(frozen=True, slots=True)
class DraUpserted:
    """A ResourceSlice, ResourceClaim or DeviceClass exists with this content (#30: the DRA inventory)."""

    obj: JsonObject

    @property
    def kind(self) -> str:
        """The object's kind: ``ResourceSlice``, ``ResourceClaim`` or ``DeviceClass``."""
        return str(self.obj.get("kind") or "")

    @property
    def key(self) -> str:
        """``namespace/name`` of a ResourceClaim, the name of a (cluster-scoped) slice or class."""
        return dra_key(self.obj)

    @property
    def uid(self) -> str:
        """The object's ``metadata.uid``."""
        return object_uid(self.obj)


@dataclass(frozen=True, slots=True)
class DraDeleted:
    """The ``kind`` object (``ResourceSlice``, ``ResourceClaim``, ``DeviceClass``) ``key`` with ``uid`` is gone."""

    kind: str
    key: str
    uid: str


@dataclass(frozen=True, slots=True)
class Synced:
    """Every kind has been (re)listed: the events so far describe exactly a fresh list."""


Event = (
    NodeUpserted
    | NodeDeleted
    | PodUpserted
    | PodDeleted
    | BudgetUpserted
    | BudgetDeleted
    | GroupUpserted
    | GroupDeleted
    | DraUpserted
    | DraDeleted
    | Synced
)
EventHandler = Callable[[Event], None]


def object_name(obj: JsonObject) -> str:
    """Return ``metadata.name`` of a raw object ("" when missing)."""
    return str((obj.get("metadata") or {}).get("name") or "")


def object_uid(obj: JsonObject) -> str:
    """Return ``metadata.uid`` of a raw object ("" when missing)."""
    return str((obj.get("metadata") or {}).get("uid") or "")


def api_group(obj: JsonObject) -> str:
    """The API group of a raw object's ``apiVersion`` ("" for the core group or when missing)."""
    group, slash, _ = str(obj.get("apiVersion") or "").rpartition("/")
    return group if slash else ""


def dra_key(obj: JsonObject) -> str:
    """How a DRA object is known: ``namespace/name`` when namespaced (claims), else its name."""
    namespace = (obj.get("metadata") or {}).get("namespace")
    return f"{namespace}/{object_name(obj)}" if namespace else object_name(obj)


def resource_version(obj: JsonObject) -> str | None:
    """Return ``metadata.resourceVersion`` of a raw object, or None."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict):
        return None
    value = metadata.get("resourceVersion")
    return str(value) if value else None
