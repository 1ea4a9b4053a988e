"""Prometheus metrics of the extender, in a registry of its own (never the process-global one).

Request latency and internal errors are observed by the HTTP layer as requests finish; everything else is read from
`ClusterState.snapshot()` at scrape time, so the state keeps plain counters and knows nothing of
Prometheus.

A render costs ~2 ms of the interpreter the decisions run in (prometheus_client formats ~20 µs a line, and
the latency histogram is most of the lines). A scrape gets text rendered at most `max_age_seconds` ago, so
however often /metrics is scraped, rendering costs at most one render a period (#13 item 8).
"""

from __future__ import annotations

import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gpupack.extender.http_protocol import REFUSAL_REASONS
from gpupack.extender.pool_metrics import PoolCollector
from gpupack.extender.state import ClusterState, Snapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Metrics:
    """The extender's registry: a latency histogram per verb plus the state's read-outs."""

    def __init__(
        self, state: ClusterState, max_age_seconds: float = 0.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_age_seconds = max_age_seconds
        self._clock = clock
        self._render_lock = threading.Lock()
        self._text = b""
        self._rendered_at = -float("inf")
        self.registry = CollectorRegistry(auto_describe=True)
        self.latency = Histogram(
            "gpupack_request_duration_seconds",
            "Time to answer a kube-scheduler extender call, by verb and HTTP status.",
            ("verb", "code"),
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.internal_errors = Counter(
            "gpupack_internal_errors",
            "Calls answered with an internal error (an unexpected exception in gpupack), by verb and exception.",
            ("verb", "exception"),
            registry=self.registry,
        )
        self.connections_refused = Counter(
            "gpupack_connections_refused",
            "Connections closed by the HTTP guards, by reason: head-too-large (431), header-timeout, "
            "too-many-connections, unparseable (400).",
            ("reason",),
            registry=self.registry,
        )
        for reason in REFUSAL_REASONS:  # every reason shows from the start, at 0
            self.connections_refused.labels(reason)
        self.registry.register(_StateCollector(state))
        self.registry.register(PoolCollector(state))  # GPU pools: product x capacity type (#16 item 5)

    def observe(self, verb: str, code: int, seconds: float) -> None:
        """Record one answered request."""
        self.latency.labels(verb, str(code)).observe(seconds)

    def internal_error(self, verb: str, exception: str) -> None:
        """Count one call answered with an internal error."""
        self.internal_errors.labels(verb, exception).inc()

    def connection_refused(self, reason: str) -> None:
        """Count one connection closed by an HTTP guard (`extender.http_protocol.REFUSAL_REASONS`)."""
        self.connections_refused.labels(reason).inc()

    def cached(self) -> bytes | None:
        """The last rendered text while it is younger than `max_age_seconds`, else None."""
        if self._clock() - self._rendered_at < self.max_age_seconds:
            return self._text
        return None

    def render(self) -> bytes:
        """The Prometheus text exposition of the registry, rendered now unless a render is still fresh.

        Scrapes that arrive during a render wait for it and share its text instead of rendering again.
        """
        with self._render_lock:
            text = self.cached()
            if text is None:
                started = self._clock()
                text = self._text = generate_latest(self.registry)
                self._rendered_at = started
            return text


# One-label counters read from the snapshot: (name, help, label, Snapshot field of counts by label value).
LABELLED_COUNTERS: tuple[tuple[str, str, str, str], ...] = (
    ("gpupack_bind_failures", "Failed binds by reason.", "reason", "bind_failures"),
    (
        "gpupack_preempt_calls",
        "Preempt calls by outcome: answered, bad-request (the preemptor's request cannot be read), not-synced.",
        "outcome",
        "preempt_calls",
    ),
    (
        "gpupack_preempt_nodes",
        "Nodes proposed to preempt by outcome: planned (victims chosen), no-plan, no-victims-needed, "
        "unknown-node (the last three are left out of the answer).",
        "outcome",
        "preempt_nodes",
    ),
    (
        "gpupack_nomination_holds_ended",
        "Holds of nominated preemptors (the placement their victims free) that ended, by how.",
        "how",
        "holds_ended",
    ),
    (
        "gpupack_group_plans",
        "Group members' filters (#29) by outcome: planned (the group held whole), claimed (a planned placement "
        "taken), waiting (not every member exists), no fit, request differs.",
        "outcome",
        "group_plans",
    ),
    (
        "gpupack_group_holds_ended",
        "Groups' holds of planned placements that ended, by how.",
        "how",
        "group_holds_ended",
    ),
    (
        "gpupack_dra_allocations",
        "Attempts to allocate gated pods' ResourceClaims (#30) by step: allocated, already-allocated, "
        "left-to-kube-scheduler (ungated unallocated, the reason in an Event), waiting-for-claims, lost-race "
        "(planned again), write-failed (retried).",
        "step",
        "dra_steps",
    ),
    ("gpupack_events", "Events written on pods, by reason.", "reason", "events"),
    (
        "gpupack_event_failures",
        "Events on pods not written: queue-full (dropped, the writer was behind), write (refused or failed), or "
        "untracked (a failure of a pod beyond the 10,000 whose failures are counted).",
        "reason",
        "event_failures",
    ),
    ("gpupack_reservations_ended", "Reservations that ended, by how.", "how", "reservations_ended"),
)

# Gauges of one number: (name, help, the number in a snapshot).
GAUGES: tuple[tuple[str, str, Callable[[Snapshot], float]], ...] = (
    (
        "gpupack_nomination_holds",
        "Nominated preemptors holding part or all of their placement.",
        lambda snap: snap.holds,
    ),
    (
        "gpupack_group_holds",
        "Groups holding planned placements no member has claimed yet.",
        lambda snap: snap.group_holds,
    ),
    (
        "gpupack_dra_gated_pods",
        "Pods gated for gpupack's DRA allocation, not finished yet.",
        lambda snap: snap.dra_waiting,
    ),
    ("gpupack_gpus", "GPUs on usable nodes.", lambda snap: snap.gpus_total),
    (
        "gpupack_gpus_allocated",
        "GPUs in use (shares count their fraction, MIG its compute slices).",
        lambda snap: snap.gpus_allocated,
    ),
    ("gpupack_gpus_free", "GPUs not in use.", lambda snap: snap.gpus_total - snap.gpus_allocated),
    (
        "gpupack_mig_free_slices",
        "Free MIG memory slices (dynamic-MIG GPUs and unused static instances).",
        lambda snap: snap.free_mig_slices,
    ),
    ("gpupack_nodes", "Nodes in the inventory.", lambda snap: snap.nodes),
    ("gpupack_nodes_unusable", "Nodes whose labels or annotations gpupack cannot read.", lambda snap: snap.bad_nodes),
    ("gpupack_pods_bound", "Bound pods gpupack accounts for.", lambda snap: snap.pods),
    ("gpupack_pods_unplaced", "Bound pods that hold no capacity yet.", lambda snap: snap.unplaced_pods),
    (
        "gpupack_pods_unreadable",
        "Bound pods whose request gpupack cannot read, charged all they can be using on their node.",
        lambda snap: snap.unreadable_pods,
    ),
    ("gpupack_ready", "1 when synced and warmed up.", lambda snap: int(snap.synced and snap.warm)),
)


class _StateCollector(Collector):
    """The state's read-outs, from one snapshot per scrape."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        snap = self.state.snapshot()
        decisions = CounterMetricFamily(
            "gpupack_decisions", "Filter decisions by outcome and reason.", labels=("outcome", "reason")
        )
        for (outcome, reason), count in sorted(snap.decisions.items()):
            decisions.add_metric((outcome, reason), count)
        yield decisions
        for name, text, label, field_name in LABELLED_COUNTERS:
            yield labelled_counter(name, text, label, getattr(snap, field_name))
        reservations = GaugeMetricFamily("gpupack_reservations", "Live reservations by state.", labels=("state",))
        for state, count in sorted(snap.reservations.items()):
            reservations.add_metric((state,), count)
        yield reservations
        for name, text, value in GAUGES:
            yield GaugeMetricFamily(name, text, value=value(snap))
        yield from _exclusion_metrics(self.state)


def _exclusion_metrics(state: ClusterState) -> Iterator[GaugeMetricFamily]:
    """GPUs nothing new goes on, by why (issue #26 item 8), and cordon entries that name no GPU."""
    counts = Tally(e.why for exclusions in state.excluded_gpus().values() for e in exclusions)
    excluded = GaugeMetricFamily(
        "gpupack_gpus_excluded",
        "GPUs out of service, by why: unhealthy (the agent saw a critical XID or a lost GPU), cordoned "
        "(gpupack.io/cordoned-gpus), blocked (another whole-GPU block of gpupack.io/devices-in-use).",
        labels=("reason",),
    )
    for why in ("unhealthy", "cordoned", "blocked"):
        excluded.add_metric((why,), counts[why])
    yield excluded
    yield GaugeMetricFamily(
        "gpupack_cordon_entries_invalid",
        "Entries of gpupack.io/cordoned-gpus that name no GPU of their node by index (ignored).",
        value=state.cordon_entries_invalid(),
    )


def labelled_counter(name: str, text: str, label: str, counts: Mapping[str, int]) -> CounterMetricFamily:
    """A counter family with one label, a sample per value in `counts`, sorted."""
    family = CounterMetricFamily(name, text, labels=(label,))
    for value, count in sorted(counts.items()):
        family.add_metric((value,), count)
    return family
