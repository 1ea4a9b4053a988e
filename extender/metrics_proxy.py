"""`python -m gpupack.extender.metrics_proxy`: the sidecar's /metrics on the pod IP, and nothing else.

The extender listens on 127.0.0.1 only, so that /filter and /bind are never reachable from outside the
pod (manifests/deployment.yaml). Prometheus scrapes the pod IP: this small server, run as a third
container of the scheduler pod, answers `GET /metrics` by fetching the extender's own /metrics over
loopback and `GET /healthz` for its probes; every other path and method gets 404/405. It holds no
state and parses nothing, so it cannot be made to change what the extender decides.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

logger = logging.getLogger(__name__)
UPSTREAM_TIMEOUT_SECONDS = 10.0
# A client that connects and sends nothing (or stops mid-request) is dropped after this long: the
# server holds a thread per connection, and idle ones would otherwise pile up without bound.
CLIENT_IDLE_SECONDS = 30.0
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class MetricsProxy(BaseHTTPRequestHandler):
    """GET /metrics from `upstream`, GET /healthz; nothing else."""

    upstream = "http://127.0.0.1:8888/metrics"  # set per server by `make_server`
    server_version = "gpupack-metrics"
    timeout = CLIENT_IDLE_SECONDS  # socket timeout of each connection (socketserver.StreamRequestHandler)

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._answer(200, b"ok\n", "text/plain")
        elif self.path == "/metrics":
            try:
                with urllib.request.urlopen(self.upstream, timeout=UPSTREAM_TIMEOUT_SECONDS) as answer:
                    body = answer.read()
                    content_type = answer.headers.get("Content-Type", CONTENT_TYPE)
            except (urllib.error.URLError, OSError) as exc:
                self._answer(503, f"the extender's /metrics is not reachable: {exc}\n".encode(), "text/plain")
                return
            self._answer(200, body, content_type)
        else:
            self._answer(404, b"only /metrics and /healthz are served here\n", "text/plain")

    def do_POST(self) -> None:
        self._answer(405, b"read-only: GET /metrics\n", "text/plain")

    do_PUT = do_DELETE = do_PATCH = do_POST

    def _answer(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        logger.debug(format, *args)


def make_server(
    host: str, port: int, upstream: str, idle_seconds: float = CLIENT_IDLE_SECONDS
) -> ThreadingHTTPServer:
    """The proxy's server (not started), forwarding /metrics to `upstream`; idle clients dropped after
    `idle_seconds`."""
    handler = type("BoundMetricsProxy", (MetricsProxy,), {"upstream": upstream, "timeout": idle_seconds})
    return ThreadingHTTPServer((host, port), handler)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until interrupted."""
    parser = argparse.ArgumentParser(prog="python -m gpupack.extender.metrics_proxy", description=__doc__)
    parser.add_argument("--host", default="0.0.0.0", help="listen address (default 0.0.0.0: the pod IP)")
    parser.add_argument("--port", type=int, default=9090, help="listen port (default 9090)")
    parser.add_argument("--upstream", default=MetricsProxy.upstream, help="the extender's /metrics URL")
    args = parser.parse_args(argv)
    if not args.upstream.startswith("http://127.0.0.1:"):
        print("--upstream must be the extender on loopback (http://127.0.0.1:PORT/metrics)", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO)
    server = make_server(args.host, args.port, args.upstream)
    logger.info("serving %s on %s:%d", args.upstream, args.host, args.port)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
