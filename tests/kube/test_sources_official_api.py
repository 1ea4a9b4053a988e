"""OfficialKubeApi through the real ``kubernetes`` client, against a tiny local fake API server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpupack.kube.sources import KubernetesSource, OfficialKubeApi
from tests.kube.test_sources_helpers import make_node, make_pod


class OpenStream:
    """A watch response that sends ``first`` and then stays open until ``release`` is set."""

    def __init__(self, first: bytes) -> None:
        self.first = first
        self.release = threading.Event()


class CannedHttpApiServer:
    """Serves canned responses by (method, path); records every request."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.routes: dict[tuple[str, str], Any] = {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                url = urlsplit(self.path)
                query = {key: values[-1] for key, values in parse_qs(url.query).items()}
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                request = {
                    "method": self.command,
                    "path": url.path,
                    "query": query,
                    "body": body,
                    "content_type": self.headers.get("Content-Type"),
                    "authorization": self.headers.get("Authorization"),
                }
                server.requests.append(request)
                status, payload = server.respond(request)
                if isinstance(payload, OpenStream):  # chunked, like the API server's watch responses
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    if payload.first:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(payload.first), payload.first))
                        self.wfile.flush()
                    payload.release.wait(5)
                    self.wfile.write(b"0\r\n\r\n")
                    return
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = _serve

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.01,), daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def respond(self, request: dict[str, Any]) -> tuple[int, Any]:
        route = self.routes[request["method"], request["path"]]
        return route(request) if callable(route) else route

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


@pytest.fixture
def server() -> Iterator[CannedHttpApiServer]:
    fake = CannedHttpApiServer()
    yield fake
    fake.close()


def official(server: CannedHttpApiServer, page_size: int = 2) -> OfficialKubeApi:
    configuration = client.Configuration(host=server.url)
    return OfficialKubeApi(client.ApiClient(configuration), page_size=page_size)


def strip(obj: dict[str, Any]) -> dict[str, Any]:
    """A list item as the server sends it: without kind and apiVersion."""
    return {key: value for key, value in obj.items() if key not in ("kind", "apiVersion")}


def lines(*events: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(event).encode() + b"\n" for event in events)


def test_list_is_paginated_and_items_get_their_kind(server: CannedHttpApiServer) -> None:
    nodes = [make_node(f"gpu-{i}") for i in range(3)]

    def nodes_page(request: dict[str, Any]) -> tuple[int, Any]:
        if request["query"].get("continue") == "page-2":
            return 200, {
                "kind": "NodeList",
                "metadata": {"resourceVersion": "500"},
                "items": [strip(nodes[2])],
            }
        return 200, {
            "kind": "NodeList",
            "metadata": {"resourceVersion": "500", "continue": "page-2"},
            "items": [strip(n) for n in nodes[:2]],
        }

    server.routes["GET", "/api/v1/nodes"] = nodes_page
    listing = official(server).list_nodes()
    assert listing.resource_version == "500"
    assert listing.items == nodes
    assert [r["query"].get("limit") for r in server.requests] == ["2", "2"]


def test_expired_continue_token_restarts_the_list(server: CannedHttpApiServer) -> None:
    pods = [make_pod("a"), make_pod("b"), make_pod("c")]
    calls = {"n": 0}

    def pods_page(request: dict[str, Any]) -> tuple[int, Any]:
        calls["n"] += 1
        if request["query"].get("continue"):
            if calls["n"] == 2:
                return 410, {
                    "kind": "Status",
                    "code": 410,
                    "reason": "Expired",
                    "message": "continue expired",
                }
            return 200, {"metadata": {"resourceVersion": "700"}, "items": [strip(pods[2])]}
        return 200, {
            "metadata": {"resourceVersion": "700", "continue": "t"},
            "items": [strip(p) for p in pods[:2]],
        }

    server.routes["GET", "/api/v1/pods"] = pods_page
    listing = official(server).list_pods()
    assert [p["metadata"]["name"] for p in listing.items] == ["a", "b", "c"]
    assert calls["n"] == 4


def test_watch_yields_raw_events_and_bookmarks(server: CannedHttpApiServer) -> None:
    node = make_node("gpu-9", "501")
    stream = lines(
        {"type": "ADDED", "object": node},
        {
            "type": "BOOKMARK",
            "object": {"kind": "Node", "apiVersion": "v1", "metadata": {"resourceVersion": "510"}},
        },
    )
    server.routes["GET", "/api/v1/nodes"] = (200, stream)
    events = list(official(server).watch_nodes("500", 30))
    assert events == [
        {"type": "ADDED", "object": node},
        {
            "type": "BOOKMARK",
            "object": {"kind": "Node", "apiVersion": "v1", "metadata": {"resourceVersion": "510"}},
        },
    ]
    query = server.requests[0]["query"]
    assert query["watch"].lower() == "true"
    assert query["resourceVersion"] == "500"
    assert query["allowWatchBookmarks"].lower() == "true"
    assert query["timeoutSeconds"] == "30"


def test_watch_error_410_surfaces_as_api_exception(server: CannedHttpApiServer) -> None:
    gone = {
        "kind": "Status",
        "code": 410,
        "reason": "Expired",
        "message": "too old resource version: 1 (900)",
    }
    server.routes["GET", "/api/v1/pods"] = (
        200,
        lines({"type": "ADDED", "object": make_pod("a", "2")}, {"type": "ERROR", "object": gone}),
    )
    stream = official(server).watch_pods("1", 30)
    assert next(stream)["type"] == "ADDED"
    with pytest.raises(ApiException) as info:
        next(stream)
    assert info.value.status == 410
    assert len(server.requests) == 1  # the client did not resume on its own


def test_create_binding_posts_a_binding_with_uid_and_annotations(server: CannedHttpApiServer) -> None:
    status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
    server.routes["POST", "/api/v1/namespaces/ml/pods/train/binding"] = (201, status)
    official(server).create_binding("ml", "train", "uid-1", "gpu-3", {"gpupack.io/assignment": "{}"})
    assert server.requests[0]["body"] == {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "uid": "uid-1",
            "annotations": {"gpupack.io/assignment": "{}"},
        },
        "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-3"},
    }


def test_a_lean_post_sends_json_with_the_clients_credentials_refreshed(server: CannedHttpApiServer) -> None:
    """Binding and Event POSTs skip the generated methods (#32), not the client's auth: an expiring token is
    refreshed by the configuration's hook before each request, as the generated methods do it."""
    server.routes["POST", "/api/v1/namespaces/ml/pods/train/binding"] = (201, {"kind": "Status"})
    configuration = client.Configuration(host=server.url)
    configuration.api_key = {"authorization": "token-0"}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    tokens = iter(["token-1", "token-2"])
    configuration.refresh_api_key_hook = lambda c: c.api_key.update(authorization=next(tokens))  # type: ignore[assignment]  # the client declares it None
    api = OfficialKubeApi(client.ApiClient(configuration))
    api.create_binding("ml", "train", "uid-1", "gpu-3", {})
    api.create_binding("ml", "train", "uid-1", "gpu-3", {})
    assert [(r["content_type"], r["authorization"]) for r in server.requests] == [
        ("application/json", "Bearer token-1"),
        ("application/json", "Bearer token-2"),
    ]


def test_create_binding_conflict_raises(server: CannedHttpApiServer) -> None:
    conflict = {
        "kind": "Status",
        "code": 409,
        "reason": "Conflict",
        "message": "pod train is already assigned",
    }
    server.routes["POST", "/api/v1/namespaces/ml/pods/train/binding"] = (409, conflict)
    with pytest.raises(ApiException) as info:
        official(server).create_binding("ml", "train", "uid-1", "gpu-3", {})
    assert (info.value.status, info.value.reason) == (409, "Conflict")
    assert "already assigned" in str(info.value.body)


def test_kubernetes_source_end_to_end_and_stop_interrupts_an_open_watch(server: CannedHttpApiServer) -> None:
    """The whole loop over the real client: list both kinds, watch, and stop while a watch is open."""
    node, pod = make_node("gpu-1", "5"), make_pod("train", "6", node="gpu-1")
    added = make_pod("infer", "8", node="gpu-1")
    node_watch = OpenStream(b"")
    pod_watch = OpenStream(lines({"type": "ADDED", "object": added}))

    def nodes(request: dict[str, Any]) -> tuple[int, Any]:
        if request["query"].get("watch"):
            return 200, node_watch
        return 200, {"metadata": {"resourceVersion": "7"}, "items": [strip(node)]}

    def pods(request: dict[str, Any]) -> tuple[int, Any]:
        if request["query"].get("watch"):
            return 200, pod_watch
        return 200, {"metadata": {"resourceVersion": "7"}, "items": [strip(pod)]}

    server.routes["GET", "/api/v1/nodes"] = nodes
    server.routes["GET", "/api/v1/pods"] = pods
    received: list[Any] = []
    got_added = threading.Event()

    def consumer(event: Any) -> None:
        received.append(event)
        if getattr(event, "key", "") == "default/infer":
            got_added.set()

    source = KubernetesSource(official(server), consumer, watch_timeout_seconds=60)
    source.start()
    try:
        assert source.wait_synced(5)
        assert got_added.wait(5)
    finally:
        # the open watches would hold their loops for 60 s: stop must interrupt them, not wait them out
        # (the limit leaves room for a loaded machine; what it checks is that the loops end)
        ended = source.stop(timeout=10)
        node_watch.release.set()
        pod_watch.release.set()
    assert ended
    assert [type(e).__name__ for e in received] == [
        "NodeUpserted",
        "PodUpserted",
        "Synced",
        "PodUpserted",
    ] or [type(e).__name__ for e in received] == ["PodUpserted", "NodeUpserted", "Synced", "PodUpserted"]
    assert source.resource_version("Pod") == "8"
