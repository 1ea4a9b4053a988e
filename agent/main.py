"""`gpupack agent`: one loop that republishes node facts, reconciles dynamic MIG and serves the plugins.

Each step (every `interval` seconds, and at start, so a restarted agent rebuilds everything from the
pods and NVML): read the Node (is it dynamic MIG?), read NVML, publish the two annotations, destroy
dynamic-MIG instances no live pod holds, and sync the device plugins (restarting and re-registering
them after a kubelet restart).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path

from agent.allocator import Allocator
from agent.devices import NodeGpus, advertised
from agent.mig_lifecycle import held_instances, reconcile
from agent.node_publisher import NodeApi, desired_annotations, is_dynamic_mig, publish
from agent.nvml import Nvml
from agent.nvml_topology import read_topology
from agent.plugin_manager import PluginManager
from agent.pods import PodLister

log = logging.getLogger("gpupack.agent")


@dataclass
class AgentLoop:
    """The agent's state and its periodic step."""

    node: str
    nvml: Nvml
    pods: PodLister
    node_api: NodeApi
    plugin_dir: Path
    dynamic_mig: bool = False
    numa: tuple[int, ...] = ()
    manager: PluginManager = field(init=False)

    def __post_init__(self) -> None:
        allocator = Allocator(self.node, self.nvml, self.pods, self.read_gpus)
        self.manager = PluginManager(allocator, self.plugin_dir)

    def read_gpus(self) -> NodeGpus:
        """NVML now, with the node's MIG mode as last read."""
        return NodeGpus.read(self.nvml, self.numa, self.dynamic_mig)

    def step(self) -> None:
        """One round: node facts, MIG reconcile, plugins."""
        self.dynamic_mig = is_dynamic_mig(self.node_api.get_node())
        topology = read_topology(self.nvml)
        self.numa = topology.numa
        if self.dynamic_mig:
            with self.manager.allocator.lock:  # never between an Allocate's pod list and its create
                for gone in reconcile(self.nvml, held_instances(self.pods.pods_on_node(), self.node)):
                    log.info("destroyed %s@%d on GPU %d: no live pod holds it", gone.profile, gone.start, gone.gpu)
        gpus = self.read_gpus()
        patch = publish(self.node_api, desired_annotations(topology, gpus))
        if patch:
            log.info("published %s", sorted(patch))
        self.manager.sync(advertised(gpus))


def run(args: argparse.Namespace) -> int:
    """Entry point of `gpupack agent` (in a DaemonSet pod; NODE_NAME from the downward API)."""
    from kubernetes import client

    from agent.node_publisher import KubeNodeApi
    from agent.pods import KubePods
    from agent.real_nvml import RealNvml
    from extender.sources.kube_api import load_kube_config

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    node = args.node or os.environ.get("NODE_NAME")
    if not node:
        log.error("the node's name is needed: --node or $NODE_NAME")
        return 2
    core = client.CoreV1Api(load_kube_config(args.kubeconfig))
    loop = AgentLoop(node, RealNvml(), KubePods(core, node), KubeNodeApi(core, node), Path(args.plugin_dir))
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
