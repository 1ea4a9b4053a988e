"""The defrag loop's Prometheus metrics (a registry of their own, served on `--metrics-port`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class LoopMetrics:
    """What an operator watches the loop by: is it leading, what did its rounds do, what did its moves cost."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.leader = Gauge(
            "gpupack_defrag_leader", "1 while this replica holds the defrag Lease", registry=self.registry
        )
        self.rounds = Counter(
            "gpupack_defrag_rounds",
            "Rounds by outcome: nothing-to-move, dry-run, executed, stopped (a refusal, the Lease lost or the budget "
            "spent mid-round), budget-spent (no round: the window's evictions are used up), error",
            ("outcome",),
            registry=self.registry,
        )
        self.moves = Counter(
            "gpupack_defrag_moves_planned", "Moves the rounds planned, by goal", ("goal",), registry=self.registry
        )
        self.evictions = Counter(
            "gpupack_defrag_evictions", "Planned evictions tried, by outcome: evicted, gone, refused", ("outcome",),
            registry=self.registry,
        )  # fmt: skip
        self.gpu_seconds_lost = Counter(
            "gpupack_defrag_gpu_seconds_lost",
            "GPU-seconds of work the evicted pods had run (lost unless they checkpoint)",
            registry=self.registry,
        )
        self.budget_left = Gauge(
            "gpupack_defrag_eviction_budget_left", "Evictions left in the current window", registry=self.registry
        )
        self.round_seconds = Histogram(
            "gpupack_defrag_round_seconds",
            "Duration of a round: read the cluster, plan, carry out",
            buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=self.registry,
        )
        self.last_round = Gauge(
            "gpupack_defrag_last_round_timestamp_seconds",
            "When the last round ended (Unix time)",
            registry=self.registry,
        )


__all__ = ["LoopMetrics"]
