"""JSON POSTs of gpupack's hot writes (a Binding per bind, an Event per bind) without the client's per-call cost.

The official client's generated methods validate every argument with pydantic, build and serialise a model
and only then send: under the real kube-scheduler that was about a quarter of gpupack's CPU (#32,
bench/results/throughput.md). `LeanPost` sends the JSON bytes gpupack already has through the same
`ApiClient`: its connection pool (TLS, proxy), its credentials (`Configuration.auth_settings`, which also
refreshes an expiring token) and its user agent. A non-2xx answer raises the client's own `ApiException`
with the status, reason and body, as the generated methods do.

Each POST is named after the generated method whose request it sends (`LEAN_POSTS`): the RBAC test reads the
calls from those names, and a test holds each path to the generated method's own.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

# generated method -> (its API class, its path)
LEAN_POSTS: dict[str, tuple[type, str]] = {
    "create_namespaced_pod_binding": (client.CoreV1Api, "/api/v1/namespaces/{namespace}/pods/{name}/binding"),
    "create_namespaced_event": (client.EventsV1Api, "/apis/events.k8s.io/v1/namespaces/{namespace}/events"),
}


class LeanPost:
    """POST JSON bytes as one of `LEAN_POSTS` through `api_client` (see the module docstring)."""

    def __init__(self, api_client: client.ApiClient, timeout: tuple[float, float]) -> None:
        self._api_client = api_client
        self._timeout = urllib3.Timeout(connect=timeout[0], read=timeout[1])

    def __call__(self, method: str, body: bytes, **path: str) -> bytes:
        """Send `body` to the path of `method` with `path`'s parameters; the answer's body. Raises ApiException."""
        _, template = LEAN_POSTS[method]
        configuration = self._api_client.configuration
        url = configuration.host + template.format(**{key: quote(value, safe="") for key, value in path.items()})
        response = self._api_client.rest_client.pool_manager.request(
            "POST", url, body=body, headers=self._headers(configuration), timeout=self._timeout, preload_content=False
        )
        try:
            data: bytes = response.data
        finally:
            response.release_conn()
        if not 200 <= response.status <= 299:
            raise ApiException(status=response.status, reason=response.reason, body=data.decode(errors="replace"))
        return data

    def _headers(self, configuration: Any) -> dict[str, str]:
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": self._api_client.user_agent,
        }
        for auth in configuration.auth_settings().values():
            if auth.get("in") == "header" and auth.get("value"):
                headers[auth["key"]] = auth["value"]
        return headers


__all__ = ["LEAN_POSTS", "LeanPost"]
