"""`gpupack agent`: one loop that republishes node facts, reconciles dynamic MIG and serves the plugins.

Each step (every `interval` seconds, and at start, so a restarted agent rebuilds everything from the
pods, NVML and podresources): read the Node (is it dynamic MIG?), read NVML and each GPU's health
(agent.gpu_health: critical XIDs, lost GPUs, `gpupack.io/cordoned-gpus`), let every device kind set
the node right (`DeviceKind.tidy`: dynamic MIG destroys instances no live pod holds), verify what the
kubelet handed each pod (podresources) against its assignment and merge it into the ledger of served
claims (agent.ledger), publish the node annotations (`gpu-topology`, `mig-layout`, `devices-in-use`),
and sync the device plugins, a GPU out of service's devices Unhealthy (restarting and re-registering
them after a kubelet restart) — only once podresources has been read, so that a restarted agent never
serves a claim twice.

On GPU-less clusters (e2e tests) `--fake-nvml PATH` or $GPUPACK_AGENT_FAKE_NVML replaces NVML by a fake
node file (`agent.fake_nvml_file`); the agent says so with a WARNING at start.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from gpupack.agent.agent_metrics import PODRESOURCES_ERRORS
from gpupack.agent.allocator import Allocator
from gpupack.agent.blocked_slots import Blocked
from gpupack.agent.device_kind import Host
from gpupack.agent.devices import advertised, with_health
from gpupack.agent.devices_in_use import devices_in_use, observe
from gpupack.agent.fake_nvml_file import FakeNvmlFileError, FileNvml
from gpupack.agent.gpu_cordon import CordonReader
from gpupack.agent.gpu_health import GpuHealth, OutOfService, excluded_slots, observe_health
from gpupack.agent.kinds import registered
from gpupack.agent.node_gpus import NodeGpus
from gpupack.agent.node_publisher import NodeApi, desired_annotations, is_dynamic_mig, publish
from gpupack.agent.nvml import Nvml
from gpupack.agent.nvml_topology import TopologyReader
from gpupack.agent.plugin_manager import PluginManager
from gpupack.agent.podresources import PodResourcesSource
from gpupack.agent.pods import Pod, PodLister, live_assigned
from gpupack.agent.topology import Topology
from gpupack.agent.verification import Discrepancy, compare
from gpupack.kube.keys import ANNOTATION_DEVICES_IN_USE, ANNOTATION_GPU_TOPOLOGY

log = logging.getLogger("gpupack.agent")
METRICS_PORT_ENV, DEFAULT_METRICS_PORT = "GPUPACK_AGENT_METRICS_PORT", 9402  # 0: no metrics server
FAKE_NVML_ENV = "GPUPACK_AGENT_FAKE_NVML"  # a fake node file instead of NVML (--fake-nvml wins)


@dataclass
class AgentLoop:
    """The agent's state and its periodic step."""

    node: str
    nvml: Nvml
    pods: PodLister
    node_api: NodeApi
    plugin_dir: Path
    podresources: PodResourcesSource | None = None
    dynamic_mig: bool = False
    numa: tuple[int, ...] = ()
    manager: PluginManager = field(init=False)
    discrepancies: list[Discrepancy] = field(default_factory=list)  # the last podresources comparison
    health: GpuHealth = field(init=False)  # critical XIDs and lost GPUs (agent.gpu_health)
    cordon: CordonReader = field(default_factory=CordonReader)  # gpupack.io/cordoned-gpus
    out_of_service: dict[int, OutOfService] = field(default_factory=dict)  # the last round's, by GPU
    topology: TopologyReader = field(default_factory=TopologyReader)
    _gpus: NodeGpus | None = field(default=None, init=False)  # the last snapshot: a lost GPU keeps its state

    def __post_init__(self) -> None:
        self.health = GpuHealth(self.nvml)
        allocator = Allocator(self.node, self.nvml, self.pods, self.read_gpus)
        self.manager = PluginManager(allocator, self.plugin_dir)

    def read_gpus(self) -> NodeGpus:
        """NVML now, with the node's MIG mode as last read (a lost GPU as last seen)."""
        self._gpus = NodeGpus.read(self.nvml, self.numa, self.dynamic_mig, self.health.lost, self._gpus)
        return self._gpus

    def step(self) -> None:
        """One round: health, each kind's tidying (dynamic MIG reconcile), verification, node annotations, plugins."""
        node = self.node_api.get_node()
        self.dynamic_mig = is_dynamic_mig(node)
        unhealthy = self.health.check(self.nvml.gpus())
        topology = self.topology.read(self.nvml, self.health.lost)
        self.numa = topology.numa
        tidied = self._tidy()
        gpus = self.read_gpus()
        self.out_of_service = self.cordon.cordoned(node, gpus) | unhealthy
        observe_health(self.out_of_service)
        in_use = self.verify(self.pods.pods_on_node(), gpus, tidied)
        self._publish(topology, gpus, in_use)
        self._serve(gpus)

    def _tidy(self) -> list[Blocked]:
        """Every kind sets the node right; what they report blocked."""
        allocator = self.manager.allocator
        with allocator.lock:  # never between an Allocate's pod list and its create
            host = Host(self.node, self.nvml, self.read_gpus(), self.pods, allocator.refusals)
            return [blocked for kind in registered() for blocked in kind.tidy(host)]

    def _publish(self, topology: Topology, gpus: NodeGpus, in_use: str | None) -> None:
        facts = desired_annotations(topology, gpus, self.out_of_service)
        if not self.topology.known:  # never read yet (a GPU lost since the agent started): publish none
            facts.pop(ANNOTATION_GPU_TOPOLOGY)
        patch = publish(self.node_api, facts | {ANNOTATION_DEVICES_IN_USE: in_use})
        if patch:
            log.info("published %s", sorted(patch))

    def _serve(self, gpus: NodeGpus) -> None:
        """The plugins, with a GPU out of service's devices Unhealthy; none before podresources was read."""
        if self.podresources is not None and not self.manager.allocator.ledger.rebuilt:
            log.warning("not serving devices yet: what the kubelet handed out (podresources) is not read yet")
            return
        self.manager.sync(with_health(advertised(gpus), self.out_of_service))

    def verify(self, pods: list[Pod], gpus: NodeGpus, tidied: list[Blocked]) -> str | None:
        """Compare podresources with the assignments; the `devices-in-use` value (None: nothing to tell).

        `tidied`: what the kinds reported blocked this round, besides the refusals Allocate met.
        """
        if self.podresources is not None:
            try:
                held = self.podresources.list_held()
                self.manager.allocator.remember(held, gpus)
                self.discrepancies = compare(held, pods, gpus)
            except grpc.RpcError as exc:  # keep the last comparison: the kubelet may be restarting
                PODRESOURCES_ERRORS.inc()
                log.warning("podresources List failed: %s", exc.details() if hasattr(exc, "details") else exc)
        for found in self.discrepancies:
            log.debug("pod %s holds %s beyond its assignment", found.pod, [s.to_json() for s in found.extra])
        blocked = self.manager.allocator.refusals.current() + tidied
        observe(self.discrepancies, blocked)
        named = live_assigned(pods, self.node)
        return devices_in_use(self.discrepancies, blocked, named, excluded_slots(self.out_of_service))


def select_nvml(flag: str | None, environ: Mapping[str, str] = os.environ) -> Nvml:
    """NVML, or the fake node file `flag` names (else $GPUPACK_AGENT_FAKE_NVML), announced by a WARNING.

    FakeNvmlFileError when that file cannot be read or is malformed.
    """
    path = flag or environ.get(FAKE_NVML_ENV)
    if not path:
        from gpupack.agent.real_nvml import RealNvml

        return RealNvml()
    nvml = FileNvml.open(Path(path))
    log.warning(
        "running on a FAKE NVML from %s (%s): %d fake GPU(s), no real GPU; MIG changes are written to that file",
        path,
        "--fake-nvml" if flag else f"${FAKE_NVML_ENV}",
        len(nvml.devices),
    )
    return nvml


def run(args: argparse.Namespace) -> int:
    """Entry point of `gpupack agent` (in a DaemonSet pod; NODE_NAME from the downward API)."""
    from kubernetes import client
    from prometheus_client import start_http_server

    from gpupack.agent.agent_metrics import REGISTRY
    from gpupack.agent.node_publisher import KubeNodeApi
    from gpupack.agent.podresources import KubeletPodResources
    from gpupack.agent.pods import KubePods
    from gpupack.kube.sources import SourceError, load_kube_config

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    node = args.node or os.environ.get("NODE_NAME")
    if not node:
        log.error("the node's name is needed: --node or $NODE_NAME")
        return 2
    try:
        nvml = select_nvml(getattr(args, "fake_nvml", None))
    except FakeNvmlFileError as exc:
        log.error("%s", exc)
        return 2
    try:
        core = client.CoreV1Api(load_kube_config(args.kubeconfig))
    except SourceError as exc:
        log.error("%s", exc)
        return 2
    loop = AgentLoop(
        node, nvml, KubePods(core, node), KubeNodeApi(core, node), Path(args.plugin_dir), KubeletPodResources()
    )
    metrics_port = int(os.environ.get(METRICS_PORT_ENV, DEFAULT_METRICS_PORT))
    if metrics_port:
        start_http_server(metrics_port, registry=REGISTRY)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.is_set():
            try:
                loop.step()
            except Exception:  # the loop must outlive one bad round (API server away, NVML hiccup)
                log.exception("agent step failed; retrying")
            stop.wait(5.0)
    finally:
        loop.manager.stop()
    return 0
