"""The few Kubernetes API calls gpupack needs, behind a small protocol, and their real implementation.

``KubeApi`` is everything the sources, the binder and the pod events use; tests substitute a scripted
fake. ``BudgetApi`` (PodDisruptionBudgets), ``GroupApi`` (PodGroups, custom resources) and ``DraApi``
(ResourceSlices, ResourceClaims, DeviceClasses) are optional: a source reads those kinds only from an API
that has them. ``OfficialKubeApi`` implements all four over the official ``kubernetes`` client.

Why raw JSON instead of the client's models: lists are requested with ``_preload_content=False`` and
parsed with orjson. A cluster can hold tens of thousands of pods; building the client's pydantic models
for each and then turning them back into dicts (``sanitize_for_serialization``) costs seconds, and a field
the pinned client does not know or validates too strictly would make a whole list fail. Watches go
through the client's list methods too, each line parsed once with orjson (``watch_stream.WatchStream``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol, runtime_checkable

import orjson
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from gpupack.kube.sources.errors import SourceError
from gpupack.kube.sources.events import JsonObject
from gpupack.kube.sources.kubeconfig import choose_kube_config, first_current_context
from gpupack.kube.sources.lean_post import LeanPost
from gpupack.kube.sources.watch_stream import WatchEvent, WatchStream

"""A raw watch event: ``{"type": "ADDED"|"MODIFIED"|"DELETED"|"BOOKMARK"|"ERROR", "object": {...}}``."""

HTTP_GONE = 410
HTTP_NOT_FOUND = 404  # a list of a custom resource whose CRD is not installed


BIND_CONNECTIONS = 40  # TLS connections kept to the API server: anyio runs up to 40 binds at once


@dataclass(frozen=True, slots=True)
class ObjectList:
    """The items of a (complete, possibly paginated) list and the list's resourceVersion."""

    items: list[JsonObject] = field(default_factory=list)
    resource_version: str = ""


class EventWriter(Protocol):
    """Events about pods (events.k8s.io/v1, extender.pod_events); a cluster file only logs them."""

    def create_event(self, namespace: str, event: JsonObject) -> None:
        """Create an events.k8s.io/v1 Event (its JSON, camelCase keys) in ``namespace``."""
        ...

    def patch_event(self, namespace: str, name: str, patch: JsonObject) -> None:
        """Merge-patch the Event ``name`` (a series' count and last observed time)."""
        ...


class ClusterWriter(EventWriter, Protocol):
    """The binder's one write and the events on pods; a cluster file implements them in memory."""

    def create_binding(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        """Bind the pod to ``node`` and merge ``annotations`` into its own, in one write that happens
        only if the pod's uid is still ``uid`` (the API server's Binding subresource does exactly this)."""
        ...


class KubeApi(ClusterWriter, Protocol):
    """Exactly the Kubernetes API calls gpupack makes."""

    def list_nodes(self) -> ObjectList:
        """List every Node."""
        ...

    def watch_nodes(self, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        """Watch Nodes from ``resource_version`` with bookmarks; the server ends it after the timeout."""
        ...

    def list_pods(self) -> ObjectList:
        """List every Pod of every namespace."""
        ...

    def watch_pods(self, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        """Watch Pods of every namespace from ``resource_version`` with bookmarks."""
        ...


@runtime_checkable
class BudgetApi(Protocol):
    """PodDisruptionBudgets (policy/v1), for preemption's victims (#28); a source watches them when its API has them."""

    def list_pdbs(self) -> ObjectList:
        """List every PodDisruptionBudget of every namespace."""
        ...

    def watch_pdbs(self, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        """Watch PodDisruptionBudgets of every namespace from ``resource_version`` with bookmarks."""
        ...


@dataclass(frozen=True, slots=True)
class PodGroupKind:
    """One PodGroup custom resource gpupack reads (#29), named as the custom objects API names it."""

    group: str
    version: str
    plural: str = "podgroups"

    @property
    def api_version(self) -> str:
        """``group/version``, as the objects' apiVersion reads."""
        return f"{self.group}/{self.version}"


POD_GROUP_KINDS = (
    PodGroupKind("scheduling.x-k8s.io", "v1alpha1"),  # scheduler-plugins' coscheduling, Kueue, Kubeflow
    PodGroupKind("scheduling.volcano.sh", "v1beta1"),  # Volcano
)


@runtime_checkable
class GroupApi(Protocol):
    """PodGroups of every namespace, for gang placement (#29); a source watches them when its API has them.

    Both calls raise ``ApiException`` with status 404 where the cluster does not serve ``kind``.
    """

    def list_pod_groups(self, kind: PodGroupKind) -> ObjectList:
        """List every PodGroup of ``kind`` of every namespace."""
        ...

    def watch_pod_groups(self, kind: PodGroupKind, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        """Watch PodGroups of ``kind`` of every namespace from ``resource_version`` with bookmarks."""
        ...


@dataclass(frozen=True, slots=True)
class DraKind:
    """One resource.k8s.io kind gpupack reads (#30), and the versions to ask for it, newest first."""

    kind: str
    plural: str
    group: str = "resource.k8s.io"
    # v1 is served from Kubernetes 1.34; 1.33 serves v1beta2 and v1beta1 (v1beta1 nests device fields in `basic`)
    versions: tuple[str, ...] = ("v1", "v1beta2", "v1beta1")


DRA_KINDS = (
    DraKind("ResourceSlice", "resourceslices"),
    DraKind("ResourceClaim", "resourceclaims"),  # of every namespace
    DraKind("DeviceClass", "deviceclasses"),
)


@runtime_checkable
class DraApi(Protocol):
    """ResourceSlices, ResourceClaims and DeviceClasses (#30, the DRA inventory); a source watches them when its
    API has them. Both calls raise ``ApiException`` with status 404 where the cluster serves no version of ``kind``.
    """

    def list_dra(self, kind: DraKind) -> ObjectList:
        """List every object of ``kind`` (claims: of every namespace), in the newest version the API serves."""
        ...

    def watch_dra(self, kind: DraKind, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        """Watch objects of ``kind`` from ``resource_version`` with bookmarks, in the version last listed."""
        ...


def load_kube_config(kubeconfig_path: str | None) -> client.ApiClient:
    """Return an API client configured as kubectl would be (`kubeconfig.choose_kube_config`):
    ``kubeconfig_path`` when given, else $KUBECONFIG, else ~/.kube/config, else in-cluster."""
    choice = choose_kube_config(kubeconfig_path)
    configuration = client.Configuration()
    try:
        if choice.in_cluster:
            config.load_incluster_config(client_configuration=configuration)
        else:
            context = first_current_context(choice.files)
            config.load_kube_config(config_file=choice.config_file, context=context, client_configuration=configuration)
    except (ConfigException, OSError) as exc:
        hint = " (pass --kubeconfig or set $KUBECONFIG when outside a cluster)" if choice.in_cluster else ""
        raise SourceError(f"cannot load Kubernetes config from {choice.origin}{hint}: {exc}") from exc
    # Binds run in parallel worker threads; urllib3's default pool (5 per CPU) threw away a TLS
    # connection per overflowing bind ("Connection pool is full"; bench/results/throughput.md measures binds).
    configuration.connection_pool_maxsize = BIND_CONNECTIONS
    return client.ApiClient(configuration)


class OfficialKubeApi:
    """``KubeApi``, ``BudgetApi``, ``GroupApi`` and ``DraApi`` over the official client's APIs and
    ``kubernetes.watch.Watch``.

    Lists are paginated (``page_size`` items a request) and restarted from scratch when a continue
    token expires, so the result is one consistent snapshot. Watches get a client-side read timeout of
    ``timeout_seconds + read_grace`` so a silently dead connection cannot hang a loop forever.
    """

    def __init__(
        self,
        api_client: client.ApiClient | None = None,
        *,
        page_size: int = 500,
        connect_timeout: float = 10.0,
        request_timeout: float = 60.0,
        read_grace: float = 30.0,
    ) -> None:
        api_client = api_client if api_client is not None else client.ApiClient()
        self._core = client.CoreV1Api(api_client)
        self._events = client.EventsV1Api(api_client)
        self._policy = client.PolicyV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._post = LeanPost(api_client, (connect_timeout, request_timeout))
        self._page_size = page_size
        self._connect_timeout = connect_timeout
        self._request_timeout = (connect_timeout, request_timeout)
        self._read_grace = read_grace
        self._dra_versions: dict[str, str] = {}  # DRA kind -> the version the API last served it in

    def list_nodes(self) -> ObjectList:
        """List every Node (raw dicts)."""
        return self._list(self._core.list_node, "Node")

    def list_pods(self) -> ObjectList:
        """List every Pod of every namespace (raw dicts)."""
        return self._list(self._core.list_pod_for_all_namespaces, "Pod")

    def watch_nodes(self, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        """Watch Nodes from ``resource_version``; see ``WatchStream``."""
        return self._watch(self._core.list_node, resource_version, timeout_seconds)

    def watch_pods(self, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        """Watch Pods of every namespace from ``resource_version``; see ``WatchStream``."""
        return self._watch(self._core.list_pod_for_all_namespaces, resource_version, timeout_seconds)

    def list_pdbs(self) -> ObjectList:
        """List every PodDisruptionBudget of every namespace (raw dicts)."""
        return self._list(
            self._policy.list_pod_disruption_budget_for_all_namespaces, "PodDisruptionBudget", "policy/v1"
        )

    def watch_pdbs(self, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        """Watch PodDisruptionBudgets of every namespace from ``resource_version``; see ``WatchStream``."""
        return self._watch(
            self._policy.list_pod_disruption_budget_for_all_namespaces, resource_version, timeout_seconds
        )

    def list_pod_groups(self, kind: PodGroupKind) -> ObjectList:
        """List every PodGroup of ``kind`` of every namespace (raw dicts)."""
        return self._list(
            partial(self._custom.list_cluster_custom_object, kind.group, kind.version, kind.plural),
            "PodGroup",
            kind.api_version,
        )

    def watch_pod_groups(self, kind: PodGroupKind, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        """Watch PodGroups of ``kind`` of every namespace from ``resource_version``; see ``WatchStream``."""
        return self._watch(
            partial(self._custom.list_cluster_custom_object, kind.group, kind.version, kind.plural),
            resource_version,
            timeout_seconds,
        )

    def list_dra(self, kind: DraKind) -> ObjectList:
        """List every object of ``kind`` (raw dicts), asking for its versions newest first until one is served
        (404 is "not this version"); 404 from all of them is raised."""
        known = self._dra_versions.get(kind.kind)
        versions = [known, *(v for v in kind.versions if v != known)] if known else list(kind.versions)
        missing: ApiException | None = None
        for version in versions:
            try:
                listing = self._list(
                    partial(self._custom.list_cluster_custom_object, kind.group, version, kind.plural),
                    kind.kind,
                    f"{kind.group}/{version}",
                )
            except ApiException as exc:
                if exc.status != HTTP_NOT_FOUND:
                    raise
                missing = exc
                continue
            self._dra_versions[kind.kind] = version
            return listing
        self._dra_versions.pop(kind.kind, None)
        raise missing or ApiException(status=HTTP_NOT_FOUND, reason=f"{kind.kind} is not served")

    def watch_dra(self, kind: DraKind, resource_version: str, timeout_seconds: int) -> Iterator[WatchEvent]:
        """Watch objects of ``kind`` from ``resource_version`` in the version last listed; see ``WatchStream``."""
        version = self._dra_versions.get(kind.kind, kind.versions[0])
        return self._watch(
            partial(self._custom.list_cluster_custom_object, kind.group, version, kind.plural),
            resource_version,
            timeout_seconds,
        )

    def create_binding(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        """POST /api/v1/namespaces/{namespace}/pods/{name}/binding, uid precondition included.

        The API server sets ``spec.nodeName`` and merges the Binding's ``metadata.annotations`` into
        the pod in one update (``BindingREST.setPodHostAndAnnotations``): nothing to undo on failure.
        Sent as JSON bytes (``LeanPost``); the answer (a Status) is not read.
        """
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "annotations": dict(annotations)},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        self._post("create_namespaced_pod_binding", orjson.dumps(body), namespace=namespace, name=name)

    def create_event(self, namespace: str, event: JsonObject) -> None:
        """POST /apis/events.k8s.io/v1/namespaces/{namespace}/events, the event's JSON as it is (``LeanPost``;
        its ``eventTime`` a MicroTime string, as ``extender.pod_events.micro_time`` writes it)."""
        self._post("create_namespaced_event", orjson.dumps(dict(event)), namespace=namespace)

    def patch_event(self, namespace: str, name: str, patch: JsonObject) -> None:
        """PATCH /apis/events.k8s.io/v1/namespaces/{namespace}/events/{name} as a JSON merge patch."""
        response = self._events.patch_namespaced_event(
            name,
            namespace,
            dict(patch),
            _content_type="application/merge-patch+json",
            _preload_content=False,
            _request_timeout=self._request_timeout,
        )
        _drain(response)

    def _list(self, func: Callable[..., Any], kind: str, api_version: str = "v1") -> ObjectList:
        restarts = 0
        while True:
            try:
                return self._list_pages(func, kind, api_version)
            except _ContinueExpired:
                restarts += 1
                if restarts >= 3:
                    raise ApiException(status=HTTP_GONE, reason=f"{kind} list kept expiring") from None

    def _list_pages(self, func: Callable[..., Any], kind: str, api_version: str = "v1") -> ObjectList:
        items: list[JsonObject] = []
        list_version = ""
        token: str | None = None
        while True:
            try:
                response = func(
                    limit=self._page_size,
                    _continue=token,
                    _preload_content=False,
                    _request_timeout=self._request_timeout,
                )
            except ApiException as exc:
                if exc.status == HTTP_GONE and token:
                    raise _ContinueExpired from exc
                raise
            page = orjson.loads(_drain(response))
            metadata = page.get("metadata") or {}
            list_version = list_version or str(metadata.get("resourceVersion") or "")
            for item in page.get("items") or []:
                # List items come without kind/apiVersion; watch objects carry them. Make both alike.
                item.setdefault("kind", kind)
                item.setdefault("apiVersion", api_version)
                items.append(item)
            token = metadata.get("continue") or None
            if token is None:
                return ObjectList(items=items, resource_version=list_version)

    def _watch(self, func: Callable[..., Any], resource_version: str, timeout_seconds: int) -> WatchStream:
        return WatchStream(
            func,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
            request_timeout=(self._connect_timeout, timeout_seconds + self._read_grace),
        )


class _ContinueExpired(Exception):
    """A pagination continue token expired mid-list; the list must restart."""


def _drain(response: Any) -> bytes:
    """Read a non-preloaded urllib3 response fully and give its connection back to the pool."""
    try:
        return response.data
    finally:
        response.release_conn()
