"""`gpupack report`: read a cluster (file, live, or a simulated end state), print the report.

Exit codes: 0 printed; 2 unusable input (config, cluster file, kubeconfig, simulation files, Prometheus).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import orjson

from gpupack.errors import GpupackError
from gpupack.extender.settings import Settings, SettingsError
from gpupack.kube.sources import SourceError
from gpupack.report.build import build_report
from gpupack.report.render_html import render_html
from gpupack.report.render_text import render_text
from gpupack.report.snapshot import ClusterSnapshot, read_cluster_file, read_live_cluster, report_settings


class ReportError(GpupackError):
    """Input the report cannot use; the message says which and why."""


def run(args: argparse.Namespace) -> int:
    """Run `gpupack report`."""
    try:
        if args.hours <= 0:
            raise ReportError("--hours must be positive")
        settings = report_settings(args.config)
        snapshot = _snapshot(args, settings)
        report = build_report(snapshot, settings, args.by, args.hours)
        if args.prometheus:
            from gpupack.report.utilisation import UtilisationError, idle_gpus

            try:
                report["utilisation"] = idle_gpus(
                    args.prometheus, args.window, args.idle_below, report["pods"], args.dcgm_selector
                )
            except UtilisationError as exc:
                raise ReportError(str(exc)) from None
    except (ReportError, SettingsError, SourceError, ValueError) as exc:
        print(f"gpupack report: {exc}", file=sys.stderr)
        return 2
    if args.html:
        Path(args.html).write_text(render_html(report), encoding="utf-8")
    if args.json:
        sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(render_text(report))
    return 0


def _snapshot(args: argparse.Namespace, settings: Settings) -> ClusterSnapshot:
    if args.cluster_file:
        return read_cluster_file(args.cluster_file, settings)
    if args.from_simulation:
        from gpupack.report.simulated import SimulationError, simulated_cluster_yaml

        nodes, pods = args.from_simulation
        try:
            text = simulated_cluster_yaml(nodes, pods, args.policy, args.seed, args.load)
        except SimulationError as exc:
            raise ReportError(str(exc)) from None
        if args.save_cluster:
            Path(args.save_cluster).write_text(text, encoding="utf-8")
            return read_cluster_file(args.save_cluster, settings)
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", encoding="utf-8") as cluster:
            cluster.write(text)
            cluster.flush()
            return read_cluster_file(cluster.name, settings)
    return read_live_cluster(args.kubeconfig, settings)
