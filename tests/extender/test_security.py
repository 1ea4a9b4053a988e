"""Security defaults: loopback unless told otherwise, optional TLS, size and time limits, quiet logs.

The size limit itself is proven by tests/extender/test_app_bad_input.py::test_body_over_the_limit_gets_413
(with and without Content-Length); RBAC least privilege by tests/extender/test_rbac_usage.py.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from fastapi.testclient import TestClient
from kubernetes.client.exceptions import ApiException

from gpupack.bench.speed import free_port, stop_process
from gpupack.cli import build_parser
from gpupack.extender.app import create_app
from gpupack.extender.http_protocol import HEAD_TOO_LARGE
from gpupack.extender.logs import JsonFormatter
from gpupack.extender.service import uvicorn_config
from gpupack.extender.settings import Settings, load_settings
from gpupack.extender.state import ClusterState
from gpupack.kube.sources import PodUpserted
from tests.extender_helpers import EXAMPLE_CLUSTER, L4, file_state, live_server, node, pod, write_cluster

LOOPBACK_HEX = "0100007F"  # 127.0.0.1 as /proc/net/tcp spells it


# --- listen address ----------------------------------------------------------------------------------


def test_default_listen_address_is_loopback() -> None:
    assert Settings().host == "127.0.0.1"
    args = build_parser().parse_args(["serve", "--cluster-file", "c.yaml"])
    assert args.host is None and args.tls_cert is None and args.tls_key is None
    settings = load_settings(args.config, host=args.host, port=args.port)
    assert settings.host == "127.0.0.1"
    assert uvicorn_config(object(), settings, args).host == "127.0.0.1"
    told = build_parser().parse_args(["serve", "--host", "0.0.0.0"])
    assert load_settings(None, host=told.host).host == "0.0.0.0"  # only when told


def listening_addresses(port: int) -> set[str]:
    """Local addresses (hex, as in /proc/net/tcp) of the sockets listening on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if int(hex_port, 16) == port and fields[3] == "0A":  # 0A: LISTEN
                found.add(address)
    return found


@contextmanager
def gpupack_serve(*extra: str) -> Iterator[int]:
    """`gpupack serve --cluster-file <example>` in a child process; yields its port once it answers."""
    port = free_port()
    command = [sys.executable, "-m", "gpupack.cli", "serve", "--cluster-file", str(EXAMPLE_CLUSTER)]
    child = subprocess.Popen([*command, "--port", str(port), *extra], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not listening_addresses(port):
            assert child.poll() is None, child.stderr.read() if child.stderr else "exited"
            assert time.monotonic() < deadline, "gpupack serve did not start listening"
            time.sleep(0.1)
        yield port
    finally:
        stop_process(child, grace=10)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc/net/tcp to read listeners")
def test_gpupack_serve_listens_on_loopback_only() -> None:
    with gpupack_serve() as port:
        assert listening_addresses(port) == {LOOPBACK_HEX}
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200


# --- TLS -----------------------------------------------------------------------------------------------


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (openssl CLI; cryptography is not a dependency)."""
    cert, key = folder / "tls.crt", folder / "tls.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


needs_openssl = pytest.mark.skipif(
    shutil.which("openssl") is None, reason="no openssl CLI to make a self-signed certificate"
)


@pytest.mark.slow
@needs_openssl
def test_tls_serves_https_with_the_given_certificate(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    with gpupack_serve("--tls-cert", str(cert), "--tls-key", str(key)) as port:
        with httpx.Client(verify=httpx.create_ssl_context(verify=str(cert)), timeout=10) as client:
            response = client.get(f"https://127.0.0.1:{port}/healthz")
            assert response.status_code == 200 and response.json() == {"status": "ok"}
            assert response.http_version == "HTTP/1.1"
        with pytest.raises(httpx.HTTPError):  # the certificate is not trusted by default
            httpx.get(f"https://127.0.0.1:{port}/healthz", timeout=10)
        with pytest.raises(httpx.HTTPError):  # and plain HTTP is not served on the TLS port
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10)


# --- time limit ----------------------------------------------------------------------------------------


@pytest.fixture
def small_cluster(tmp_path: Path) -> tuple[ClusterState, Settings]:
    path = write_cluster(tmp_path / "c.yaml", [node("a", L4, 2), pod("p", gpus=1)])
    settings = Settings(verb_timeout_seconds=0.3)
    state, _ = file_state(path, settings)
    return state, settings


@pytest.mark.slow
def test_a_slow_verb_is_answered_in_its_own_terms_within_the_limit(small_cluster) -> None:
    """A filter that finds the state's lock busy waits in a worker thread, not on the event loop: it is
    answered at the time limit, and other requests are served meanwhile."""
    state, settings = small_cluster
    client = TestClient(create_app(state, settings))
    body = orjson.dumps({"Pod": pod("p", gpus=1), "Nodes": None, "NodeNames": ["a"]})
    held, release = threading.Event(), threading.Event()

    def hold_the_lock() -> None:
        with state.lock:  # as a long relist would
            held.set()
            release.wait(5)

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    held.wait(5)
    try:
        started = time.perf_counter()
        response = client.post("/filter", content=body)
        took = time.perf_counter() - started
        assert response.status_code == 200 and "took longer than 0.3 s" in response.json()["Error"]
        assert took < 0.9
        assert client.get("/healthz").status_code == 200  # answered while the filter still waits
    finally:
        release.set()
        holder.join(5)
    deadline = time.monotonic() + 5
    while not state.book.live() and time.monotonic() < deadline:
        time.sleep(0.01)  # the waiting filter now decides and reserves
    retry = client.post("/filter", content=body).json()  # kube-scheduler retries: the late decision is reused
    assert retry["NodeNames"] == ["a"] and len(state.book.live()) == 1 and state.book.ended == {}


def read_response(sock: socket.socket) -> str:
    """One whole HTTP response with a Content-Length (headers and body may arrive in separate reads)."""

    def more() -> bytes:
        chunk = sock.recv(4096)
        assert chunk, "the connection closed before the whole response arrived"
        return chunk

    data = b""
    while b"\r\n\r\n" not in data:
        data += more()
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += more()
    return (head + b"\r\n\r\n" + body).decode()


def test_a_body_that_does_not_arrive_in_time_gets_408(small_cluster) -> None:
    state, settings = small_cluster
    with live_server(state, settings) as (host, port):
        with socket.create_connection((host, port), timeout=5) as sock:
            head = "POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
            sock.sendall(head.encode() + b'{"Pod": ')  # ... and then nothing more
            started = time.perf_counter()
            answer = read_response(sock)
            assert answer.startswith("HTTP/1.1 408") and "not received within 0.3 s" in answer
            assert time.perf_counter() - started < 2
        assert httpx.get(f"http://{host}:{port}/healthz").status_code == 200


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes `sock` within `seconds` (anything it sends first is read and dropped)."""
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def test_connections_whose_headers_do_not_arrive_are_closed(small_cluster) -> None:
    """Half a request line, or nothing at all, holds a connection for `headerTimeoutSeconds`, not for
    ever; a request in progress and an idle keep-alive connection are left alone (#13)."""
    state, _ = small_cluster
    settings = Settings(verb_timeout_seconds=0.3, header_timeout_seconds=0.5)
    with live_server(state, settings) as (host, port):
        half = socket.create_connection((host, port), timeout=5)
        half.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        silent = socket.create_connection((host, port), timeout=5)
        kept = socket.create_connection((host, port), timeout=5)
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(kept).startswith("HTTP/1.1 200")
        started = time.perf_counter()
        assert closed_within(half, 3) and closed_within(silent, 3)
        assert time.perf_counter() - started < 2
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # idle past the deadline, still served
        assert read_response(kept).startswith("HTTP/1.1 200")
        for sock in (half, silent, kept):
            sock.close()


def test_connections_beyond_the_cap_are_closed_at_once(small_cluster) -> None:
    state, _ = small_cluster
    settings = Settings(max_connections=3, header_timeout_seconds=30)
    with live_server(state, settings) as (host, port):
        held = [socket.create_connection((host, port), timeout=5) for _ in range(3)]
        time.sleep(0.2)  # accepted
        extra = socket.create_connection((host, port), timeout=5)
        assert closed_within(extra, 2)
        held.pop().close()
        time.sleep(0.2)
        assert httpx.get(f"http://{host}:{port}/healthz").status_code == 200  # a freed slot serves again
        for sock in [*held, extra]:
            sock.close()


def test_a_request_head_over_the_limit_gets_431_and_is_not_served(small_cluster) -> None:
    """httptools keeps no limit on a request's head; gpupack's protocol answers 431 past 16 KiB, closes the
    connection and never hands the request to the app (#32); a head under the limit is served."""
    state, settings = small_cluster
    fill = "x" * 1000
    with live_server(state, settings) as (host, port):
        with socket.create_connection((host, port), timeout=5) as sock:
            head = "POST /bind HTTP/1.1\r\nHost: x\r\n" + "".join(f"X-Fill-{i}: {fill}\r\n" for i in range(20))
            sock.sendall((head + "Content-Length: 2\r\n\r\n{}").encode())
            sock.settimeout(3)
            received = b""
            while chunk := sock.recv(4096):  # until the server closes
                received += chunk
        assert received.startswith(b"HTTP/1.1 431") and b"over 16 KiB" in received
        assert received.count(b"HTTP/1.1 ") == 1  # nothing answered the request itself
        with socket.create_connection((host, port), timeout=5) as sock:  # one header that never ends
            started, received = time.perf_counter(), b""
            try:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Endless: ")
                for _ in range(100):
                    sock.sendall(b"y" * 8192)
                while chunk := sock.recv(4096):
                    received += chunk
            except OSError:
                pass  # the close may reach us as a reset, before or instead of the 431
            assert time.perf_counter() - started < 2  # closed for its size, not at the 5 s header deadline
            assert received in (b"", HEAD_TOO_LARGE)
        under = {f"X-Fill-{i}": fill for i in range(14)}
        assert httpx.get(f"http://{host}:{port}/healthz", headers=under).status_code == 200


def test_each_refused_connection_is_logged_once_with_its_reason_and_counted(
    small_cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """The brief's rule for bad input, for the HTTP guards: one log line naming the reason (uvicorn's own
    reasonless warning for an unparseable request is dropped) and `gpupack_connections_refused_total`."""
    state, _ = small_cluster
    settings = Settings(max_connections=2, header_timeout_seconds=0.5, metrics_max_age_seconds=0)
    caplog.set_level(logging.INFO)
    with live_server(state, settings) as (host, port):
        with socket.create_connection((host, port), timeout=5) as garbled:
            garbled.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            assert read_response(garbled).startswith("HTTP/1.1 400")
        with socket.create_connection((host, port), timeout=5) as big:
            big.sendall(b"GET /healthz HTTP/1.1\r\nX-Big: " + b"y" * 20_000 + b"\r\n\r\n")
            assert closed_within(big, 3)
        silent = [socket.create_connection((host, port), timeout=5) for _ in range(2)]
        time.sleep(0.2)
        extra = socket.create_connection((host, port), timeout=5)  # the third while two are open
        assert closed_within(extra, 2) and all(closed_within(sock, 3) for sock in silent)
        metrics = httpx.get(f"http://{host}:{port}/metrics").text
        for sock in (*silent, extra):
            sock.close()
    counted = {
        line.split('"')[1]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("gpupack_connections_refused_total{")
    }
    assert counted == {"head-too-large": 1, "header-timeout": 2, "too-many-connections": 1, "unparseable": 1}
    refusals = [record.getMessage() for record in caplog.records if record.name.endswith("http_protocol")]
    assert len(refusals) == 5 and sum("431" in line for line in refusals) == 1
    assert sum("not valid HTTP" in line for line in refusals) == 1
    assert not [record for record in caplog.records if record.getMessage() == "Invalid HTTP request received."]


# --- logs ----------------------------------------------------------------------------------------------

SECRETS = ("hunter2-db-password", "tok-3f9a-SECRET", "registry.example.com/secret-image", "--api-key=")


def secret_pod(name: str) -> dict:
    obj = pod(name, gpus=1)
    container = obj["spec"]["containers"][0]
    container["image"] = "registry.example.com/secret-image:1.0"
    container["env"] = [
        {"name": "DB_PASSWORD", "value": "hunter2-db-password"},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
    ]
    container["args"] = ["--api-key=tok-3f9a-SECRET"]
    obj["spec"]["containers"].append({**container, "name": "sidecar", "resources": {"limits": {"cpu": "x"}}})
    return obj


class Refusing:
    """A cluster writer whose every call fails with `error`."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def create_binding(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        raise self.error

    def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        raise self.error

    def patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        raise self.error


def test_logs_never_carry_pod_specs_or_secrets(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bound_garbage = secret_pod("bound")
    bound_garbage["spec"]["nodeName"] = "a"  # a bound pod with an unreadable request: logged as a warning
    path = write_cluster(tmp_path / "c.yaml", [node("a", L4, 4), secret_pod("ok"), secret_pod("fails")])
    settings = Settings()
    with caplog.at_level(logging.DEBUG):
        state, source = file_state(path, settings)
        client = TestClient(create_app(state, settings))
        for obj in source.pods:
            obj["spec"]["containers"].pop()  # a readable request this time
            args = orjson.dumps({"Pod": obj, "Nodes": None, "NodeNames": ["a"]})
            assert client.post("/filter", content=args).json()["NodeNames"] == ["a"]
            client.post("/prioritize", content=args)
        bind = {"PodName": "ok", "PodNamespace": "default", "PodUID": "uid-default-ok", "Node": "a"}
        assert client.post("/bind", json=bind).json() == {"Error": ""}

        leaky = ApiException(status=422, reason="Unprocessable")
        leaky.body = orjson.dumps(secret_pod("fails")).decode()  # an API error echoing the whole pod
        state.writer = Refusing(leaky)
        bind = {**bind, "PodName": "fails", "PodUID": "uid-default-fails"}
        assert "HTTP 422" in client.post("/bind", json=bind).json()["Error"]
        state.apply(PodUpserted(bound_garbage))
        client.post("/filter", content=orjson.dumps({"Pod": secret_pod("bad"), "Nodes": None, "NodeNames": ["a"]}))
    lines = [JsonFormatter().format(record) for record in caplog.records]
    assert any('"msg":"decision"' in line for line in lines)  # decisions were logged...
    assert any("request is unreadable" in line for line in lines) and any("HTTP 422" in line for line in lines)
    for line in lines:  # ...but never what the pod carries
        for secret in SECRETS:
            assert secret not in line, line
        assert '"containers"' not in line and '"env"' not in line and "secretKeyRef" not in line, line


def test_uvicorn_access_log_is_off() -> None:
    config = uvicorn_config(object(), Settings(), argparse.Namespace(tls_cert=None, tls_key=None))
    assert config.access_log is False


def test_within_leaves_the_slow_work_running() -> None:
    from gpupack.extender.app import TooSlow, within

    async def scenario() -> list[str]:
        done: list[str] = []

        async def work() -> bytes:
            await asyncio.sleep(0.2)
            done.append("finished")
            return b"late"

        with pytest.raises(TooSlow):
            await within(work(), 0.05)
        await asyncio.sleep(0.3)
        return done

    assert asyncio.run(scenario()) == ["finished"]
