"""The live cluster picture the extender answers from: an `Inventory` kept current from source events.

Nodes: every NodeUpserted goes through `facts_from_node`. A node whose facts are unreadable is kept
out of the inventory, its reason is remembered (logged once) and every filter that lists it answers
FailedAndUnresolvableNodes with that reason. A cordoned or not-Ready node stays in the inventory (its
pods still hold capacity) but is never chosen. A change of facts removes and re-adds the node and
re-commits everything on it; unchanged facts (heartbeats) are a no-op.

Pods — how a bound, non-terminal pod consumes capacity (also the rule after a restart):
1. A pod whose `gpupack.io/assignment` is valid, matches its request and names its `spec.nodeName`
   takes exactly that placement. A CPU-only pod takes its CPU, memory and one pod slot.
2. Otherwise — a GPU pod bound by another scheduler (no assignment), or an assignment that is
   malformed, names another node, or claims GPU capacity already in use (forged or stale) — the pod
   takes a placement chosen on its bound node by the first-fit policy restricted to that node. A
   pod whose request gpupack cannot read (mixed kinds, `gpu-milli: 1000`, ...: refused for
   scheduling) is charged all it can be using there (`UnreadableCharge`): its CPU and memory as
   parsed, else all that is free, and every free GPU, slice and share of its node (#13).
3. Nothing is ever double-booked and capacity in use is never freed: a placement is only committed
   when the inventory accepts it, a pod keeps its committed placement for as long as it lives on that
   node (a later change of its annotation does not move it), and a pod that fits nowhere on its node
   holds nothing and is retried whenever capacity on that node is released.
4. Until the source's first `Synced`, rule-2 placements wait, so that first-fit never takes a GPU a
   not-yet-listed pod legitimately claims; the order of the initial list does not matter.

Reservations (extender.reservations): filter commits the chosen placement at once, so the next
filter sees it; the informer showing the pod bound with that same assignment confirms it (no second
commit); pod deletion, bind failure, node loss or TTL expiry (of a reservation not yet bound)
releases it. A bind without a live reservation (it expired, or gpupack restarted between filter
and bind) re-decides the pod on the bind's node from the request it saw in filter or in the
source's pending pods, and binds it when it still fits; otherwise it answers a bind `Error` with
the reason.

Before the source's first `Synced` nothing is decided: filter answers an `Error` and bind refuses,
because a partial picture could hand out a GPU that a not-yet-listed pod holds.

One `threading.RLock` serialises every decision and every event application. `bind` holds it only
to check and mark the reservation, not during the Kubernetes API writes.

Events on pods (extender.pod_events): a bind puts an `Assigned` event on the pod, and a pod whose
filters or binds keep failing gets a `FailedAssignment` warning with the reason; both are queued and
written by a thread of their own, so they never hold the lock or wait for the API.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

import numpy as np
import orjson

from gpupack.errors import GpupackError
from gpupack.extender.inline import leave_the_loop_if_heavy
from gpupack.extender.keys import ANNOTATION_ASSIGNMENT
from gpupack.extender.node_facts import NodeFactsError, facts_from_node, node_is_schedulable, node_name
from gpupack.extender.node_usage import NodeUsageBook, read_node_usage
from gpupack.extender.pod_events import PodEvents, PodRef, no_node_note
from gpupack.extender.pod_request import (
    AssignmentError,
    UnreadableCharge,
    assignment_from_pod,
    pod_key,
    pod_uid,
    request_from_pod,
    unreadable_charge,
)
from gpupack.extender.reservations import Clock, Reservation, ReservationBook, ReservationState
from gpupack.extender.settings import Settings
from gpupack.extender.sources.events import Event, NodeDeleted, NodeUpserted, PodDeleted, PodUpserted, Synced
from gpupack.extender.sources.kube_api import ClusterWriter
from gpupack.scoring.engine import Decision, Engine, reason_texts
from gpupack.scoring.facts import Placement
from gpupack.scoring.inventory import Inventory, InventoryError
from gpupack.scoring.names import NameArray, RowReasons
from gpupack.scoring.policies import baseline
from gpupack.scoring.request import Kind, PodRequest, RequestError
from gpupack.scoring.usage import UsageTotals

logger = logging.getLogger(__name__)
decision_log = logging.getLogger("gpupack.decisions")

UNKNOWN_NODE = "node unknown to gpupack"
UNSCHEDULABLE_NODE = "node is cordoned or not Ready"
NOT_CHOSEN = "gpupack chose another node"
NOT_SYNCED = "gpupack has not yet listed the cluster; retry shortly"
SEEN_LIMIT = 100_000  # pods whose request is remembered between filter and bind
SEEN_BYTES_LIMIT = 64 << 20  # ... and their size: a request can name many GPU products (#13 item 3)
Answer = TypeVar("Answer")


def _verdicts(chosen: str | None, failed: Mapping[str, str], unresolvable: dict[str, str]) -> Any:
    """decide_for_filter's default answer: (chosen node or None, FailedNodes, FailedAndUnresolvableNodes)."""
    return chosen, failed, unresolvable


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


class PlacedBy(StrEnum):
    """How a bound pod's capacity was chosen (the rules of the module docstring)."""

    NOTHING = ""  # it holds nothing (yet)
    ASSIGNMENT = "assignment"  # rule 1: its own valid gpupack.io/assignment
    CPU = "cpu"  # rule 1: a CPU-only pod's CPU, memory and pod slot
    RESERVATION = "reservation"  # confirmed: the filter decision it was bound with
    DEVICES_IN_USE = "devices-in-use"  # rule 2: what gpupack agent saw it hold
    FIRST_FIT = "first-fit"  # rule 2: chosen first-fit on its node
    UNREADABLE = "unreadable"  # rule 2: all it can be using there (UnreadableCharge)


@dataclass
class PodRecord:
    """A bound pod and the capacity it holds (None while it fits nowhere on its node)."""

    uid: str
    key: str
    node: str
    request: PodRequest
    annotation: str | None  # raw gpupack.io/assignment
    claimed: Placement | None  # the annotation's placement when valid for this pod and node
    placement: Placement | None = None
    how: PlacedBy = PlacedBy.NOTHING
    unreadable: UnreadableCharge | None = None  # set when the request cannot be read (then `request` is empty)


@dataclass
class Evaluation:
    """Where a pod would go, without reserving anything (for `explain` and decideInFilter: false)."""

    request: PodRequest | None
    decision: Decision | None
    unresolvable: dict[str, str]
    error: str = ""


@dataclass
class Snapshot:
    """Numbers for /metrics and /readyz, read under the lock."""

    nodes: int
    bad_nodes: int
    pods: int
    unplaced_pods: int
    unreadable_pods: int
    gpus_total: int
    gpus_allocated: float
    free_mig_slices: int
    reservations: dict[str, int]
    reservations_ended: dict[str, int]
    decisions: dict[tuple[str, str], int]
    bind_failures: dict[str, int]
    synced: bool
    warm: bool
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BoundPod:
    """What the state holds for one bound pod (a copy: changing it changes nothing)."""

    uid: str
    key: str
    node: str
    placement: Placement | None
    how: PlacedBy
    claimed: Placement | None  # its own valid gpupack.io/assignment, if any
    unreadable: bool  # its request cannot be read: it is charged all it can be using


@dataclass(frozen=True)
class RememberedRequests:
    """The requests kept between filter and bind, as a copy."""

    entries: dict[str, tuple[str, PodRequest]]  # identity -> (key, request), the oldest first
    bytes: int  # request_bytes() summed over the entries, bounded by SEEN_BYTES_LIMIT


def request_bytes(uid: str, key: str, request: PodRequest) -> int:
    """About what one remembered request holds: its strings and a fixed overhead per object."""
    products = request.allowed_products or ()
    return 512 + len(uid) + len(key) + sum(64 + len(product) for product in products)


def identity(uid: str, key: str) -> str:
    """How a pod is tracked: its uid, or namespace/name for hand-written objects without one."""
    return uid or key


class ClusterState:
    """Nodes, bound pods and reservations, and the decisions made from them."""

    def __init__(self, settings: Settings, clock: Clock = time.monotonic) -> None:
        self.settings = settings
        self.lock = threading.RLock()
        self.inventory = Inventory()
        self.usage = UsageTotals(self.inventory)
        self.engine = Engine(self.inventory, settings.policy_spec())
        self.first_fit = Engine(self.inventory, baseline("first-fit"))
        self.book = ReservationBook(settings.reservation_ttl_seconds, clock)
        self.node_usage = NodeUsageBook(self.inventory)  # gpupack.io/devices-in-use, from gpupack agent
        self.writer: ClusterWriter | None = None
        self.events = PodEvents(lambda: self.writer, clock)  # Events on pods, written through the writer
        self._prices = settings.price_table()
        self._bad: dict[str, str] = {}
        self._unschedulable: set[str] = set()
        self._pods: dict[str, PodRecord] = {}
        self._by_node: dict[str, set[str]] = {}
        self._unplaced: set[str] = set()
        self._unreadable: set[str] = set()  # bound pods charged conservatively (UnreadableCharge)
        self._seen: OrderedDict[str, tuple[str, PodRequest]] = OrderedDict()
        self._seen_bytes = 0  # request_bytes() summed over _seen
        self._pending: OrderedDict[str, tuple[str, PodRequest]] = OrderedDict()  # unbound GPU pods
        self._synced = False
        self._warm = False
        self.decisions: Counter[tuple[str, str]] = Counter()
        self.bind_failures: Counter[BindFailure] = Counter()
        self._reason_texts = reason_texts(NOT_CHOSEN)

    # ================================================================== readiness
    @property
    def ready(self) -> bool:
        """The source has synced and the kernels are compiled."""
        return self._synced and self._warm

    @property
    def synced(self) -> bool:
        """The source has delivered a complete list at least once."""
        return self._synced

    @property
    def warm(self) -> bool:
        """The kernels have run once (numba compiled them)."""
        return self._warm

    def warm_up(self) -> None:
        """Compile every kernel through the path real requests take (extender.warm_up), then be warm."""
        from gpupack.extender.warm_up import compile_kernels  # it drives the verbs, which import this module

        compile_kernels(self.settings)
        self._warm = True

    # ================================================================== events
    def apply(self, event: Event) -> None:
        """Apply one source event (the sources' `on_event` callback)."""
        with self.lock:
            try:
                if isinstance(event, NodeUpserted):
                    self._node_upserted(event.node)
                elif isinstance(event, NodeDeleted):
                    self._node_gone(event.name, None)
                elif isinstance(event, PodUpserted):
                    self._pod_upserted(event.pod)
                elif isinstance(event, PodDeleted):
                    self._pod_deleted(identity(event.uid, event.key))
                elif isinstance(event, Synced):
                    self._on_synced()
            except Exception:  # one bad object must not stop the event stream
                logger.exception("could not apply %s", type(event).__name__)

    # ------------------------------------------------------------------ nodes
    def _node_upserted(self, node: Mapping[str, Any]) -> None:
        try:
            name = node_name(node)
        except NodeFactsError as exc:
            logger.warning("ignoring a node: %s", exc)
            return
        try:
            facts = facts_from_node(node, self._prices)
            usage = read_node_usage(node)
        except NodeFactsError as exc:
            self._node_gone(name, str(exc))
            return
        if node_is_schedulable(node):
            self._unschedulable.discard(name)
        else:
            self._unschedulable.add(name)
        row = self.inventory.index.get(name)
        same_usage = self.node_usage.unchanged(usage)
        if row is not None and self.inventory.facts[row] == facts and same_usage:
            return
        if row is not None and same_usage:
            try:
                self.inventory.update_node(facts)  # same GPUs: change in place, allocations stay
                return
            except InventoryError:
                pass  # GPUs changed, or less capacity than is in use: rebuild the node below
        held = self.book.on_node(name)
        if row is not None:
            self._detach(name)
        self.node_usage.set(usage)
        try:
            self.inventory.add_node(facts)
        except InventoryError as exc:
            for reservation in held:
                self.book.forget(reservation.uid, "node unusable")
            self._mark_bad(name, str(exc))
            return
        if self._bad.pop(name, None) is not None:
            logger.info("node %s is usable again", name)
        self._attach(name, held)

    def _node_gone(self, name: str, bad_reason: str | None) -> None:
        """Take a node out of the inventory (deleted, or its facts became unreadable)."""
        for reservation in self.book.on_node(name):
            self.book.forget(reservation.uid, "node gone")
        if name in self.inventory.index:
            self._detach(name)
        self.node_usage.forget(name)
        if bad_reason is None:
            self._bad.pop(name, None)
            self._unschedulable.discard(name)
        else:
            self._mark_bad(name, bad_reason)

    def _mark_bad(self, name: str, reason: str) -> None:
        if self._bad.get(name) != reason:
            logger.warning("node %s is not usable by gpupack: %s", name, reason)
        self._bad[name] = reason

    def _detach(self, name: str) -> None:
        """Remove a node from the inventory; its pods keep their records but hold nothing."""
        self.inventory.remove_node(name)
        for uid in self._by_node.get(name, ()):
            record = self._pods[uid]
            record.placement = None
            record.how = PlacedBy.NOTHING
            self._unplaced.discard(uid)

    def _attach(self, name: str, held: Sequence[Reservation]) -> None:
        """Re-commit what a freshly added node holds: claims first, then reservations, then the rest."""
        records = [self._pods[uid] for uid in self._by_node.get(name, ())]
        for record in records:
            self._take_exact(record)
        for reservation in held:
            try:
                self.inventory.commit(reservation.placement)
            except InventoryError:
                self.book.forget(reservation.uid, "node changed")
        if self._synced:  # before that, every claim of the first list goes first (rule 4)
            self._hold(name)
        for record in records:
            if record.placement is None:
                self._take_fallback(record)

    # ------------------------------------------------------------------ pods
    def _pod_upserted(self, pod: Mapping[str, Any]) -> None:
        node = (pod.get("spec") or {}).get("nodeName")
        key = pod_key(pod)
        uid = identity(pod_uid(pod), key)
        if not node or not isinstance(node, str):
            self._remember_pending(uid, key, pod)
            return  # pending: nothing held (a reservation holds its own capacity)
        self._pending.pop(uid, None)
        annotation = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_ASSIGNMENT)
        existing = self._pods.get(uid)
        if existing is not None and existing.node == node:
            existing.annotation = annotation
            if existing.placement is None and self._synced:
                self._take(existing)
            return  # a bound pod never moves: its capacity stays where it is
        record = self._bound_record(pod, uid, key, node, annotation)
        if existing is not None:
            self._drop(existing)
        self._pods[uid] = record
        self._by_node.setdefault(node, set()).add(uid)
        if record.unreadable is not None:
            self._unreadable.add(uid)
        reservation = self.book.get(uid)
        if reservation is not None:
            if reservation.node == node and record.claimed == reservation.placement:
                self.book.confirm(uid)
                record.placement, record.how = reservation.placement, PlacedBy.RESERVATION
                return
            self._release(self.book.forget(uid, "bound otherwise"))
        self._take(record)

    def _bound_record(
        self, pod: Mapping[str, Any], uid: str, key: str, node: str, annotation: str | None
    ) -> PodRecord:
        """The record of a newly seen bound pod: its request and valid claim, or, when its request is
        unreadable, the conservative charge that stands in for it (logged here, once per pod)."""
        try:
            request = request_from_pod(pod)
        except RequestError as exc:
            logger.warning(
                "bound pod %s on %s: its request is unreadable (%s); charging it all it can be using there",
                key, node, exc,
            )  # fmt: skip
            charge = unreadable_charge(pod, str(exc))
            return PodRecord(uid, key, node, PodRequest(), annotation, None, unreadable=charge)
        claimed = None
        try:
            claimed = assignment_from_pod(pod, request)
        except AssignmentError as exc:
            logger.warning("%s; placing it first-fit on %s", exc, node)
        return PodRecord(uid, key, node, request, annotation, claimed)

    def _remember_pending(self, uid: str, key: str, pod: Mapping[str, Any]) -> None:
        """Keep an unbound GPU pod's request, so a bind arriving after a restart can be re-decided."""
        try:
            request = request_from_pod(pod)
        except RequestError:
            self._pending.pop(uid, None)
            return
        if request.kind == Kind.NONE:
            self._pending.pop(uid, None)
            return
        if uid not in self._pending and len(self._pending) >= SEEN_LIMIT:
            self._pending.popitem(last=False)
        self._pending[uid] = (key, request)
        self._pending.move_to_end(uid)

    def _pod_deleted(self, uid: str) -> None:
        self.events.forget(uid)
        self._forget_seen(uid)
        self._pending.pop(uid, None)
        self._release(self.book.forget(uid, "pod deleted"))
        record = self._pods.get(uid)
        if record is not None:
            self._drop(record)

    def _drop(self, record: PodRecord) -> None:
        """Forget a pod record and give back what it held."""
        del self._pods[record.uid]
        on_node = self._by_node.get(record.node)
        if on_node is not None:
            on_node.discard(record.uid)
            if not on_node:
                del self._by_node[record.node]
        self._unplaced.discard(record.uid)
        self._unreadable.discard(record.uid)
        if record.placement is not None:
            self._give_back(record.placement)

    def _on_synced(self) -> None:
        first = not self._synced
        self._synced = True
        if first:
            logger.info("cluster state synced: %d nodes, %d bound pods", len(self.inventory.index), len(self._pods))
        for reservation in self.book.orphans():  # bound long before this list, yet not in it: gone
            logger.info("pod %s bound to %s is gone; releasing its hold", reservation.key, reservation.node)
            self._release(self.book.forget(reservation.uid, "pod gone"))
        for name in list(self.node_usage.usage) if first else ():
            self._hold(name)
        self._retry_unplaced(None)

    # ------------------------------------------------------------------ accounting
    def _hold(self, name: str) -> None:
        """Charge what the node's gpupack.io/devices-in-use holds beyond the pods' assignments."""
        unclaimed = {self._pods[uid].key for uid in self._by_node.get(name, ()) if self._pods[uid].claimed is None}
        self.node_usage.commit_hold(name, unclaimed)

    def _take(self, record: PodRecord) -> None:
        if not self._take_exact(record):
            self._take_fallback(record)

    def _take_exact(self, record: PodRecord) -> bool:
        """Rule 1: the pod's own valid claim (or its CPU/memory for a CPU-only pod)."""
        if record.node not in self.inventory.index:
            return False
        if record.claimed is not None:
            exact, how = record.claimed, PlacedBy.ASSIGNMENT
        elif record.request.kind == Kind.NONE and record.unreadable is None:
            exact, how = (
                Placement(record.node, (), record.request.cpu_milli, record.request.memory_bytes),
                PlacedBy.CPU,
            )
        else:
            return False
        try:
            self.inventory.commit(exact)
        except InventoryError as exc:
            if how == PlacedBy.ASSIGNMENT:
                logger.warning("pod %s: %s claims capacity in use (%s)", record.key, ANNOTATION_ASSIGNMENT, exc)
            self._mark_unplaced(record, str(exc))
            return False
        record.placement, record.how = exact, how
        self._unplaced.discard(record.uid)
        return True

    def _take_fallback(self, record: PodRecord) -> None:
        """Rule 2: first-fit on the bound node, or the conservative charge of an unreadable request
        (deferred until synced, rule 4, so that it never takes what a later-listed pod claims)."""
        if record.node not in self.inventory.index:
            return
        if not self._synced:
            self._unplaced.add(record.uid)
            return
        if record.unreadable is not None:
            placement, how = self._unreadable_placement(record.node, record.unreadable), PlacedBy.UNREADABLE
        elif record.request.kind == Kind.NONE:
            self._take_exact(record)
            return
        elif (observed := self.node_usage.observed(record.node, record.key, record.request)) is not None:
            placement, how = observed, PlacedBy.DEVICES_IN_USE  # what gpupack agent saw it hold, not a guess
        else:
            request = dataclasses.replace(record.request, allowed_products=None)
            placement, how = self.first_fit.decide(request, [record.node]).placement, PlacedBy.FIRST_FIT
        if placement is None:
            self._mark_unplaced(record, "no free capacity fits it")
            return
        self.inventory.commit(placement)
        record.placement, record.how = placement, how
        self._unplaced.discard(record.uid)

    def _unreadable_placement(self, node: str, charge: UnreadableCharge) -> Placement | None:
        """All an unreadable pod can be using on `node`, clamped to what is free there (None: no pod slot)."""
        inventory = self.inventory
        row = inventory.index[node]
        if inventory.node_pods_free[row] < 1:
            return None
        return Placement(
            node,
            inventory.free_slots(node) if charge.all_gpus else (),
            _at_most_free(charge.cpu_milli, int(inventory.node_cpu_free[row])),
            _at_most_free(charge.memory_bytes, int(inventory.node_mem_free[row])),
        )

    def _mark_unplaced(self, record: PodRecord, reason: str) -> None:
        if record.uid not in self._unplaced and self._synced and record.claimed is None:
            logger.warning("bound pod %s holds nothing on %s yet: %s", record.key, record.node, reason)
        self._unplaced.add(record.uid)

    def _retry_unplaced(self, node: str | None) -> None:
        if not self._unplaced or not self._synced:
            return
        waiting = [self._pods[uid] for uid in list(self._unplaced) if node is None or self._pods[uid].node == node]
        for record in waiting:
            if record.placement is None:
                self._take_exact(record)
        for record in waiting:
            if record.placement is None:
                self._take_fallback(record)

    def _give_back(self, placement: Placement) -> None:
        try:
            self.inventory.release(placement)
        except InventoryError:
            logger.exception("inventory out of step while releasing %s", placement.to_assignment())
            return
        self._retry_unplaced(placement.node)

    def _release(self, reservation: Reservation | None) -> None:
        """Give back a forgotten reservation's capacity (no-op for None or a vanished node)."""
        if reservation is not None and reservation.node in self.inventory.index:
            self._give_back(reservation.placement)

    def _expire(self) -> None:
        for reservation in self.book.expire_due():
            logger.info("reservation of %s on %s expired", reservation.key, reservation.node)
            self._release(reservation)

    # ================================================================== decisions
    def _request(self, pod: Mapping[str, Any]) -> tuple[str, str, PodRequest]:
        """(identity, key, request) of a pod sent by kube-scheduler; the mix learns each pod once."""
        key = pod_key(pod)
        uid = identity(pod_uid(pod), key)
        request = request_from_pod(pod)
        leave_the_loop_if_heavy(request)
        if uid not in self._seen:
            self.engine.observe(request)
        self._forget_seen(uid)
        size = request_bytes(uid, key, request)
        while self._seen and (len(self._seen) >= SEEN_LIMIT or self._seen_bytes + size > SEEN_BYTES_LIMIT):
            self._forget_seen(next(iter(self._seen)))  # the oldest first
        self._seen[uid] = (key, request)
        self._seen_bytes += size
        return uid, key, request

    def _forget_seen(self, uid: str) -> None:
        seen = self._seen.pop(uid, None)
        if seen is not None:
            self._seen_bytes -= request_bytes(uid, *seen)

    def _split(self, candidates: Sequence[str] | NameArray) -> tuple[np.ndarray, dict[str, str]]:
        """The candidates gpupack can place on, as a mask over inventory rows, and the others with why
        they are unresolvable. Names sent as wire bytes are looked up without becoming strings."""
        inventory = self.inventory
        mask = np.zeros(inventory.size, dtype=np.bool_)
        if isinstance(candidates, NameArray):
            rows, missing = inventory.name_index().rows(candidates, mask)
            unknown = [candidates.name(i) for i in np.flatnonzero(rows < 0).tolist()] if missing else []
        else:
            found = [(name, inventory.index.get(name, -1)) for name in candidates]
            mask[[row for _, row in found if row >= 0]] = True
            unknown = [name for name, row in found if row < 0]
        unresolvable = {name: self._bad.get(name, UNKNOWN_NODE) for name in unknown}
        for name in self._unschedulable:  # few, so walked instead of the candidates
            row = inventory.index.get(name)
            if row is not None and mask[row]:
                mask[row] = False
                unresolvable[name] = UNSCHEDULABLE_NODE
        return mask, unresolvable

    def decide_for_filter(
        self,
        pod: Mapping[str, Any],
        candidates: Sequence[str] | NameArray,
        answer: Callable[[str | None, Mapping[str, str], dict[str, str]], Answer] = _verdicts,  # type: ignore[assignment]
    ) -> Answer:
        """Choose one node among `candidates` and reserve its placement (decide in filter).

        `answer(chosen node or None, FailedNodes, FailedAndUnresolvableNodes)` builds what is
        returned (by default that tuple). It runs under the lock before the placement is committed,
        so an answer that cannot be built reserves nothing (#13). A pod that already holds a
        reservation on a candidate gets it back (kube-scheduler retries).
        """
        started = time.perf_counter()
        with self.lock:
            self._expire()
            try:
                uid, key, request = self._request(pod)
            except RequestError as exc:
                self.decisions["bad-request", "invalid pod request"] += 1
                reason = str(exc)
                self.events.failed(PodRef.of(pod), lambda: f"the pod's request cannot be placed: {reason}")
                return answer(None, {}, dict.fromkeys(_names(candidates), reason))
            known, unresolvable = self._split(candidates)
            bound = self._pods.get(uid)
            if bound is not None:
                reason = f"pod is already bound to {bound.node}"
                names = self.inventory.names
                bound_reasons = {names[row]: reason for row in np.flatnonzero(known).tolist()}
                return answer(None, {}, {**unresolvable, **bound_reasons})  # type: ignore[dict-item]
            reservation = self.book.get(uid)
            if reservation is not None:
                row = self.inventory.index.get(reservation.node)
                if row is not None and known[row]:
                    self.decisions["reused", ""] += 1
                    return answer(reservation.node, self._failed_nodes(known, row, None), unresolvable)
                self._release(self.book.forget(uid, "not a candidate"))
            decision = self.engine.decide(request, known)
            placement = decision.placement
            if placement is None:
                failed = self._failed_nodes(known, -1, decision)
                self.decisions["unschedulable", _main_reason(failed, unresolvable)] += 1
                self.events.failed(PodRef.of(pod), lambda: no_node_note(failed, unresolvable))
                self._log(key, None, None, started, decision.rows.size)
                return answer(None, failed, unresolvable)
            chosen = self.inventory.index[placement.node]
            built = answer(placement.node, self._failed_nodes(known, chosen, decision), unresolvable)
            self.inventory.commit(placement)
            self.book.assume(uid, key, placement, request)
            self.decisions["placed", ""] += 1
            self._log(key, placement, decision.score_of(chosen), started, decision.rows.size)
            return built

    def _failed_nodes(self, known: np.ndarray, chosen: int, decision: Decision | None) -> RowReasons:
        """FailedNodes: the infeasible candidates with their reasons and, with `reportNotChosen`, every
        other candidate but row `chosen` as NOT_CHOSEN (all of them when a reservation is reused and
        `decision` is None)."""
        report_feasible = self.settings.report_not_chosen
        if decision is not None:
            rows, codes = decision.verdict_rows(feasible=report_feasible, besides=chosen)
        else:
            rows = np.flatnonzero(known) if report_feasible else np.empty(0, dtype=np.int64)
            rows = rows[rows != chosen]
            codes = np.zeros(rows.size, dtype=np.int8)  # OK: feasible, not chosen
        return RowReasons(self.inventory.name_index(), rows, codes, self._reason_texts)

    def feasible_for_filter(
        self, pod: Mapping[str, Any], candidates: Sequence[str] | NameArray
    ) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """decideInFilter: false — every feasible candidate passes, nothing is reserved."""
        with self.lock:
            self._expire()
            evaluation = self._evaluate(pod, candidates)
            decision = evaluation.decision
            if decision is None:
                self.decisions["bad-request", "invalid pod request"] += 1
                self.events.failed(PodRef.of(pod), lambda: f"the pod's request cannot be placed: {evaluation.error}")
                return [], {}, evaluation.unresolvable
            passed = list(decision.feasible_scores())
            self.decisions["feasible" if passed else "unschedulable", ""] += 1
            if not passed:
                self.events.failed(PodRef.of(pod), lambda: no_node_note(decision.reasons(), evaluation.unresolvable))
            return passed, decision.reasons(), evaluation.unresolvable

    def scores_for_prioritize(self, pod: Mapping[str, Any], candidates: Sequence[str]) -> list[tuple[str, int]]:
        """Every candidate with a score 0..10: best = 10, linear min-max of feasible scores, infeasible 0.

        A pod holding a reservation scores 10 on its reserved node and 0 elsewhere; a pod already
        bound scores 0 everywhere (filter calls it unresolvable everywhere).
        """
        names = list(dict.fromkeys(candidates))
        with self.lock:
            self._expire()
            uid = identity(pod_uid(pod), pod_key(pod))
            if uid in self._pods:
                return [(n, 0) for n in names]
            reservation = self.book.get(uid)
            if reservation is not None and reservation.node in names:
                return [(n, 10 if n == reservation.node else 0) for n in names]
            evaluation = self._evaluate(pod, names)
            scores = evaluation.decision.feasible_scores() if evaluation.decision else {}
        return [(n, s) for n, s in zip(names, normalise([scores.get(n) for n in names]), strict=True)]

    def evaluate(self, pod: Mapping[str, Any], candidates: Sequence[str] | None = None) -> Evaluation:
        """Where the pod would go among `candidates` (default: every node), reserving nothing."""
        with self.lock:
            if candidates is None:
                candidates = [*self.inventory.index, *self._bad]
            return self._evaluate(pod, candidates)

    def _evaluate(self, pod: Mapping[str, Any], candidates: Sequence[str] | NameArray) -> Evaluation:
        try:
            _, _, request = self._request(pod)
        except RequestError as exc:
            return Evaluation(None, None, dict.fromkeys(_names(candidates), str(exc)), str(exc))
        known, unresolvable = self._split(candidates)
        return Evaluation(request, self.engine.decide(request, known), unresolvable)

    def _log(self, key: str, placement: Placement | None, score: float | None, started: float, n: int) -> None:
        fields = {
            "pod": key,
            "node": placement.node if placement else None,
            "placement": placement.to_assignment()["gpus"] if placement else None,
            "score": None if score is None else round(score, 6),
            "candidates": n,
            "ms": round((time.perf_counter() - started) * 1000, 3),
        }
        decision_log.info("decision", extra={"fields": fields})

    # ================================================================== bind
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
                self._expire()
                reservation = self._reservation_for_bind(ident, key, node)
                self.book.start_bind(ident)
                placement = reservation.placement
            self._write(namespace, name, uid, node, placement, ident)
        except BindError as exc:
            with self.lock:
                self.bind_failures[exc.kind] += 1
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
            self._release(self.book.forget(ident, "node changed"))
        if ident in self._pods:
            raise BindError(BindFailure.ALREADY_BOUND, f"pod {key} is already bound to {self._pods[ident].node}")
        if not self._synced:
            raise BindError(BindFailure.NOT_SYNCED, NOT_SYNCED)
        seen = self._seen.get(ident) or self._pending.get(ident)
        if seen is None:
            raise BindError(BindFailure.NO_RESERVATION, f"pod {key} has no reservation (never filtered here, or gone)")
        if node in self._bad or node not in self.inventory.index:
            raise BindError(BindFailure.NODE_UNKNOWN, f"node {node}: {self._bad.get(node, UNKNOWN_NODE)}")
        request = seen[1]
        decision = self.engine.decide(request, [node])
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
        try:
            if writer is None:
                raise BindError(BindFailure.NO_WRITER, "gpupack has no cluster connection to bind with")
            value = orjson.dumps(placement.to_assignment()).decode()
            try:
                writer.create_binding(namespace, name, uid, node, {ANNOTATION_ASSIGNMENT: value})
            except Exception as exc:
                raise BindError(BindFailure.BINDING, f"cannot bind pod {key} to {node}: {api_reason(exc)}") from None
        except BindError:
            with self.lock:
                reservation = self.book.get(ident)
                if reservation is not None and reservation.placement == placement:
                    self._release(self.book.forget(ident, "bind failed"))
            raise

    # ================================================================== read-outs
    def snapshot(self) -> Snapshot:
        """Current numbers for /metrics."""
        with self.lock:
            self._expire()
            return Snapshot(
                nodes=len(self.inventory.index),
                bad_nodes=len(self._bad),
                pods=len(self._pods),
                unplaced_pods=len(self._unplaced),
                unreadable_pods=len(self._unreadable),
                gpus_total=self.inventory.gpus_total(),
                gpus_allocated=self.usage.gpus_allocated(),
                free_mig_slices=self.usage.free_mig_slices(),
                reservations={state.value: n for state, n in self.book.counts().items()},
                reservations_ended=dict(self.book.ended),
                decisions=dict(self.decisions),
                bind_failures=dict(self.bind_failures),
                synced=self._synced,
                warm=self._warm,
            )

    def placements(self) -> dict[str, Placement]:
        """Every held placement by pod identity: bound pods and live reservations."""
        with self.lock:
            held = {uid: r.placement for uid, r in self._pods.items() if r.placement is not None}
            held.update({r.uid: r.placement for r in self.book.live()})
            return held

    def bound_pods(self) -> dict[str, BoundPod]:
        """Every bound pod the state accounts for, by identity (copies)."""
        with self.lock:
            return {
                uid: BoundPod(uid, r.key, r.node, r.placement, r.how, r.claimed, r.unreadable is not None)
                for uid, r in self._pods.items()
            }

    def remembered_requests(self) -> RememberedRequests:
        """The requests kept for binds (bounded in count and bytes), as a copy."""
        with self.lock:
            return RememberedRequests(dict(self._seen), self._seen_bytes)

    def bad_nodes(self) -> dict[str, str]:
        """Nodes kept out of the inventory, with why."""
        with self.lock:
            return dict(self._bad)

    def unplaced(self) -> list[str]:
        """Keys of bound pods that hold nothing yet."""
        with self.lock:
            return sorted(self._pods[uid].key for uid in self._unplaced)


def _at_most_free(amount: int | None, free: int) -> int:
    """An unreadable pod's charge of one resource: its amount, or all that is free when it is unknown
    (None or negative), never more than is free (its node admitted it, so the rest is others')."""
    return free if amount is None or amount < 0 else min(amount, free)


def _names(candidates: Sequence[str] | NameArray) -> list[str]:
    return candidates.names() if isinstance(candidates, NameArray) else list(candidates)


def _main_reason(failed: Mapping[str, str], unresolvable: Mapping[str, str]) -> str:
    reasons = Counter(failed.values()) or Counter("unresolvable" for _ in unresolvable)
    return reasons.most_common(1)[0][0] if reasons else "no candidates"


def normalise(scores: Sequence[float | None]) -> list[int]:
    """Feasible scores (None = infeasible) to 0..10: best = 10, linear min-max, infeasible 0."""
    feasible = [s for s in scores if s is not None]
    if not feasible:
        return [0] * len(scores)
    low, high = min(feasible), max(feasible)
    span = high - low
    out = []
    for s in scores:
        if s is None:
            out.append(0)
        elif span <= 0:
            out.append(10)
        else:
            out.append(round(10 * (s - low) / span))
    return out


def api_reason(exc: BaseException) -> str:
    """A short reason from a Kubernetes client error (status and reason, not headers and body)."""
    status = getattr(exc, "status", None)
    if status is not None:
        return f"HTTP {status} {getattr(exc, 'reason', '') or ''}".strip()
    return f"{type(exc).__name__}: {exc}"
