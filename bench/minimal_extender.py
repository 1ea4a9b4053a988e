"""The throughput limit: the least a kube-scheduler extender can do, on the standard library alone (#32).

A threaded `http.server` speaking HTTP/1.1 with keep-alive: `/filter` answers the first candidate, found by
a byte search of the body (`filter_answer`); `/prioritize` answers no scores; `/bind`
POSTs one pre-assembled Binding over a kept-alive TLS connection taken from a pool. No event loop, no
framework, no state: what is left of a run's CPU is kube-scheduler's, the API server's and etcd's, so
gpupack's pods/s against this one says how close gpupack is to the limit of the rig.

kube-scheduler binds in parallel and keeps only some of its connections to the extender idle, so it keeps
opening new ones, each served by a new thread. The API server connections are therefore pooled, not kept
per thread: a thread per connection with a TLS connection of its own paid a handshake per new connection,
and the server listens with a backlog of `BACKLOG` (socketserver's default of 5 overflowed under a burst).
A bind slower than `SLOW_BIND_SECONDS` is logged with where its time went.

    python -m gpupack.bench.minimal_extender --kubeconfig PATH --port PORT
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import queue
import ssl
import sys
import time
from urllib.parse import urlsplit

from gpupack.kube.sources.kube_api import load_kube_config

OK = b'{"Error":""}'
NO_NODE = b'{"NodeNames":[],"FailedNodes":{},"FailedAndUnresolvableNodes":{},"Error":"no candidates"}'
BACKLOG = 1024  # pending connections the listening socket holds
SLOW_BIND_SECONDS = 1.0


def first_candidate(body: bytes) -> bytes | None:
    """The first name of `NodeNames` (nodeCacheCapable: true), as its JSON string bytes."""
    start = body.find(b'"NodeNames":[')
    if start < 0:
        return None
    first = body.find(b'"', start + len(b'"NodeNames":['))
    end = body.find(b'"', first + 1)
    return body[first : end + 1] if 0 <= first < end else None


def filter_answer(body: bytes) -> bytes:
    """ExtenderFilterResult that keeps the first candidate only."""
    name = first_candidate(body)
    if name is None:
        return NO_NODE
    return b'{"NodeNames":[' + name + b'],"FailedNodes":{},"FailedAndUnresolvableNodes":{},"Error":""}'


class Binder:
    """Kept-alive TLS connections to the API server, shared by the handler threads; a Binding POST per call."""

    def __init__(self, kubeconfig: str) -> None:
        configuration = load_kube_config(kubeconfig).configuration
        self.api = urlsplit(configuration.host)
        self.tls = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
        self.tls.load_cert_chain(configuration.cert_file, configuration.key_file)
        self.idle: queue.LifoQueue[http.client.HTTPSConnection] = queue.LifoQueue()

    def bind(self, body: bytes) -> bytes:
        """The Binding of ExtenderBindingArgs `body`, its fields cut out by byte search; the answer's Error."""
        name, namespace, uid, node = (_string(body, key) for key in (b"PodName", b"PodNamespace", b"PodUID", b"Node"))
        binding = (
            b'{"apiVersion":"v1","kind":"Binding","metadata":{"name":"%s","namespace":"%s","uid":"%s"},'
            b'"target":{"apiVersion":"v1","kind":"Node","name":"%s"}}' % (name, namespace, uid, node)
        )
        path = f"/api/v1/namespaces/{namespace.decode()}/pods/{name.decode()}/binding"
        try:
            status, _ = self.post(path, binding)
        except (OSError, http.client.HTTPException) as exc:  # the answer carries it; kube-scheduler retries the pod
            return b'{"Error":"%s"}' % type(exc).__name__.encode()
        return OK if status < 300 else b'{"Error":"HTTP %d"}' % status

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """POST JSON `body` over an idle pooled connection, or a new one: (status, answer body). Raises OSError or
        http.client.HTTPException (the connection is then dropped)."""
        started = time.perf_counter()
        try:
            connection, fresh = self.idle.get_nowait(), False
        except queue.Empty:
            connection = http.client.HTTPSConnection(self.api.hostname, self.api.port, context=self.tls, timeout=30)
            fresh = True
        try:
            connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            answer = response.status, response.read()
        except BaseException:
            connection.close()
            raise
        self.idle.put(connection)
        took = time.perf_counter() - started
        if took > SLOW_BIND_SECONDS:
            print(f"slow bind: {took:.2f} s ({'new' if fresh else 'pooled'} connection) {path}", file=sys.stderr)
        return answer


def _string(body: bytes, key: bytes) -> bytes:
    """The value of the JSON string field `key` (names, uids and node names need no unescaping)."""
    start = body.find(b'"%s":"' % key) + len(key) + 4
    return body[start : body.find(b'"', start)]


def handler_for(binder: Binder) -> type[http.server.BaseHTTPRequestHandler]:
    """The request handler class of a server that binds through `binder`."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as kube-scheduler's client expects
        disable_nagle_algorithm = True  # else a keep-alive answer can wait ~40 ms for a delayed ACK

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path == "/filter":
                self._answer(filter_answer(body))
            elif self.path == "/bind":
                self._answer(binder.bind(body))
            else:
                self._answer(b"[]")

        def do_GET(self) -> None:
            self._answer(b'{"status":"ok"}')

        def _answer(self, content: bytes) -> None:
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(content)
            self.wfile.write(head + content)  # one write: headers and body in one segment

        def log_message(self, format: str, *args: object) -> None:
            """No access log: it would cost more than the answer."""

    return Handler


class Server(http.server.ThreadingHTTPServer):
    """The threaded server, with a listen backlog a burst of kube-scheduler's connections fits in."""

    request_queue_size = BACKLOG
    daemon_threads = True


def main() -> None:
    """Serve the minimal extender on 127.0.0.1 until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    server = Server(("127.0.0.1", args.port), handler_for(Binder(args.kubeconfig)))
    server.serve_forever()


if __name__ == "__main__":
    main()
