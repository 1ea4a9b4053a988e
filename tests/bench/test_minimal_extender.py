"""bench.minimal_extender (#32): the throughput limit answers kube-scheduler's calls correctly, on one
kept-alive connection, and binds what ExtenderBindingArgs names over pooled TLS connections to the API server."""

from __future__ import annotations

import http.client
import http.server
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import orjson
import pytest

from gpupack.bench.minimal_extender import Binder, _string, handler_for
from gpupack.harness.certificates import Certificates, make_certificates
from gpupack.harness.controlplane import write_kubeconfig


class RecordingBinder:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def bind(self, body: bytes) -> bytes:
        self.bodies.append(body)
        return b'{"Error":""}'


@pytest.fixture
def served() -> Iterator[tuple[http.client.HTTPConnection, RecordingBinder]]:
    binder = RecordingBinder()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler_for(cast(Binder, binder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=5)
    yield connection, binder
    connection.close()
    server.shutdown()


def post(connection: http.client.HTTPConnection, path: str, body: object) -> object:
    connection.request("POST", path, body=orjson.dumps(body), headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200
    return orjson.loads(response.read())


def test_filter_keeps_the_first_candidate_and_the_connection_stays_open(
    served: tuple[http.client.HTTPConnection, RecordingBinder],
) -> None:
    connection, _ = served
    args = {"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["n-7", "n-2"]}
    assert post(connection, "/filter", args) == {
        "NodeNames": ["n-7"], "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""
    }  # fmt: skip
    socket_before = connection.sock
    assert post(connection, "/prioritize", args) == []
    assert connection.sock is socket_before  # HTTP/1.1 keep-alive: the same connection


def test_bind_hands_the_binding_args_to_the_binder(served: tuple[http.client.HTTPConnection, RecordingBinder]) -> None:
    connection, binder = served
    args = {"PodName": "p-1", "PodNamespace": "ns", "PodUID": "u-1", "Node": "n-3"}
    assert post(connection, "/bind", args) == {"Error": ""}
    assert [orjson.loads(b) for b in binder.bodies] == [args]


def test_string_fields_are_cut_out_of_the_body() -> None:
    body = orjson.dumps({"PodName": "p-1", "PodNamespace": "ns", "PodUID": "u-1", "Node": "n-3"})
    fields = [_string(body, k) for k in (b"PodName", b"PodNamespace", b"PodUID", b"Node")]
    assert fields == [b"p-1", b"ns", b"u-1", b"n-3"]


class FakeApiServer(http.server.ThreadingHTTPServer):
    """A TLS HTTP/1.1 server standing in for the API server's Binding endpoint: it records each POST with the
    client port it came from, and answers 201, or closes the connection unanswered while `drop` is set."""

    daemon_threads = True

    def __init__(self, certs: Certificates) -> None:
        self.posts: list[tuple[int, str, dict[str, object]]] = []
        self.drop = False
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = orjson.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if server.drop:
                    self.close_connection = True
                    return
                server.posts.append((self.client_address[1], self.path, body))
                self.send_response(201)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(certs.ca_cert))
        tls.load_cert_chain(str(certs.serving_cert), str(certs.serving_key))
        tls.verify_mode = ssl.CERT_REQUIRED  # the admin client certificate, as kube-apiserver asks for it
        self.socket = tls.wrap_socket(self.socket, server_side=True)


@pytest.fixture(scope="module")
def api_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeApiServer, Path]]:
    folder = tmp_path_factory.mktemp("pki")
    certs = make_certificates(folder)
    server = FakeApiServer(certs)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = write_kubeconfig(folder / "kubeconfig", f"https://127.0.0.1:{server.server_address[1]}", certs)
    yield server, kubeconfig
    server.shutdown()


@pytest.fixture
def bound_through(api_server: tuple[FakeApiServer, Path]) -> tuple[FakeApiServer, Binder]:
    """The fake API server with no POSTs yet, and a new Binder of its kubeconfig."""
    server, kubeconfig = api_server
    server.posts.clear()
    return server, Binder(str(kubeconfig))


def binding_args(i: int) -> bytes:
    return orjson.dumps({"PodName": f"p-{i}", "PodNamespace": "ns", "PodUID": f"u-{i}", "Node": "n-3"})


def test_binds_from_one_thread_after_another_share_one_kept_alive_connection(
    bound_through: tuple[FakeApiServer, Binder],
) -> None:
    server, binder = bound_through
    for i in range(5):  # kube-scheduler's connections come and go, each served by a new thread
        thread = threading.Thread(target=binder.bind, args=(binding_args(i),))
        thread.start()
        thread.join()
    assert len(server.posts) == 5
    assert len({port for port, _, _ in server.posts}) == 1  # no TLS handshake per thread
    _, path, body = server.posts[0]
    assert path == "/api/v1/namespaces/ns/pods/p-0/binding"
    assert body == {
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p-0", "namespace": "ns", "uid": "u-0"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "n-3"},
    }  # fmt: skip


def test_a_failed_connection_is_dropped_and_the_next_bind_opens_a_new_one(
    bound_through: tuple[FakeApiServer, Binder],
) -> None:
    server, binder = bound_through
    assert binder.bind(binding_args(1)) == b'{"Error":""}'
    server.drop = True
    try:
        answer = binder.bind(binding_args(2))
    finally:
        server.drop = False
    assert answer.startswith(b'{"Error":"') and answer != b'{"Error":""}'  # kube-scheduler retries the pod
    assert binder.bind(binding_args(3)) == b'{"Error":""}'
    assert [body["metadata"] for _, _, body in server.posts] == [
        {"name": "p-1", "namespace": "ns", "uid": "u-1"}, {"name": "p-3", "namespace": "ns", "uid": "u-3"}
    ]  # fmt: skip
    assert server.posts[0][0] != server.posts[1][0]  # the dropped connection was not reused
