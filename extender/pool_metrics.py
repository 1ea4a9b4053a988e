"""Per-pool gauges on /metrics (#16 item 5): GPU model x capacity type, as `gpupack report` shows them.

Each scrape reads `scoring.pools.PoolTotals` under the state lock; it recomputes only the nodes changed
since the previous scrape, so a scrape of a 5,000-node cluster does not stall filter calls (#13).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpupack.extender.state import ClusterState
from gpupack.scoring.pools import PoolTotals

POOL_LABELS = ("product", "capacity_type")
# metric name -> (figure of scoring.pools.FIGURES, help text)
POOL_GAUGES: dict[str, tuple[str, str]] = {
    "gpupack_pool_nodes": ("nodes", "GPU nodes in the pool."),
    "gpupack_pool_gpus": ("gpus", "GPUs in the pool."),
    "gpupack_pool_gpus_allocated": (
        "gpus_allocated", "GPUs in use in the pool (shares count their fraction, MIG its compute slices).",
    ),
    "gpupack_pool_idle_gpus": ("idle_gpus", "GPUs of the pool not in use."),
    "gpupack_pool_idle_hourly_cost": (
        "idle_hourly_cost", "Hourly cost of the pool's idle GPUs: each node's price x its idle GPUs / its GPUs.",
    ),
    "gpupack_pool_hourly_cost": ("hourly_cost", "Hourly cost of the pool's nodes."),
    "gpupack_pool_mig_free_slices": ("free_mig_slices", "Free MIG memory slices in the pool."),
    "gpupack_pool_mig_stranded_slices": (
        "stranded_mig_slices", "Free MIG memory slices no instance can use as things stand.",
    ),
    "gpupack_pool_empty_nodes": ("empty_nodes", "Nodes of the pool with no GPU in use: they could be released."),
    "gpupack_pool_empty_hourly_cost": ("empty_hourly_cost", "Hourly cost of the pool's nodes with no GPU in use."),
}  # fmt: skip


class PoolCollector(Collector):
    """The pool gauges of one ClusterState, kept incrementally between scrapes."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.totals = PoolTotals(state.inventory)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self.state.lock:
            pools = self.totals.pools()
        for name, (figure, help_text) in POOL_GAUGES.items():
            family = GaugeMetricFamily(name, help_text, labels=POOL_LABELS)
            for key, figures in pools.items():
                family.add_metric((key.product, key.capacity_type), figures[figure])
            yield family
