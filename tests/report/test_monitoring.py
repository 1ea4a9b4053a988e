"""Monitoring (#16 item 5): the pool gauges on /metrics, the Grafana dashboard's queries against what a
running app really exposes, the metrics proxy, and the Service / ServiceMonitor / PodDisruptionBudget."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpupack.extender.metrics_proxy import make_server
from gpupack.extender.settings import Settings
from gpupack.report.build import build_report
from gpupack.report.snapshot import read_cluster_file
from tests.extender_helpers import EXAMPLE_CLUSTER, ROOT, file_state, live_server, write_cluster
from tests.report.test_report import small_cluster

MANIFESTS = ROOT / "manifests"
DASHBOARD = ROOT / "charts" / "gpupack" / "dashboards" / "gpupack.json"
PROMQL_WORDS = {
    "sum", "max", "min", "avg", "count", "by", "without", "on", "ignoring", "group_left", "group_right",
    "rate", "irate", "increase", "histogram_quantile", "and", "or", "unless", "offset", "bool", "topk",
}  # fmt: skip


def scrape(host: str, port: int) -> str:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as answer:
        return answer.read().decode()


def exposed_names(text: str) -> set[str]:
    """Every sample name of a Prometheus text exposition (counters' _total, histograms' _bucket, ...)."""
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


@pytest.fixture(scope="module")
def example_scrape() -> str:
    """/metrics of the app serving the example cluster, after one filter call (so latency series exist)."""
    state, _ = file_state(EXAMPLE_CLUSTER)
    with live_server(state, Settings()) as (host, port):
        container = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
        pod = {"metadata": {"name": "p", "namespace": "default", "uid": "u"}, "spec": {"containers": [container]}}
        body = json.dumps({"Pod": pod, "NodeNames": ["h100-od-0"]}).encode()
        request = urllib.request.Request(f"http://{host}:{port}/filter", body, {"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=30).read()
        return scrape(host, port)


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers outside label matchers, grouping clauses,
    ranges and strings that are neither functions nor keywords."""
    expr = re.sub(r'"[^"]*"', "", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr))
    return {n for n in names if n not in PROMQL_WORDS and not re.fullmatch(r"[0-9.e]+", n)}


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_promql_metric_names_reads_expressions() -> None:
    expr = 'histogram_quantile(0.99, sum by (le, verb) (rate(gpupack_request_duration_seconds_bucket{verb="x"}[5m])))'
    assert promql_metric_names(expr) == {"gpupack_request_duration_seconds_bucket"}
    assert promql_metric_names("max(a_b) / max by (product) (c_d)") == {"a_b", "c_d"}


def test_every_dashboard_query_names_metrics_the_app_exposes(example_scrape: str) -> None:
    exposed = exposed_names(example_scrape)
    queries = dashboard_queries()
    assert len(queries) >= 10
    for expr in queries:
        names = promql_metric_names(expr)
        assert names, f"no metric in {expr!r}"
        assert names <= exposed, f"{expr!r} reads {sorted(names - exposed)}, which /metrics does not expose"


def test_pool_gauges_equal_the_report(tmp_path: Path) -> None:
    path = write_cluster(tmp_path / "cluster.yaml", small_cluster())
    report = build_report(read_cluster_file(path, Settings()), Settings())
    state, _ = file_state(path)
    with live_server(state, Settings()) as (host, port):
        families = {f.name: f for f in text_string_to_metric_families(scrape(host, port))}
    for pool in report["pools"]:
        labels = {"product": pool["product"], "capacity_type": pool["capacity_type"]}
        for metric, key in POOL_GAUGE_OF_FIGURE.items():
            (value,) = [s.value for s in families[metric].samples if s.labels == labels]
            assert value == pytest.approx(pool[key], abs=0.005), (metric, labels)


POOL_GAUGE_OF_FIGURE = {
    "gpupack_pool_idle_hourly_cost": "idle_hourly_cost",
    "gpupack_pool_gpus": "gpus",
    "gpupack_pool_gpus_allocated": "gpus_allocated",
    "gpupack_pool_empty_nodes": "empty_nodes",
    "gpupack_pool_mig_stranded_slices": "stranded_mig_slices",
}


@pytest.fixture
def proxied_app() -> Iterator[tuple[str, int, int]]:
    """The example cluster's app on loopback and the metrics proxy in front of it: (host, app port, proxy port)."""
    state, _ = file_state(EXAMPLE_CLUSTER)
    with live_server(state, Settings()) as (host, port):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            proxy_port = probe.getsockname()[1]
        proxy = make_server("127.0.0.1", proxy_port, f"http://{host}:{port}/metrics")
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        try:
            yield host, port, proxy_port
        finally:
            proxy.shutdown()
            proxy.server_close()


def test_metrics_proxy_serves_metrics_and_nothing_else(proxied_app: tuple[str, int, int]) -> None:
    host, _, proxy_port = proxied_app
    assert exposed_names(scrape(host, proxy_port)) >= {"gpupack_pool_gpus", "gpupack_gpus", "gpupack_ready"}
    for method, path, status in (("GET", "/filter", 404), ("POST", "/filter", 405), ("POST", "/bind", 405)):
        request = urllib.request.Request(f"http://{host}:{proxy_port}{path}", b"{}" if method == "POST" else None,
                                         method=method)  # fmt: skip
        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(request, timeout=10)
        assert error.value.code == status


def test_metrics_proxy_says_when_the_extender_is_down() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    proxy = make_server("127.0.0.1", 0, f"http://127.0.0.1:{dead}/metrics")
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(f"http://127.0.0.1:{proxy.server_address[1]}/metrics", timeout=10)
        assert error.value.code == 503
    finally:
        proxy.shutdown()
        proxy.server_close()


@pytest.mark.parametrize("sent", [b"", b"GET /metr"], ids=["nothing", "half a request line"])
def test_metrics_proxy_drops_a_client_that_goes_quiet(sent: bytes) -> None:
    """#26 (low): each connection holds a thread; one that sends nothing must not hold it for ever."""
    proxy = make_server("127.0.0.1", 0, "http://127.0.0.1:9/metrics", idle_seconds=0.5)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        with socket.create_connection(("127.0.0.1", proxy.server_address[1]), timeout=10) as quiet:
            quiet.sendall(sent)
            started = time.monotonic()
            assert quiet.recv(1024) == b""  # the server closed it (a timeout here raises instead)
            assert time.monotonic() - started < 5
    finally:
        proxy.shutdown()
        proxy.server_close()


# ------------------------------------------------------------------ manifests
def objects(name: str) -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all((MANIFESTS / name).read_text()) if doc}


SERVICE_MONITOR_KEYS = {  # monitoring.coreos.com/v1 ServiceMonitor: the fields used here, as its CRD names them
    "spec": {"selector", "namespaceSelector", "endpoints", "jobLabel", "targetLabels", "podTargetLabels"},
    "endpoint": {"port", "targetPort", "path", "scheme", "interval", "scrapeTimeout", "honorLabels", "relabelings"},
}


def test_service_monitor_scrapes_the_metrics_container_through_the_service() -> None:
    service = objects("monitoring.yaml")["Service"]
    monitor = objects("prometheus-operator/servicemonitor.yaml")["ServiceMonitor"]
    (deployment,) = [d for d in yaml.safe_load_all((MANIFESTS / "deployment.yaml").read_text()) if d]
    pod = deployment["spec"]["template"]
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "metrics"]
    (container_port,) = container["ports"]
    (service_port,) = service["spec"]["ports"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert (
        service_port["targetPort"] == container_port["name"] and service_port["port"] == container_port["containerPort"]
    )
    assert container["args"][container["args"].index("--port") + 1] == str(container_port["containerPort"])
    assert container["args"][container["args"].index("--upstream") + 1] == "http://127.0.0.1:8888/metrics"
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor["spec"]) <= SERVICE_MONITOR_KEYS["spec"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert set(endpoint) <= SERVICE_MONITOR_KEYS["endpoint"]
    assert endpoint["port"] == service_port["name"] and endpoint["path"] == "/metrics"


def test_disruption_budget_keeps_one_of_the_two_replicas() -> None:
    budget = objects("monitoring.yaml")["PodDisruptionBudget"]
    (deployment,) = [d for d in yaml.safe_load_all((MANIFESTS / "deployment.yaml").read_text()) if d]
    assert deployment["spec"]["replicas"] == 2
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


def test_dashboard_is_shipped_by_the_kustomization() -> None:
    """The chart's dashboard, as the ConfigMap that Grafana's sidecar picks up, in the default apply."""
    (kustomization,) = [d for d in yaml.safe_load_all((MANIFESTS / "kustomization.yaml").read_text()) if d]
    assert {"monitoring.yaml", "grafana/dashboard.yaml"} <= set(kustomization["resources"])
    (config_map,) = [d for d in yaml.safe_load_all((MANIFESTS / "grafana" / "dashboard.yaml").read_text()) if d]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["gpupack.json"]) == json.loads(DASHBOARD.read_text())
