"""The writes gpupack makes as DRA's device chooser (#30 item 2): claims read fresh, the finalizer, the allocation,
and the pod's scheduling gate removed.

Each write carries the object's `resourceVersion`, so a claim or pod someone else changed since it was read
is refused (409, `Conflict`) instead of overwritten; the caller reads again and plans again. RBAC
(charts/gpupack/templates/rbac.yaml): `get`, `update` on `resourceclaims`; `update` on `resourceclaims/status`
and, from Kubernetes 1.36, on `resourceclaims/binding` (the API server's check for writing `status.allocation`);
`patch` on `pods` for the gate.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpupack.errors import GpupackError
from gpupack.kube.dra.objects import API_GROUP

JsonObject = dict[str, Any]
VERSIONS = ("v1", "v1beta2", "v1beta1")
HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409


class Conflict(GpupackError, RuntimeError):
    """The object changed (or went) since it was read: read it again and plan again."""


class DraWriter(Protocol):
    """What the DRA allocator reads and writes."""

    def get_claim(self, namespace: str, name: str) -> JsonObject | None:
        """The claim as the API server has it now (None when there is none)."""

    def replace_claim(self, claim: JsonObject) -> JsonObject:
        """PUT the claim (its metadata changed); Conflict on a stale resourceVersion."""

    def replace_claim_status(self, claim: JsonObject) -> JsonObject:
        """PUT the claim's status; Conflict on a stale resourceVersion."""

    def remove_gate(self, pod: JsonObject, gate: str) -> None:
        """Remove `gate` from the pod's scheduling gates; Conflict when the pod changed since it was read."""


class OfficialDraWriter:
    """`DraWriter` over the official client (resource.k8s.io through CustomObjectsApi, pods through CoreV1Api)."""

    def __init__(self, api_client: client.ApiClient | None = None, request_timeout: float = 30.0) -> None:
        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)
        self._timeout = request_timeout
        self._version = VERSIONS[0]

    def get_claim(self, namespace: str, name: str) -> JsonObject | None:
        """See `DraWriter.get_claim`; asks v1, then the older versions, as the API serves them."""
        for version in (self._version, *(v for v in VERSIONS if v != self._version)):
            try:
                claim = self._call(
                    self._custom.get_namespaced_custom_object, API_GROUP, version, namespace, "resourceclaims", name
                )
            except ApiException as exc:
                if exc.status != HTTP_NOT_FOUND:
                    raise
                continue
            self._version = version
            return claim
        return None

    def replace_claim(self, claim: JsonObject) -> JsonObject:
        """See `DraWriter.replace_claim`."""
        return self._replace(self._custom.replace_namespaced_custom_object, claim)

    def replace_claim_status(self, claim: JsonObject) -> JsonObject:
        """See `DraWriter.replace_claim_status`."""
        return self._replace(self._custom.replace_namespaced_custom_object_status, claim)

    def remove_gate(self, pod: JsonObject, gate: str) -> None:
        """See `DraWriter.remove_gate`: a JSON patch that tests the resourceVersion, then sets the other gates."""
        metadata = pod.get("metadata") or {}
        name, namespace = str(metadata.get("name")), str(metadata.get("namespace"))
        gates = [g for g in (pod.get("spec") or {}).get("schedulingGates") or [] if g.get("name") != gate]
        patch: list[dict[str, Any]] = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": metadata.get("resourceVersion")},
            {"op": "replace", "path": "/spec/schedulingGates", "value": gates},
        ]
        try:
            self._core.patch_namespaced_pod(
                name, namespace, patch, _content_type="application/json-patch+json", _request_timeout=self._timeout
            )
        except ApiException as exc:
            if exc.status in (HTTP_CONFLICT, HTTP_NOT_FOUND, 422):  # 422: the test op failed
                raise Conflict(
                    f"pod {metadata.get('namespace')}/{metadata.get('name')} changed: {exc.reason}"
                ) from None
            raise

    def _replace(self, func: Callable[..., Any], claim: JsonObject) -> JsonObject:
        metadata = claim.get("metadata") or {}
        version = str(claim.get("apiVersion", f"{API_GROUP}/{self._version}")).partition("/")[2] or self._version
        try:
            return self._call(
                partial(func, API_GROUP, version, metadata.get("namespace"), "resourceclaims", metadata.get("name")),
                body=claim,
            )
        except ApiException as exc:
            if exc.status in (HTTP_CONFLICT, HTTP_NOT_FOUND):
                raise Conflict(f"claim {metadata.get('namespace')}/{metadata.get('name')}: {exc.reason}") from None
            raise

    def _call(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> JsonObject:
        response = func(*args, **kwargs, _preload_content=False, _request_timeout=self._timeout)
        try:
            loaded: JsonObject = orjson.loads(response.data)
            return loaded
        finally:
            response.release_conn()


__all__ = ["Conflict", "DraWriter", "OfficialDraWriter"]
