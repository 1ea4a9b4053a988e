"""bench.minimal_extender (#32): the throughput limit answers kube-scheduler's calls correctly, on one
kept-alive connection, and binds what ExtenderBindingArgs names."""

from __future__ import annotations

import http.client
import http.server
import threading
from collections.abc import Iterator
from typing import cast

import orjson
import pytest

from gpupack.bench.minimal_extender import Binder, _string, handler_for


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
