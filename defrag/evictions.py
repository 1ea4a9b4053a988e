"""Evicting a pod through the Eviction API (#31): the way PodDisruptionBudgets hold, as `kubectl drain` evicts.

The eviction names the pod's uid as a precondition, so a pod deleted and recreated under the same name since
the plan was made is not evicted by mistake (the API server answers 409: counted as gone). A budget that
allows no disruption now makes the API server answer 429: `Refused`. RBAC: `create` on `pods/eviction`, and
`patch` on `pods` for the hold a move writes on the pending pod it is for (`gpupack.io/defrag-hold`).
"""

from __future__ import annotations

from typing import Protocol

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpupack.errors import GpupackError

HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409
HTTP_TOO_MANY_REQUESTS = 429


class Refused(GpupackError, RuntimeError):
    """The API server refused the eviction now (a PodDisruptionBudget allows no disruption)."""


class Evictor(Protocol):
    """What defrag writes: the hold on the pod a move is for, and the evictions."""

    def evict(self, namespace: str, name: str, uid: str) -> bool:
        """Evict the pod if it is still the one with `uid`: True when evicted, False when it was gone already
        (or is another pod now); `Refused` when a budget forbids it now."""

    def annotate(self, namespace: str, name: str, uid: str, key: str, value: str) -> bool:
        """Set the annotation `key` on the pod if it is still the one with `uid`: False when it is not."""


class OfficialEvictor:
    """`Evictor` over the official client: POST .../pods/{name}/eviction (policy/v1)."""

    def __init__(self, api_client: client.ApiClient | None = None, request_timeout: float = 30.0) -> None:
        self._core = client.CoreV1Api(api_client)
        self._timeout = request_timeout

    def evict(self, namespace: str, name: str, uid: str) -> bool:
        """See `Evictor.evict`."""
        body = client.V1Eviction(
            metadata=client.V1ObjectMeta(name=name, namespace=namespace),
            delete_options=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)),
        )
        try:
            self._core.create_namespaced_pod_eviction(
                name, namespace, body, _preload_content=False, _request_timeout=self._timeout
            )
        except ApiException as exc:
            if exc.status in (HTTP_NOT_FOUND, HTTP_CONFLICT):
                return False
            if exc.status == HTTP_TOO_MANY_REQUESTS:
                raise Refused(f"pod {namespace}/{name}: {exc.reason}: {_message(exc)}") from None
            raise
        return True

    def annotate(self, namespace: str, name: str, uid: str, key: str, value: str) -> bool:
        """See `Evictor.annotate`: a merge patch that names the uid, which the API server checks (409)."""
        patch = {"metadata": {"uid": uid, "annotations": {key: value}}}
        try:
            self._core.patch_namespaced_pod(name, namespace, patch, _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status in (HTTP_NOT_FOUND, HTTP_CONFLICT):
                return False
            raise
        return True


def _message(exc: ApiException) -> str:
    body = exc.body.decode(errors="replace") if isinstance(exc.body, bytes) else str(exc.body or "")
    return body[:300]


__all__ = ["Evictor", "OfficialEvictor", "Refused"]
