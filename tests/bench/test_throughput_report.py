"""bench.throughput's report (#32): the API server's writes are read from its metrics and shown per pod."""

from __future__ import annotations

from typing import Any

from gpupack.bench.throughput import COMPONENTS, RunResult, ThroughputConfig, api_writes, render_markdown


def _counter(verb: str, group: str, resource: str, subresource: str, code: str, value: str) -> str:
    """One line of the API server's /metrics, with every label it writes."""
    labels = (
        f'code="{code}",component="apiserver",dry_run="",group="{group}",resource="{resource}",'
        f'scope="resource",subresource="{subresource}",verb="{verb}",version="v1"'
    )
    return f"apiserver_request_total{{{labels}}} {value}"


METRICS = "\n".join([
    "# HELP apiserver_request_total [STABLE] Counter of apiserver requests",
    _counter("POST", "", "pods", "binding", "201", "2000"),
    _counter("POST", "events.k8s.io", "events", "", "201", "3000"),
    _counter("POST", "events.k8s.io", "events", "", "409", "2"),
    _counter("PATCH", "", "pods", "status", "200", "1.5e+01"),
    _counter("LIST", "", "nodes", "", "200", "11"),
    _counter("WATCH", "", "pods", "", "200", "3"),
    'apiserver_request_duration_seconds_count{verb="POST",resource="pods"} 99',
])  # fmt: skip


def test_writes_are_counted_by_verb_and_resource_and_reads_are_left_out() -> None:
    assert api_writes(METRICS) == {"POST pods/binding": 2000, "POST events": 3002, "PATCH pods/status": 15}


def _run(extender: str, rate: float, writes: dict[str, float]) -> RunResult:
    return RunResult(extender, 500, 2000, 2000, 10.0, rate, dict.fromkeys(COMPONENTS, 1.0), writes)


def test_the_report_shows_each_extenders_writes_per_pod_with_rare_kinds_only_in_the_total() -> None:
    results = [
        _run("minimal", 200.0, {"POST pods/binding": 1.0, "POST events": 0.8}),
        _run("gpupack", 150.0, {"POST pods/binding": 1.0, "POST events": 2.0, "PUT leases": 0.01}),
    ]
    text = render_markdown(results, {"date": "d", "commit": "c" * 12, "cpu": "x", "cores": 2, "python": "3"},
                           ThroughputConfig(node_counts=(500,), rounds=1))  # fmt: skip
    assert "| 500 | **0.75** |" in text
    assert "| nodes | extender | `POST events` | `POST pods/binding` | total |" in text
    assert "| 500 | minimal | 0.80 | 1.00 | 1.80 |" in text
    assert "| 500 | gpupack | 2.00 | 1.00 | 3.01 |" in text


def test_a_diagnostic_run_gets_its_own_line_and_rows_but_no_column_of_the_main_table() -> None:
    results = [
        _run("minimal", 200.0, {"POST pods/binding": 1.0}),
        _run("gpupack", 150.0, {"POST pods/binding": 1.0, "POST events": 1.0}),
        _run("gpupack-no-events", 170.0, {"POST pods/binding": 1.0}),
    ]
    text = render_markdown(results, {"date": "d", "commit": "c" * 12, "cpu": "x", "cores": 2, "python": "3"},
                           ThroughputConfig(node_counts=(500,), rounds=1))  # fmt: skip
    assert "- 500 nodes, diagnostic `gpupack-no-events`: **0.85** of minimal, 170.0 pods/s (runs: 170.0)" in text
    assert "| 500 | gpupack-no-events | 1.00 | 1.00 | 1.00 | 1.00 | 4.00 |" in text  # its CPU row
    assert "| 500 | **0.75** |" in text  # the main table's ratio is still gpupack's


def test_the_no_events_diagnostic_writes_no_assigned_event_where_gpupack_writes_one() -> None:
    """bench.no_events_extender's replacement of PodEvents.assigned, beside the real one."""
    from gpupack.bench.no_events_extender import _no_assigned_event
    from gpupack.extender.pod_events import PodEvents, PodRef
    from gpupack.scoring.facts import GpuSlot, Placement

    class Sink:
        def __init__(self) -> None:
            self.created: list[dict[str, Any]] = []

        def create_event(self, namespace: str, event: dict[str, Any]) -> None:
            self.created.append(event)

    placement = Placement("node-a", (GpuSlot(0),))
    sink = Sink()
    events = PodEvents(lambda: sink)  # type: ignore[arg-type,return-value]  # the one call an Assigned event makes
    events.assigned(PodRef("ml", "p", "uid-p"), placement)
    _no_assigned_event(events, PodRef("ml", "q", "uid-q"), placement)
    assert events.flush(5)
    assert [event["regarding"]["name"] for event in sink.created] == ["p"]
    assert PodEvents.assigned is not _no_assigned_event  # importing the module swaps nothing; its main does
