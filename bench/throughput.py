"""Throughput under the real kube-scheduler: gpupack beside the least an extender can do (issues #12, #32).

On one control plane per cluster size (etcd + kube-apiserver + kube-scheduler of the newest tested release,
`harness.controlplane`) with N fake nodes of 8 `nvidia.com/gpu` each, every run creates the pods with the
scheduler stopped, starts the extender and then kube-scheduler with the shipped configuration, and waits
until every pod is bound. The extenders: `minimal` (`bench.minimal_extender`, the standard library's threaded
HTTP server: the limit), `trivial` (`bench.trivial_extender`, the same answers on gpupack's uvicorn stack) and
gpupack. Runs rotate through them. pods/s is measured from the first to the last "Successfully bound" line
of kube-scheduler's log, so start-up does not count. Each process's CPU time over the same window (from
/proc) says where the time goes, and the API server's count of the writes it served in that window
(`apiserver_request_total`) says which requests the extender caused.

    gpupack bench --throughput [--out DIR]
    python -m gpupack.bench.throughput_cli --nodes 500 --pods 2000 --rounds 2 [--extenders minimal,gpupack]
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpupack.harness.controlplane import (
    HOST,
    ControlPlane,
    Process,
    http_status,
    make_certificates,
    node_body,
    pod_body,
    wait_until,
    write_kubeconfig,
)
from gpupack.harness.kube_programs import NEWEST

PRODUCT = "NVIDIA-H100-80GB-HBM3"
BOUND = re.compile(rb'^I\d{4} (\d\d):(\d\d):(\d\d\.\d+) .*"Successfully bound pod to node"', re.MULTILINE)
EXTENDERS = ("minimal", "trivial", "gpupack")
DIAGNOSTICS = ("gpupack-no-events",)  # run on request only (bench.no_events_extender says what it tells)
BASELINE = "minimal"  # every ratio is against it
BASELINE_MODULES = {"minimal": "gpupack.bench.minimal_extender", "trivial": "gpupack.bench.trivial_extender"}
DIAGNOSTIC_MODULES = {"gpupack-no-events": "gpupack.bench.no_events_extender"}
COMPONENTS = ("etcd", "kube-apiserver", "kube-scheduler", "extender")
TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")
# one compiled pattern over the lines it needs, not prometheus_client's parser of every family: the API
# server's /metrics is long, and it is read at the edges of the measured window
REQUESTS = re.compile(r"^apiserver_request_total\{(.*)\} (\S+)$", re.MULTILINE)
LABEL = re.compile(r'(\w+)="([^"]*)"')
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE", "APPLY"})


@dataclass(frozen=True)
class ThroughputConfig:
    """What one throughput bench covers."""

    node_counts: tuple[int, ...] = (500, 5000)
    pods: int = 2000
    rounds: int = 3  # runs of each extender per size, rotating
    bind_timeout: float = 300.0
    extenders: tuple[str, ...] = EXTENDERS


@dataclass
class RunResult:
    """One burst: which extender, how fast, and each process's CPU per pod."""

    extender: str
    nodes: int
    pods: int
    bound: int
    seconds: float
    pods_per_second: float
    cpu_ms_per_pod: dict[str, float] = field(default_factory=dict)
    writes_per_pod: dict[str, float] = field(default_factory=dict)  # API server writes, by `VERB resource`
    fresh_numba_cache: bool = False  # gpupack's first run of a size: every kernel compiled since its start


def gpu_node(index: int) -> dict[str, Any]:
    """An 8-GPU H100 node, on-demand."""
    labels = {"nvidia.com/gpu.product": PRODUCT, "nvidia.com/gpu.count": "8", "karpenter.sh/capacity-type": "on-demand"}
    return node_body(f"tp-{index:05d}", {"cpu": "192", "memory": "2Ti", "nvidia.com/gpu": 8}, labels)


def gpu_pod(index: int) -> dict[str, Any]:
    """A one-GPU pod for the gpupack scheduler."""
    return pod_body(f"p-{index:05d}", {"nvidia.com/gpu": 1})


def cpu_seconds(process: Process | None) -> float:
    """User + system CPU seconds of a running process (0 when it is not running)."""
    if process is None or process.popen is None:
        return 0.0
    try:
        fields = Path(f"/proc/{process.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_SECOND


def api_writes(metrics: str) -> Counter[str]:
    """Writes the API server has served, by `VERB resource[/subresource]`, from its /metrics text."""
    writes: Counter[str] = Counter()
    for labels_text, value in REQUESTS.findall(metrics):
        labels = dict(LABEL.findall(labels_text))
        if labels.get("verb") in WRITES:
            resource = labels.get("resource", "") + (f"/{labels['subresource']}" if labels.get("subresource") else "")
            writes[f"{labels['verb']} {resource}"] += int(float(value))
    return writes


def bound_times(log: bytes) -> list[float]:
    """Seconds of the day of every "Successfully bound" line of a kube-scheduler log (klog headers)."""
    return [int(h) * 3600 + int(m) * 60 + float(s) for h, m, s in BOUND.findall(log)]


class Rig:
    """One control plane with `nodes` GPU nodes, on which bursts run with either extender."""

    def __init__(self, nodes: int, log: Callable[[str], None]) -> None:
        self.nodes = nodes
        self.log = log
        self.plane = ControlPlane(verbosity=2)
        self.extender: Process | None = None
        # gpupack's numba cache, empty when the rig starts: its first run compiles everything, later runs
        # reuse what it compiled (#32: nothing may compile after /readyz, so the first run is not slower)
        self.numba_cache = self.plane.workdir / "numba-cache"
        self.plane.gpupack_env["NUMBA_CACHE_DIR"] = str(self.numba_cache)

    def __enter__(self) -> Rig:
        plane = self.plane
        try:
            plane.certs = make_certificates(plane.workdir / "pki")
            write_kubeconfig(plane.kubeconfig, plane.apiserver_url, plane.certs)
            plane.start_etcd()
            plane.start_apiserver()
            plane.write_scheduler_config()
            started = time.perf_counter()
            plane.create_nodes(gpu_node(i) for i in range(self.nodes))
            self.log(f"  {self.nodes} nodes created in {time.perf_counter() - started:.0f} s")
        except BaseException:
            plane.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.plane.stop()

    def run(self, extender: str, pods: int, round_number: int, timeout: float) -> RunResult:
        """Create `pods` pending pods, start `extender` and kube-scheduler, wait until all are bound."""
        plane = self.plane
        namespace = f"tp-{round_number}-{extender}"
        plane.create_namespace(namespace)
        plane.create_pods(namespace, (gpu_pod(i) for i in range(pods)))
        fresh = extender == "gpupack" and not any(self.numba_cache.rglob("*.nbi"))
        self._start_extender(extender)
        log_path = plane.workdir / "kube-scheduler.log"
        offset = log_path.stat().st_size if log_path.exists() else 0
        plane.start_scheduler()
        try:
            # CPU is counted from the first bind on, so the scheduler's start-up is not in it
            wait_until("the first bind", lambda: len(self._bound_since(log_path, offset)) >= 1, timeout, 0.02)
            before, writes_before = self._cpu(), self._writes()
            binds_before = len(self._bound_since(log_path, offset))
            wait_until(f"{pods} binds", lambda: len(self._bound_since(log_path, offset)) >= pods, timeout, 0.5)
            after, writes_after = self._cpu(), self._writes()
            times = self._bound_since(log_path, offset)
        finally:
            plane.kill_scheduler()
            self._stop_extender()
            self._delete_pods(namespace)
        seconds = times[-1] - times[0]
        counted = max(len(times) - binds_before, 1)
        cpu = {name: round((after[name] - before[name]) * 1000 / counted, 2) for name in COMPONENTS}
        writes = {kind: round(n / counted, 2) for kind, n in (writes_after - writes_before).items()}
        rate = (len(times) - 1) / seconds if seconds > 0 else 0.0
        return RunResult(extender, self.nodes, pods, len(times), round(seconds, 2), round(rate, 1), cpu, writes, fresh)

    def _delete_pods(self, namespace: str) -> None:
        """Delete the run's pods and wait until they are gone, so the next run does not pay for it."""
        self.plane.delete_pods(namespace)
        core = self.plane.core()

        def gone() -> bool:
            return not core.list_namespaced_pod(namespace, limit=1).items

        wait_until(f"the pods of {namespace} to go", gone, 300, 1)

    def _start_extender(self, extender: str) -> None:
        plane = self.plane
        if extender == "gpupack":
            plane.start_gpupack()
            self.extender = plane.gpupack
            return
        if extender in DIAGNOSTIC_MODULES:  # gpupack serve, changed: gpupack's environment and time to get ready
            module, extra, env, ready = DIAGNOSTIC_MODULES[extender], ["--host", HOST], plane.gpupack_env, 180.0
        else:
            module, extra, env, ready = BASELINE_MODULES[extender], [], None, 60.0
        argv = [sys.executable, "-m", module, "--kubeconfig", str(plane.kubeconfig), "--port", str(plane.gpupack_port)]
        log = plane.workdir / f"{extender}-extender.log"
        self.extender = Process(f"{extender}-extender", [*argv, *extra], log, env=env).start()
        url = f"http://{HOST}:{plane.gpupack_port}/readyz"
        wait_until(f"the {extender} extender", lambda: http_status(url) == 200, ready)

    def _stop_extender(self) -> None:
        if self.extender is not None:
            self.extender.kill()
        self.extender = None
        self.plane.gpupack = None

    def _cpu(self) -> dict[str, float]:
        plane = self.plane
        processes = (plane.etcd, plane.apiserver, plane.scheduler, self.extender)
        return {name: cpu_seconds(process) for name, process in zip(COMPONENTS, processes, strict=True)}

    def _writes(self) -> Counter[str]:
        response = self.plane.api_client().call_api("GET", f"{self.plane.apiserver_url}/metrics")
        return api_writes(response.read().decode())

    @staticmethod
    def _bound_since(log_path: Path, offset: int) -> list[float]:
        with log_path.open("rb") as handle:
            handle.seek(offset)
            return bound_times(handle.read())


def run_throughput(config: ThroughputConfig, log: Callable[[str], None] = lambda _: None) -> list[RunResult]:
    """Every run of every size, the extenders rotating (round r starts with the r-th)."""
    results: list[RunResult] = []
    extenders = config.extenders
    for nodes in config.node_counts:
        log(f"throughput: {nodes} nodes, {config.pods} pods, {config.rounds} rounds")
        with Rig(nodes, log) as rig:
            for round_number in range(config.rounds):
                shift = round_number % len(extenders)
                for extender in extenders[shift:] + extenders[:shift]:
                    result = rig.run(extender, config.pods, round_number, config.bind_timeout)
                    log(f"  round {round_number} {extender}: {result.pods_per_second} pods/s")
                    results.append(result)
    return results


def summary_rows(results: Sequence[RunResult]) -> list[dict[str, Any]]:
    """Per size: median pods/s of each extender, its ratio to the minimal one, median CPU ms per pod per part."""
    rows = []
    for nodes in sorted({r.nodes for r in results}):
        row: dict[str, Any] = {"nodes": nodes}
        ran = [e for e in (*EXTENDERS, *DIAGNOSTICS) if any(r.nodes == nodes and r.extender == e for r in results)]
        for extender in ran:
            runs = [r for r in results if r.nodes == nodes and r.extender == extender]
            row[extender] = round(statistics.median(r.pods_per_second for r in runs), 1)
            row[f"{extender}_cpu"] = {c: statistics.median(r.cpu_ms_per_pod[c] for r in runs) for c in COMPONENTS}
            kinds = sorted({kind for r in runs for kind in r.writes_per_pod})
            row[f"{extender}_writes"] = {
                k: statistics.median(r.writes_per_pod.get(k, 0.0) for r in runs) for k in kinds
            }
            row[f"{extender}_runs"] = [r.pods_per_second for r in runs]
        for extender in ran:
            base = row.get(BASELINE)
            row[f"{extender}_ratio"] = round(row[extender] / base, 2) if base else None
        row["extenders"] = ran
        gpupack = [r for r in results if r.nodes == nodes and r.extender == "gpupack"]
        first = [r.pods_per_second for r in gpupack if r.fresh_numba_cache]
        later = [r.pods_per_second for r in gpupack if not r.fresh_numba_cache]
        if first and later:
            row["fresh_cache_ratio"] = round(first[0] / statistics.median(later), 2)
        rows.append(row)
    return rows


def render_markdown(results: Sequence[RunResult], machine: dict[str, Any], config: ThroughputConfig) -> str:
    """The throughput report: ratios first, then pods/s and where the CPU went."""
    lines = [
        "# gpupack under the real kube-scheduler: throughput beside the least an extender can do",
        "",
        f"Written by `gpupack bench --throughput` on {machine['date']}, commit `{machine['commit'][:12]}`, "
        f"{machine['cpu']} ({machine['cores']} cores), Python {machine['python']}. Every figure comes from this run.",
        "",
        f"etcd 3.4 + kube-apiserver + kube-scheduler {NEWEST} (the shipped KubeSchedulerConfiguration), N fake "
        f"nodes of 8 `nvidia.com/gpu`, {config.pods} one-GPU pods created with the scheduler stopped; then the "
        'extender and kube-scheduler start. pods/s = binds / (first → last "Successfully bound" in '
        f"kube-scheduler's log). {config.rounds} runs per extender and size, rotating; medians. `minimal` "
        "(`bench/minimal_extender.py`) is the limit: the standard library's threaded HTTP server, filter "
        "answering the first candidate by a byte search, bind one pre-assembled Binding POST over pooled "
        "kept-alive TLS connections. `trivial` (`bench/trivial_extender.py`) gives the same answers on gpupack's "
        "uvicorn stack.",
        "",
        "| nodes | gpupack / minimal | trivial / minimal | minimal pods/s | trivial pods/s | gpupack pods/s | runs |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    rows = summary_rows(results)
    for row in rows:
        ran = row["extenders"]
        runs = "; ".join(f"{e}: {', '.join(map(str, row[f'{e}_runs']))}" for e in ran)
        ratio = {e: row.get(f"{e}_ratio") for e in ("gpupack", "trivial")}
        pods = {e: row.get(e, "–") for e in EXTENDERS}
        lines.append(
            f"| {row['nodes']:,} | **{ratio['gpupack']}** | {ratio['trivial']} | {pods['minimal']} | "
            f"{pods['trivial']} | {pods['gpupack']} | {runs} |"
        )
    lines += diagnostic_lines(rows)
    lines += [
        "",
        "CPU ms per pod, median (each process's user + system time from /proc, first bind to last bind):",
        "",
        "| nodes | extender | " + " | ".join(COMPONENTS) + " | total |",
        "|---:|---|" + "---:|" * (len(COMPONENTS) + 1),
    ]
    for row in rows:
        for extender in row["extenders"]:
            cpu = row[f"{extender}_cpu"]
            cells = " | ".join(f"{cpu[c]:.2f}" for c in COMPONENTS)
            lines.append(f"| {row['nodes']:,} | {extender} | {cells} | {sum(cpu.values()):.2f} |")
    lines += writes_table(rows)
    fresh = [row for row in rows if "fresh_cache_ratio" in row]
    if fresh:
        lines += [
            "",
            "gpupack's first run of each size starts with an empty numba cache (every kernel compiled since its "
            "start, before `/readyz`); its pods/s over the median of its later runs: "
            + "; ".join(f"{row['nodes']:,} nodes {row['fresh_cache_ratio']}" for row in fresh)
            + ".",
        ]
    lines.append("")
    return "\n".join(lines)


def diagnostic_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """A line per diagnostic run beside the main table: its pods/s and its ratio to the minimal extender."""
    lines = []
    for row in rows:
        for extender in DIAGNOSTICS:
            if extender in row["extenders"]:
                runs = ", ".join(map(str, row[f"{extender}_runs"]))
                lines.append(
                    f"- {row['nodes']:,} nodes, diagnostic `{extender}`: **{row[f'{extender}_ratio']}** of minimal, "
                    f"{row[extender]} pods/s (runs: {runs})"
                )
    return ["", *lines] if lines else []


def writes_table(rows: Sequence[dict[str, Any]], least: float = 0.05) -> list[str]:
    """The API server's writes per pod in the same window, median, by kind (kinds under `least` a pod in every
    run of every extender are left out of the columns, not of the total)."""
    shown = sorted(
        {k for row in rows for e in row["extenders"] for k, n in row.get(f"{e}_writes", {}).items() if n >= least}
    )
    if not shown:
        return []
    lines = [
        "",
        "API server writes per pod, median (its `apiserver_request_total` over the same window; all writes in "
        "the total):",
        "",
        "| nodes | extender | " + " | ".join(f"`{k}`" for k in shown) + " | total |",
        "|---:|---|" + "---:|" * (len(shown) + 1),
    ]
    for row in rows:
        for extender in row["extenders"]:
            writes = row.get(f"{extender}_writes", {})
            cells = " | ".join(f"{writes.get(k, 0.0):.2f}" for k in shown)
            lines.append(f"| {row['nodes']:,} | {extender} | {cells} | {sum(writes.values()):.2f} |")
    return lines


def result_json(results: Sequence[RunResult], machine: dict[str, Any]) -> dict[str, Any]:
    """Everything the report is made of, for results JSON."""
    return {"machine": machine, "runs": [asdict(r) for r in results], "summary": summary_rows(results)}
