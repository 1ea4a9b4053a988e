"""The node's GPU topology read through NVML, equal to what `nvidia-smi topo -m` prints on the host.

NVLink: a link whose remote end is a GPU counts toward that peer (found by PCI bus id). On an NVSwitch
host every link ends at the switch, so the peer cannot be read from the link; `topo -m` then shows each
pair as NV<n>, n the GPU's active links into the fabric, and so does this (the smaller of the two
GPUs' counts, so the matrix stays symmetric).
NUMA: sysfs / NVML when they know it; else the NUMA node of the GPU's close CPUs (`topo -m`'s
"NUMA Affinity" comes from there); -1 when that is not one node either.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass

from gpupack.agent.nvml import NVLINK_REMOTE_GPU, NVLINK_REMOTE_SWITCH, Nvml, NvmlError
from gpupack.agent.topology import UNKNOWN_NUMA, Topology

log = logging.getLogger(__name__)


def read_topology(nvml: Nvml) -> Topology:
    """NVLink counts between GPU indices and each GPU's NUMA node."""
    gpus = nvml.gpus()
    index_by_bus = {_bus_key(gpu.bus_id): gpu.index for gpu in gpus}
    peer_links: list[Counter[int]] = []
    switch_links: list[int] = []
    for gpu in gpus:
        links = nvml.nvlinks(gpu.index)
        peers = Counter(
            index_by_bus[_bus_key(link.remote_bus_id)]
            for link in links
            if link.remote_type == NVLINK_REMOTE_GPU and _bus_key(link.remote_bus_id) in index_by_bus
        )
        peer_links.append(peers)
        switch_links.append(sum(1 for link in links if link.remote_type == NVLINK_REMOTE_SWITCH))
    count = len(gpus)
    nvlink = tuple(
        tuple(0 if i == j else peer_links[i][j] + min(switch_links[i], switch_links[j]) for j in range(count))
        for i in range(count)
    )
    return Topology(nvlink, tuple(_numa(nvml, gpu.index) for gpu in gpus))


def _bus_key(bus_id: str) -> str:
    """Bus ids compare without the domain's width and case (`00000000:07:00.0` vs `0000:07:00.0`)."""
    domain, _, rest = bus_id.lower().partition(":")
    return f"{int(domain, 16) if domain.strip() else 0:x}:{rest}"


def _numa(nvml: Nvml, gpu: int) -> int:
    node = nvml.numa_node(gpu)
    if node is not None and node >= 0:
        return node
    nodes = nvml.cpu_affinity_numa_nodes(gpu)
    return nodes[0] if len(nodes) == 1 else UNKNOWN_NUMA


@dataclass
class TopologyReader:
    """`read_topology`, except while a GPU is lost or NVML fails: then the last topology read stands (a lost
    GPU shows no NVLinks, and publishing that would change the node's facts in gpupack serve)."""

    last: Topology | None = None

    @property
    def known(self) -> bool:
        """A topology was read at least once (else `read` answers no NVLinks and unknown NUMA nodes)."""
        return self.last is not None

    def read(self, nvml: Nvml, lost: Collection[int]) -> Topology:
        """The topology now, or as last read; never raises for a lost GPU."""
        if not lost:
            try:
                self.last = read_topology(nvml)
            except NvmlError as exc:
                log.warning("reading the GPU topology failed (%s); the last one read stands", exc)
        if self.last is None:
            count = len(nvml.gpus())
            return Topology(tuple((0,) * count for _ in range(count)), (UNKNOWN_NUMA,) * count)
        return self.last
