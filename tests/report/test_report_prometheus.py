"""`gpupack report --prometheus`: a real Prometheus scrapes a small exporter serving DCGM-format series;
the report names the allocated GPUs whose utilisation stayed under 10 %."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpupack.cli import main
from gpupack.report import utilisation
from tests.conftest import needs_data
from tests.extender_helpers import write_cluster
from tests.report.test_report import small_cluster

PROMETHEUS = Path(shutil.which("prometheus") or "/usr/bin/prometheus")
needs_prometheus = needs_data(PROMETHEUS, "Debian's prometheus: apt-get install -y prometheus (.ci/run installs it)")
EXPORTER_POD = {"namespace": "gpu-operator", "pod": "dcgm-exporter-7x2kq"}  # the scrape target's own labels


def dcgm_line(gpu: int, util: float, node: str, namespace: str = "", pod: str = "", mig: str = "", gi: int = 0) -> str:
    """One dcgm-exporter sample, labels as the exporter writes them."""
    labels = (f'gpu="{gpu}",UUID="GPU-{node}-{gpu}",device="nvidia{gpu}",modelName="NVIDIA H100 80GB HBM3",'
              f'Hostname="{node}",container="{"main" if pod else ""}",namespace="{namespace}",pod="{pod}"')  # fmt: skip
    if mig:
        labels += f',GPU_I_PROFILE="{mig}",GPU_I_ID="{gi}"'
    return f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {util}"


EXPOSITION = "\n".join([
    "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
    "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
    dcgm_line(0, 3, "od-a", "team-a", "p1"),
    dcgm_line(1, 80, "od-a", "team-b", "p2"),
    dcgm_line(2, 5, "od-a", "team-b", "p2"),
    dcgm_line(3, 0, "od-a"),  # no pod holds it
    dcgm_line(0, 50, "od-b", "team-a", "p3"),
    *(dcgm_line(0, 2, "mig-d", "team-b", "p4", "1g.10gb", gi) for gi in range(7, 14)),
    dcgm_line(0, 0, "elsewhere", "other", "ghost"),  # a pod the cluster file does not hold
]) + "\n"  # fmt: skip


class Exporter(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = EXPOSITION.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[str]:
    """A Prometheus scraping the exporter every second, with the target labels a ServiceMonitor adds."""
    exporter = ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
    threading.Thread(target=exporter.serve_forever, daemon=True).start()
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "dcgm", "static_configs": [
            {"targets": [f"127.0.0.1:{exporter.server_address[1]}"], "labels": EXPORTER_POD}]}],
    }))  # fmt: skip
    port = free_port()
    log = (tmp_path / "prometheus.log").open("w")
    process = subprocess.Popen(
        [str(PROMETHEUS), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_series(url, process, tmp_path / "prometheus.log")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        exporter.shutdown()
        log.close()


def wait_for_series(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float = 90.0) -> None:
    """Until Prometheus holds a few scrapes of every series."""
    query = url + "/api/v1/query?query=count(count_over_time(DCGM_FI_DEV_GPU_UTIL%5B1m%5D)%20%3E%3D%203)"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"prometheus exited: {log.read_text()[-2000:]}"
        try:
            with urllib.request.urlopen(query, timeout=5) as answer:
                result = json.loads(answer.read())["data"]["result"]
            if result and int(result[0]["value"][1]) == EXPOSITION.count("DCGM_FI_DEV_GPU_UTIL{"):
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"prometheus did not scrape the exporter in {timeout} s: {log.read_text()[-2000:]}")


@needs_prometheus
def test_idle_allocated_gpus_from_a_real_prometheus(
    prometheus: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = write_cluster(tmp_path / "cluster.yaml", small_cluster())
    args = ["report", "--cluster-file", str(cluster), "--prometheus", prometheus, "--window", "1m"]
    assert main([*args, "--json"]) == 0
    utilisation = json.loads(capsys.readouterr().out)["utilisation"]
    idle = [(g["namespace"], g["pod"], g["node"], g["gpu"], g["utilisation_pct"]) for g in utilisation["idle_gpus"]]
    assert idle == [
        ("team-a", "p1", "od-a", "0", 3.0),
        ("team-b", "p2", "od-a", "2", 5.0),
        *[("team-b", "p4", "mig-d", "0 1g.10gb", 2.0)] * 7,
    ]
    assert utilisation["idle_by_namespace"] == {"team-a": 1, "team-b": 8}
    assert utilisation["allocated_gpus_seen"] == 11  # p1 1, p2 2, p3 1, p4 seven MIG instances
    # the free GPU carries the exporter pod's name (Prometheus kept the target's label), and the ghost pod
    assert utilisation["series_of_other_pods"] == 2
    assert main(args) == 0
    assert "allocated but idle GPUs" in capsys.readouterr().out


def test_prometheus_unreachable_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = write_cluster(tmp_path / "cluster.yaml", small_cluster())
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["report", "--cluster-file", str(cluster), "--prometheus", url]) == 2
    assert "cannot query Prometheus" in capsys.readouterr().err
    assert main(["report", "--cluster-file", str(cluster), "--prometheus", url, "--window", "1 hour"]) == 2


class Dripping(BaseHTTPRequestHandler):
    """A Prometheus that answers a valid JSON body, slowly (one byte per 50 ms) or far too large."""

    huge = False

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        with contextlib.suppress(OSError):  # the client hangs up on us: that is the point
            if self.huge:
                self.wfile.write(b'{"status":"success","data":{"resultType":"vector","result":[' + b" " * (4 << 20))
                return
            for byte in b'{"status":"success","data":{"resultType":"vector","result":[]}}' * 100:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.05)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("huge", [False, True], ids=["dripping", "too large"])
def test_a_prometheus_answer_is_bounded_in_time_and_size(monkeypatch: pytest.MonkeyPatch, huge: bool) -> None:
    """#26 (low): a per-read timeout let a dripping server hold the report for ever, and a 150 MB
    answer took 1.6 GB of memory; now the whole answer has a deadline and a size bound."""
    monkeypatch.setattr(utilisation, "TIMEOUT_SECONDS", 1.0)
    monkeypatch.setattr(utilisation, "MAX_ANSWER_BYTES", 1 << 20)
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Server", (Dripping,), {"huge": huge}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        started = time.monotonic()
        with pytest.raises(utilisation.UtilisationError, match="more than 1 MiB" if huge else "within 1 s"):
            utilisation.query(f"http://127.0.0.1:{server.server_address[1]}", "up")
        assert time.monotonic() - started < 10
    finally:
        server.shutdown()
        server.server_close()


def test_a_tenants_own_series_cannot_make_a_busy_gpu_look_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    """#26 low: any workload may publish DCGM-named series; the busiest of one GPU's series counts, a series
    from another node is ignored, and the selector (label matchers only) narrows the query."""
    asked: list[str] = []

    def answer(prometheus: str, promql: str) -> list[tuple[dict[str, str], float]]:
        asked.append(promql)
        real = {"gpu": "0", "Hostname": "od-a", "namespace": "team-a", "pod": "p1"}
        return [(real, 80.0), ({**real, "job": "tenant"}, 1.0), ({**real, "gpu": "1", "Hostname": "od-b"}, 0.0)]

    monkeypatch.setattr(utilisation, "query", answer)
    pods = [{"pod": "team-a/p1", "node": "od-a", "gpus": 1}]
    found = utilisation.idle_gpus("http://p", "1h", 10.0, pods, 'job="dcgm-exporter"')
    assert found["idle_gpus"] == [] and found["allocated_gpus_seen"] == 1 and found["series_from_other_nodes"] == 1
    assert asked == ['avg_over_time(DCGM_FI_DEV_GPU_UTIL{job="dcgm-exporter"}[1h])']
    for forged in ['job="x"}[1h]) or vector(1) #', "job=x", 'job="a",']:
        with pytest.raises(utilisation.UtilisationError, match="--dcgm-selector"):
            utilisation.idle_gpus("http://p", "1h", 10.0, pods, forged)
