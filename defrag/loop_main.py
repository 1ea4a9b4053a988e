"""`gpupack defrag --loop`: the loop of `defrag.loop` wired to the live cluster, its Lease and its metrics.

Runs until SIGTERM or SIGINT, then gives the Lease up. The Lease's namespace is `--lease-namespace`, else
the pod's own (the ServiceAccount's namespace file, as in-cluster clients read it), else `default`; the
identity is the pod's name (its hostname) with a random suffix, so a restarted container is a new candidate.
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import threading
import uuid
from pathlib import Path

from prometheus_client import start_http_server

from gpupack.defrag.cli import carry_plan, check_arguments, plan_snapshot
from gpupack.defrag.lease import LeaseElector, OfficialLeases
from gpupack.defrag.loop import DefragLoop, LoopSettings
from gpupack.extender import logs
from gpupack.extender.numba_cache import seed_numba_cache
from gpupack.extender.settings import SettingsError
from gpupack.kube.sources import SourceError, load_kube_config
from gpupack.report.snapshot import read_live_cluster, report_settings

logger = logging.getLogger(__name__)

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def run_loop(args: argparse.Namespace) -> int:
    """Run the loop (exit 0 when stopped by a signal; 2 for unusable arguments, config or kubeconfig)."""
    logs.configure()  # JSON lines on stderr, as `gpupack serve` logs
    seed_numba_cache()  # the image's compiled kernels: the first round does not compile for a minute
    try:
        loop = build_loop(args)
    except (SettingsError, SourceError, ValueError) as exc:
        print(f"gpupack defrag: {exc}", file=sys.stderr)
        return 2
    if args.metrics_port:
        start_http_server(args.metrics_port, registry=loop.metrics.registry)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    mode = "carries moves out" if args.execute else "dry run: plans and counts, evicts nothing"
    logger.info("defrag loop %s (%s) on Lease %s", loop.elector.identity, mode, _lease_of(loop))
    loop.run(stop)
    return 0


def build_loop(args: argparse.Namespace) -> DefragLoop:
    """The loop the arguments describe; raises ValueError, SettingsError or SourceError for unusable ones."""
    check_arguments(args)
    if args.cluster_file:
        raise ValueError("--loop reads a live cluster, not a cluster file")
    if args.every <= 0 or args.window <= 0 or args.settle < 0 or args.window_evictions < 0:
        raise ValueError("--every and --window must be positive; --settle and --window-evictions 0 or more")
    if not 0 <= args.metrics_port <= 65535:
        raise ValueError(f"--metrics-port {args.metrics_port} is out of range 0..65535")
    settings = report_settings(args.config)
    api_client = load_kube_config(args.kubeconfig)
    leases = OfficialLeases(api_client, args.lease_namespace or _own_namespace(), args.lease_name)
    identity = f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    elector = LeaseElector(leases, identity, keep_seconds=args.window)
    loop_settings = LoopSettings(
        every_seconds=args.every,
        window_seconds=args.window,
        window_evictions=args.window_evictions,
        round_evictions=args.max_evictions,
        settle_seconds=args.settle,
        execute=args.execute,
    )
    return DefragLoop(
        loop_settings,
        elector,
        read=lambda: read_live_cluster(args.kubeconfig, settings),
        plan=lambda snapshot, most, not_for: plan_snapshot(args, snapshot, most, not_for),
        carry=lambda snapshot, plan, may_move: carry_plan(api_client, snapshot, plan, may_move),
    )


def _own_namespace() -> str:
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8").strip() or "default"
    except OSError:
        return "default"


def _lease_of(loop: DefragLoop) -> str:
    leases = loop.elector.leases
    return f"{leases.namespace}/{leases.name}" if isinstance(leases, OfficialLeases) else "?"


__all__ = ["build_loop", "run_loop"]
