"""`gpupack serve`: settings, cluster source, state and HTTP app wired together and run under uvicorn.

uvicorn runs one worker (the state lives in this process) with gpupack's guarded httptools protocol
(`extender.http_protocol`: TCP_NODELAY, a header deadline, a connection cap and a head limit).
TLS is served when --tls-cert and --tls-key are given (kube-scheduler's `enableHTTPS: true`).
"""

from __future__ import annotations

import argparse
import gc
import logging
import ssl
import sys
import threading
from collections.abc import Callable

import uvicorn

from gpupack.extender import logs
from gpupack.extender.app import create_app
from gpupack.extender.http_protocol import protocol_for
from gpupack.extender.numba_cache import seed_numba_cache
from gpupack.extender.service_metrics import Metrics
from gpupack.extender.settings import Settings, SettingsError, load_settings
from gpupack.extender.state import ClusterState
from gpupack.extender.warm_up import warm_up
from gpupack.kube.sources import (
    ClusterFileSource,
    KubernetesSource,
    OfficialKubeApi,
    SourceError,
    load_kube_config,
)
from gpupack.kube.sources.dra_writes import OfficialDraWriter
from gpupack.kube.sources.kube_api import DRA_KINDS

logger = logging.getLogger(__name__)


def serve(args: argparse.Namespace) -> int:
    """Run the extender until interrupted; returns the process exit code."""
    logs.configure()
    seeded = seed_numba_cache()
    if seeded:
        logger.info("numba cache: %d compiled files copied from the image", seeded)
    tls_problem = check_tls(getattr(args, "tls_cert", None), getattr(args, "tls_key", None))
    if tls_problem:
        print(f"gpupack serve: {tls_problem}", file=sys.stderr)
        return 2
    try:
        settings = load_settings(args.config, host=args.host, port=args.port)
        state = ClusterState(settings)
        source = build_source(args, state, settings)
    except (SettingsError, SourceError) as exc:
        print(f"gpupack serve: {exc}", file=sys.stderr)
        return 2
    state.writer = source
    server = uvicorn.Server(extender_config(state, settings, args))
    source.start()
    if state.dra_allocator.writer is not None:
        state.dra_allocator.start()
    threading.Thread(target=warm_up_then_tune_gc, args=(state,), name="gpupack-warm-up", daemon=True).start()
    logger.info("serving on %s:%d", settings.host, settings.port)
    try:
        server.run()
    finally:
        state.dra_allocator.stop()
        source.stop()
    return 0


def check_tls(cert: str | None, key: str | None) -> str | None:
    """Why `--tls-cert` / `--tls-key` cannot be served (None when they can, or when TLS is off)."""
    if bool(cert) != bool(key):
        return "--tls-cert and --tls-key go together"
    if not cert:
        return None
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except OSError as exc:  # ssl.SSLError is an OSError too
        return f"cannot load --tls-cert {cert} / --tls-key {key}: {exc.strerror or exc}"
    return None


def warm_up_then_tune_gc(state: ClusterState) -> None:
    """Compile the kernels, then `tune_gc` (start-up's objects are all alive by then)."""
    warm_up(state)
    tune_gc()


def tune_gc() -> None:
    """Fewer and cheaper garbage collections for a process that parses large request bodies.

    A filter body in Nodes mode at 5,000 nodes parses into ~300,000 dicts and lists; with CPython's
    default thresholds that sets off full collections scanning every long-lived object, pauses of
    ~100 ms. The objects alive now are frozen out of the collector, and the youngest generation is
    collected after 50,000 allocations instead of 700 (bench/speed.py measures the servers so too).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


def build_source(
    args: argparse.Namespace, state: ClusterState, settings: Settings
) -> ClusterFileSource | KubernetesSource:
    """The cluster file when --cluster-file is given, else the cluster kubectl would use (`load_kube_config`)."""
    if getattr(args, "cluster_file", None):
        return ClusterFileSource(args.cluster_file, state.apply)
    api_client = load_kube_config(getattr(args, "kubeconfig", None))
    api = OfficialKubeApi(api_client, request_timeout=settings.request_timeout_seconds)
    source = KubernetesSource(api, state.apply)
    state.dra_allocator.writer = OfficialDraWriter(api_client, settings.request_timeout_seconds)
    # devices are chosen only from a complete picture: nodes, pods and every DRA object listed once
    dra_kinds = [kind.kind for kind in DRA_KINDS]
    state.dra_allocator.ready = lambda: state.synced and source.listed(dra_kinds)
    return source


def extender_config(state: ClusterState, settings: Settings, args: argparse.Namespace | None = None) -> uvicorn.Config:
    """uvicorn's config for gpupack's app over `state`, the guards' refusals counted in the app's metrics."""
    metrics = Metrics(state, settings.metrics_max_age_seconds)
    return uvicorn_config(create_app(state, settings, metrics), settings, args, metrics.connection_refused)


def uvicorn_config(
    app: object,
    settings: Settings,
    args: argparse.Namespace | None = None,
    count_refusal: Callable[[str], None] | None = None,
) -> uvicorn.Config:
    """uvicorn's config: one worker, asyncio, TCP_NODELAY, no access log, TLS when a certificate is given;
    each connection the guards refuse is counted through `count_refusal` (a bench app counts none)."""
    return uvicorn.Config(
        app,  # type: ignore[arg-type]  # any object: uvicorn checks the app when it loads it
        host=settings.host,
        port=settings.port,
        workers=1,
        loop="asyncio",
        http=protocol_for(settings, count_refusal),
        log_config=None,
        access_log=False,
        timeout_keep_alive=120,  # longer than Go's 90 s idle timeout: the client closes first
        proxy_headers=False,  # kube-scheduler calls directly; no client address is used (a middleware less, #32)
        ssl_certfile=getattr(args, "tls_cert", None),
        ssl_keyfile=getattr(args, "tls_key", None),
    )
