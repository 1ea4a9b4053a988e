"""Where `gpupack explain` reads the cluster and the pod: a cluster file and a one-pod file, or a live cluster.

Both fill a `ClusterState` through the very events the extender applies: the cluster file through
`ClusterFileSource`, a live cluster through the list calls and event mapping of
`KubernetesSource` (`node_spec` / `pod_spec`: same requests, same live-pod rule). The pod being
explained is left out of the cluster in both, so a bound pod is explained as if it were placed now,
its own GPUs free again. The DRA objects (ResourceSlices, ResourceClaims, DeviceClasses) come along where the
cluster serves them, and the ResourceClaims are kept by `namespace/name` for the pod's claims section.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from urllib3.exceptions import HTTPError

from gpupack.extender.settings import Settings
from gpupack.extender.state import ClusterState
from gpupack.kube.pods import pod_is_terminal, pod_key
from gpupack.kube.sources import (
    DRA_KINDS,
    ClusterFileSource,
    DraApi,
    Event,
    EventHandler,
    JsonObject,
    KubeApi,
    OfficialKubeApi,
    PodUpserted,
    SourceError,
    Synced,
    load_cluster_objects,
    load_kube_config,
)
from gpupack.kube.sources.events import dra_key
from gpupack.kube.sources.kubeconfig import KubeConfigChoice, choose_kube_config, first_current_context
from gpupack.kube.sources.kubernetes_source import KindSpec, dra_spec, node_spec, pod_spec

IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass
class Loaded:
    """The cluster without the pod, the pod, and where both came from (for the report)."""

    state: ClusterState
    pod: JsonObject
    source: str
    claims: dict[str, JsonObject] = field(default_factory=dict)  # ResourceClaims by namespace/name (#30)


def load_from_files(settings: Settings, cluster_file: str, pod_file: str) -> Loaded:
    """The cluster file (minus the pod, when it holds it) and the one Pod of `pod_file`."""
    pod = load_pod_file(pod_file)
    state = ClusterState(settings)
    ClusterFileSource(cluster_file, _without(pod_key(pod), state)).start()
    claims = {dra_key(obj): obj for obj in load_cluster_objects(cluster_file).dra if obj.get("kind") == "ResourceClaim"}
    return Loaded(state, pod, f"cluster file {cluster_file}", claims)


def load_pod_file(path: str) -> JsonObject:
    """The one Pod in a YAML/JSON file; SourceError otherwise."""
    pods = load_cluster_objects(path).pods
    if len(pods) != 1:
        raise SourceError(f"{path}: expected exactly one Pod, found {len(pods)}")
    return pods[0]


def load_from_cluster(settings: Settings, kubeconfig: str | None, ref: str, namespace: str | None) -> Loaded:
    """The live cluster of `kubeconfig` (else kubectl's choice: `choose_kube_config`) and its pod `ref`
    (NAMESPACE/NAME, or NAME in `namespace`, else the kubeconfig context's namespace, else `default`)."""
    choice = choose_kube_config(kubeconfig)
    key = pod_ref_key(ref, namespace or context_namespace(choice))
    api = OfficialKubeApi(load_kube_config(kubeconfig), request_timeout=30.0)
    state, pod, claims = load_live(settings, api, key)
    return Loaded(state, pod, f"cluster of {choice.origin}", claims)


def load_live(settings: Settings, api: KubeApi, key: str) -> tuple[ClusterState, JsonObject, dict[str, JsonObject]]:
    """One list of Nodes, one of Pods and one of each DRA kind the cluster serves, applied as
    `KubernetesSource` applies its first lists; the pod `key` (`namespace/name`) is returned instead of
    applied, with the ResourceClaims by `namespace/name`. SourceError when the pod is missing or done, or
    uses claims that cannot be listed."""
    state = ClusterState(settings)
    apply = _without(key, state)
    found: JsonObject | None = None
    for spec in (node_spec(api), pod_spec(api)):
        for obj in _list(spec):
            if spec.kind == "Pod" and spec.key(obj) == key:
                found = obj
            if spec.live(obj):
                apply(spec.upserted(obj))
    if found is None:
        raise SourceError(f"pod {key} not found")
    if pod_is_terminal(found):
        phase = (found.get("status") or {}).get("phase")
        raise SourceError(f"pod {key} has finished ({phase}): it holds and needs no GPU")
    claims = _apply_dra(api, apply, needed=bool((found.get("spec") or {}).get("resourceClaims")))
    apply(Synced())
    return state, found, claims


def _list(spec: KindSpec) -> list[JsonObject]:
    try:
        return list(spec.list().items)
    except (ApiException, HTTPError, OSError) as exc:
        raise SourceError(f"cannot list {spec.kind}s: {_api_reason(exc)}") from None


def _apply_dra(api: KubeApi, apply: EventHandler, needed: bool) -> dict[str, JsonObject]:
    """Apply every DRA object the cluster serves; the ResourceClaims by key. A kind that cannot be listed is
    left out (a cluster without DRA, or a kubeconfig without its RBAC) unless `needed`: then SourceError."""
    if not isinstance(api, DraApi):
        return {}
    claims: dict[str, JsonObject] = {}
    for kind in DRA_KINDS:
        spec = dra_spec(api, kind)
        try:
            listing = _list(spec)
        except SourceError:
            if needed:
                raise
            continue
        for obj in listing:
            apply(spec.upserted(obj))
            if kind.kind == "ResourceClaim":
                claims[spec.key(obj)] = obj
    return claims


def context_namespace(choice: KubeConfigChoice) -> str | None:
    """The namespace of the current context (kubectl's: the first a file sets; in-cluster: the pod's
    own), if it names one."""
    if choice.in_cluster:
        try:
            return IN_CLUSTER_NAMESPACE.read_text().strip() or None
        except OSError:
            return None
    try:
        contexts, current = kube_config.list_kube_config_contexts(config_file=choice.config_file)
    except (ConfigException, OSError, TypeError, KeyError):
        return None  # load_kube_config reports an unusable kubeconfig
    name = first_current_context(choice.files)
    chosen = next((c for c in contexts or () if c.get("name") == name), None) if name else current
    return (chosen or {}).get("context", {}).get("namespace") or None


def pod_ref_key(ref: str, namespace: str | None) -> str:
    """`namespace/name` of a pod given as NAMESPACE/NAME, or as NAME (in `namespace`, else default)."""
    if ref.count("/") > 1 or not all(ref.split("/")):
        raise SourceError(f"pod {ref!r}: expected NAMESPACE/NAME or NAME")
    return ref if "/" in ref else f"{namespace or 'default'}/{ref}"


def _without(key: str, state: ClusterState) -> EventHandler:
    """`state.apply`, leaving out every event about the pod `key` (a bound pod does not crowd itself)."""

    def apply(event: Event) -> None:
        if isinstance(event, PodUpserted) and event.key == key:
            return
        state.apply(event)

    return apply


def _api_reason(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}"
    return str(exc) or type(exc).__name__
