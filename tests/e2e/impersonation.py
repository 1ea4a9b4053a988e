"""Requests to the e2e API server as another identity: the admin's client certificate plus impersonation.

`Impersonate-User`, one `Impersonate-Group` header per group and one `Impersonate-Extra-<key>` header
per extra value, the key percent-encoded (a header name cannot hold the `/` of
`authentication.kubernetes.io/node-name`; the API server unescapes it). The admin (`system:masters`)
may impersonate anyone, extras included. Answers are read back as the JSON the server sent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import urllib3

from gpupack.harness.controlplane import ControlPlane

NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"  # the node claim of a pod-bound token
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class Identity:
    """Who a request claims to be: user name, groups and extra fields (as an authenticator sets them)."""

    user: str
    groups: tuple[str, ...] = ("system:authenticated",)
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def headers(self) -> urllib3.HTTPHeaderDict:
        """The impersonation headers, a repeated header per group and per extra value."""
        headers = urllib3.HTTPHeaderDict({"Impersonate-User": self.user})
        for group in self.groups:
            headers.add("Impersonate-Group", group)
        for key, values in self.extra.items():
            for value in values:
                headers.add(f"Impersonate-Extra-{quote(key, safe='')}", value)
        return headers


def service_account(namespace: str, name: str, node: str | None = None) -> Identity:
    """A ServiceAccount's identity as its token authenticates it; `node`: the token's node claim."""
    groups = ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated")
    extra = {NODE_NAME_EXTRA: (node,)} if node is not None else {}
    return Identity(f"system:serviceaccount:{namespace}:{name}", groups, extra)


SCHEDULER = service_account("gpupack-system", "gpupack-scheduler")  # the one identity that may assign GPUs


def binding(pod: Mapping[str, Any], node: str, annotations: Mapping[str, str]) -> dict[str, Any]:
    """The Binding of `pod` (as the API server holds it) to `node`, carrying `annotations`."""
    metadata = {"name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"], "annotations": dict(annotations)}
    return {"apiVersion": "v1", "kind": "Binding", "metadata": metadata, "target": {"kind": "Node", "name": node}}


@dataclass(frozen=True)
class Answer:
    """An API server's status code and JSON body (a Status object when it refused)."""

    status: int
    body: dict[str, Any]

    @property
    def message(self) -> str:
        """The refusal's message ('' on success)."""
        return str(self.body.get("message", "")) if self.status >= 400 else ""


class ApiAs:
    """Raw requests to the control plane's API server as `identity` (None: the admin itself)."""

    def __init__(self, plane: ControlPlane, identity: Identity | None = None) -> None:
        self._url = plane.apiserver_url
        self._identity = identity
        self._pool = urllib3.PoolManager(ssl_context=plane.client_ssl(), retries=False)

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Answer:
        """One request; the answer whatever its status."""
        headers = self._identity.headers() if self._identity else urllib3.HTTPHeaderDict()
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        response = self._pool.request(method, f"{self._url}{path}", body=data, headers=headers, timeout=30)
        text = response.data.decode() or "{}"
        return Answer(response.status, json.loads(text))

    def post(self, path: str, body: Any) -> Answer:
        """POST a JSON body."""
        return self.request("POST", path, body)

    def merge_patch(self, path: str, body: Any) -> Answer:
        """PATCH as application/merge-patch+json."""
        return self.request("PATCH", path, body, MERGE_PATCH)

    def get(self, path: str) -> Answer:
        """GET."""
        return self.request("GET", path)

    def delete(self, path: str) -> Answer:
        """DELETE."""
        return self.request("DELETE", path)
