"""The binder: a pod's Binding, which carries its gpupack.io/assignment, written to the API server.

The pod must hold a reservation on the bind's node (filter made it). A bind without a live
reservation (it expired, or gpupack restarted between filter and bind) re-decides the pod on the
bind's node from the request it saw in filter or in the source's pending pods, and binds it when it
still fits; otherwise it answers a bind `Error` with the reason. Before the source's first `Synced`
a bind is refused, because a partial picture could hand out a GPU a not-yet-listed pod holds.

The lock shared with the ledger and the decisions is held only to check and mark the reservation,
never during the API write. A bind failure releases the reservation; a success leaves its capacity
held until the informer shows the pod bound (extender.reservations). Every bind puts an `Assigned`
event on the pod and repeated failures a `FailedAssignment` warning (extender.pod_events), queued,
never waited for.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from enum import StrEnum

import orjson

from gpupack.errors import GpupackError
from gpupack.extender.decisions import UNKNOWN_NODE, ServiceDecisions
from gpupack.extender.pod_events import PodEvents, PodRef
from gpupack.extender.pod_ledger import PodLedger
from gpupack.extender.pod_records import identity
from gpupack.extender.reservations import Ended, Reservation, ReservationBook, ReservationState
from gpupack.kube.keys import ANNOTATION_ASSIGNMENT
from gpupack.kube.sources.kube_api import ClusterWriter
from gpupack.scoring.facts import Placement

logger = logging.getLogger(__name__)

NOT_SYNCED = "gpupack has not yet listed the cluster; retry shortly"


class BindFailure(StrEnum):
    """Why a bind was refused: the `reason` label of gpupack_bind_failures."""

    NAME_MISMATCH = "name-mismatch"  # the uid's reservation belongs to a pod of another name
    IN_PROGRESS = "in-progress"  # a bind of the same pod is being written
    ALREADY_BOUND = "already-bound"
    NOT_SYNCED = "not-synced"  # before the source's first complete list
    NO_RESERVATION = "no-reservation"  # never filtered here, or gone
    NODE_UNKNOWN = "node-unknown"  # not in the inventory, or unusable
    NO_FIT = "no-fit"  # re-decided at bind and no longer fits
    NO_WRITER = "no-writer"  # no cluster connection
    BINDING = "binding"  # the API server refused or failed the Binding


# Refused binds that say nothing about whether the pod can be placed: no Warning event on the pod.
NOT_THE_PODS_FAILURE = frozenset({BindFailure.IN_PROGRESS, BindFailure.ALREADY_BOUND, BindFailure.NAME_MISMATCH})


class BindError(GpupackError):
    """A bind that cannot be done; `reason` is returned to kube-scheduler, `kind` labels the metric."""

    def __init__(self, kind: BindFailure, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


class Binder:
    """Binds pods to the node and placement reserved for them, through `writer`."""

    def __init__(
        self,
        lock: threading.RLock,
        ledger: PodLedger,
        decisions: ServiceDecisions,
        book: ReservationBook,
        events: PodEvents,
    ) -> None:
        self.lock = lock
        self.ledger = ledger
        self.inventory = ledger.inventory
        self.decisions = decisions
        self.book = book
        self.events = events
        self.writer: ClusterWriter | None = None
        self.failures: Counter[BindFailure] = Counter()  # refused binds by why
        self.on_bind_failed: list[Callable[[str], None]] = []  # told the identity of a pod whose Binding was refused

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        """Create the Binding that carries the assignment annotation. Raises BindError with a reason.

        The pod must hold a reservation on `node`; if it expired or names another node, the pod is
        decided again on `node` alone and bound when it still fits. A reservation held under `uid`
        by a pod of another name is left alone: the bind is refused.
        """
        key = f"{namespace}/{name}"
        ident = identity(uid, key)
        try:
            with self.lock:
                self.ledger.expire()
                reservation = self._reservation_for_bind(ident, key, node)
                self.book.start_bind(ident)
                placement = reservation.placement
            self._write(namespace, name, uid, node, placement, ident)
        except BindError as exc:
            with self.lock:
                self.failures[exc.kind] += 1
            logger.warning("bind %s to %s failed: %s", key, node, exc.reason)
            if exc.kind not in NOT_THE_PODS_FAILURE:
                reason = exc.reason
                self.events.failed(PodRef(namespace, name, uid), lambda: f"bind to {node} failed: {reason}")
            raise
        with self.lock:
            self.book.finish_bind(ident)
        self.events.assigned(PodRef(namespace, name, uid), placement)  # queued: never waits for the API

    def _reservation_for_bind(self, ident: str, key: str, node: str) -> Reservation:
        reservation = self.book.get(ident)
        if reservation is not None and reservation.key != key:
            why = f"uid of pod {key} holds a reservation for pod {reservation.key}"
            raise BindError(BindFailure.NAME_MISMATCH, why)
        if reservation is not None and reservation.state == ReservationState.BINDING:
            raise BindError(BindFailure.IN_PROGRESS, f"a bind of pod {key} is already in progress")
        if reservation is not None and reservation.node == node:
            return reservation
        if reservation is not None:
            self.ledger.release(self.book.forget(ident, Ended.NODE_CHANGED))
        bound = self.ledger.bound(ident)
        if bound is not None:
            raise BindError(BindFailure.ALREADY_BOUND, f"pod {key} is already bound to {bound.node}")
        if not self.ledger.synced:
            raise BindError(BindFailure.NOT_SYNCED, NOT_SYNCED)
        seen = self.decisions.seen.get(ident) or self.ledger.pending(ident)
        if seen is None:
            raise BindError(BindFailure.NO_RESERVATION, f"pod {key} has no reservation (never filtered here, or gone)")
        if node in self.ledger.bad or node not in self.inventory.index:
            raise BindError(BindFailure.NODE_UNKNOWN, f"node {node}: {self.ledger.bad.get(node, UNKNOWN_NODE)}")
        request = seen[1]
        decision = self.decisions.decider.decide(request, ([node],), observe=False)
        if decision.placement is None:
            why = decision.reasons().get(node, "does not fit")
            raise BindError(BindFailure.NO_FIT, f"pod {key} no longer fits on {node}: {why}")
        self.inventory.commit(decision.placement)
        return self.book.assume(ident, key, decision.placement, request)

    def _write(self, namespace: str, name: str, uid: str, node: str, placement: Placement, ident: str) -> None:
        """Create the Binding with the assignment annotation: one write, under the Binding's uid
        precondition, so a failed bind leaves nothing to undo (lock not held)."""
        writer = self.writer
        key = f"{namespace}/{name}"
        if writer is None:
            with self.lock:
                self._end_failed_bind(ident, placement, unsure=False)
            raise BindError(BindFailure.NO_WRITER, "gpupack has no cluster connection to bind with")
        value = orjson.dumps(placement.to_assignment()).decode()
        try:
            writer.create_binding(namespace, name, uid, node, {ANNOTATION_ASSIGNMENT: value})
        except Exception as exc:
            unsure = answer_may_be_lost(exc)
            with self.lock:
                self._end_failed_bind(ident, placement, unsure)
            raise BindError(BindFailure.BINDING, f"cannot bind pod {key} to {node}: {api_reason(exc)}") from None

    def _end_failed_bind(self, ident: str, placement: Placement, unsure: bool) -> None:
        """A refused Binding gives its capacity back; one whose answer was lost keeps it (it may exist)."""
        reservation = self.book.get(ident)
        if reservation is None or reservation.placement != placement:
            return
        if unsure:
            self.book.bind_unsure(ident)
            logger.info("pod %s: the Binding may exist (its answer was lost): its capacity stays held", reservation.key)
        else:
            self.ledger.release(self.book.forget(ident, Ended.BIND_FAILED))
            for told in self.on_bind_failed:
                told(ident)


def answer_may_be_lost(exc: BaseException) -> bool:
    """Whether the API server may have applied a write that failed this way: no HTTP answer at all
    (timeout, connection reset) or a 5xx, where etcd may have committed before the error."""
    status = getattr(exc, "status", None)
    return not isinstance(status, int) or status >= 500


def api_reason(exc: BaseException) -> str:
    """A short reason from a Kubernetes client error (status and reason, not headers and body)."""
    status = getattr(exc, "status", None)
    if status is not None:
        return f"HTTP {status} {getattr(exc, 'reason', '') or ''}".strip()
    return f"{type(exc).__name__}: {exc}"
