"""The pod ledger: nodes and bound pods as the cluster's events show them, and the capacity they hold.

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
4. On a DRA node (extender/dra_inventory.py, docs/dra.md) a pod whose GPU request a ResourceClaim serves
   (KEP-5004) takes its CPU, memory and one pod slot only: its GPUs are held once, by the claim.
5. Until the source's first `Synced`, rule-2 placements wait, so that first-fit never takes a GPU a
   not-yet-listed pod legitimately claims; the order of the initial list does not matter.

Reservations (extender.reservations) live here too as far as capacity goes: the informer showing a
pod bound with its reserved assignment confirms the reservation (no second commit); pod deletion,
node loss, or TTL expiry of a reservation not yet bound gives its capacity back (`release`).
Unbound GPU pods are remembered (`pending`), so a bind arriving after a restart can be re-decided.

Not thread-safe on its own: `apply` takes the lock shared with the decisions and the binder
(`ClusterState.lock`); every other method expects its caller to hold it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from gpupack.extender.dra_inventory import DraInventory
from gpupack.extender.pod_records import BoundPod, PlacedBy, PodLife, PodRecord, identity
from gpupack.extender.reservations import Ended, Reservation, ReservationBook
from gpupack.kube.dra import extended_claim_of_pod
from gpupack.kube.keys import ANNOTATION_ASSIGNMENT
from gpupack.kube.node_facts import NodeFactsError, PriceTable, node_is_schedulable, node_name
from gpupack.kube.node_usage import NodeUsageBook, read_node_usage
from gpupack.kube.pod_request import (
    AssignmentError,
    UnreadableCharge,
    assignment_from_pod,
    request_from_pod,
    unreadable_charge,
)
from gpupack.kube.pods import (
    pod_key,
    pod_uid,
)
from gpupack.kube.sources.events import (
    DraDeleted,
    DraUpserted,
    Event,
    NodeDeleted,
    NodeUpserted,
    PodDeleted,
    PodUpserted,
    Synced,
)
from gpupack.scoring.decider import Decider
from gpupack.scoring.facts import NodeFacts, Placement
from gpupack.scoring.inventory import Inventory, InventoryError
from gpupack.scoring.request import Kind, PodRequest, RequestError

logger = logging.getLogger(__name__)

PENDING_LIMIT = 100_000  # unbound GPU pods whose request is remembered for a bind after a restart


class PodLedger:
    """Nodes, bound pods and what they hold in the inventory, kept current from source events."""

    def __init__(
        self,
        lock: threading.RLock,
        inventory: Inventory,
        book: ReservationBook,
        first_fit: Decider,
        prices: PriceTable,
    ) -> None:
        self.lock = lock
        self.inventory = inventory
        self.book = book
        self.first_fit = first_fit  # rule 2
        self.node_usage = NodeUsageBook(inventory)  # gpupack.io/devices-in-use, from gpupack agent
        self.dra = DraInventory(inventory)  # ResourceSlices and ResourceClaims (#30)
        self.on_pod_gone: list[Callable[[str], None]] = []  # told the identity of every deleted pod
        self._prices = prices
        self._bad: dict[str, str] = {}
        self._unschedulable: set[str] = set()
        self._pods: dict[str, PodRecord] = {}
        self._by_node: dict[str, set[str]] = {}
        self._unplaced: set[str] = set()
        self._unreadable: set[str] = set()  # bound pods charged conservatively (UnreadableCharge)
        self._pending: OrderedDict[str, tuple[str, PodRequest]] = OrderedDict()  # unbound GPU pods
        self._synced = False

    # ================================================================== reading (lock held)
    @property
    def synced(self) -> bool:
        """The source has delivered a complete list at least once."""
        return self._synced

    @property
    def bad(self) -> Mapping[str, str]:
        """Nodes kept out of the inventory, with why."""
        return self._bad

    @property
    def cordoned(self) -> AbstractSet[str]:
        """Nodes that are cordoned or not Ready: in the inventory, never chosen."""
        return self._unschedulable

    def bound(self, ident: str) -> PodRecord | None:
        """The record of a bound pod."""
        return self._pods.get(ident)

    def pending(self, ident: str) -> tuple[str, PodRequest] | None:
        """(key, request) of an unbound GPU pod the source has shown."""
        return self._pending.get(ident)

    def bound_pods(self) -> list[BoundPod]:
        """Every bound pod, as copies."""
        return [
            BoundPod(r.uid, r.key, r.node, r.placement, r.how, r.claimed, r.unreadable is not None, r.life)
            for r in self._pods.values()
        ]

    def on_node(self, node: str) -> list[PodRecord]:
        """The records of the pods bound to `node` (the records themselves: callers must not change them)."""
        return [self._pods[uid] for uid in self._by_node.get(node, ())]

    def counts(self) -> tuple[int, int, int]:
        """(bound pods, of them holding nothing yet, of them with an unreadable request)."""
        return len(self._pods), len(self._unplaced), len(self._unreadable)

    def placements(self) -> dict[str, Placement]:
        """The placement of every bound pod that holds one, by pod identity."""
        return {uid: r.placement for uid, r in self._pods.items() if r.placement is not None}

    def unplaced(self) -> list[str]:
        """Keys of bound pods that hold nothing yet."""
        return sorted(self._pods[uid].key for uid in self._unplaced)

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
                elif isinstance(event, DraUpserted | DraDeleted):
                    self._dra_changed(event)
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
            facts = self.dra.facts(node, self._prices)
            usage = read_node_usage(node, facts.gpu_count)
        except NodeFactsError as exc:
            self._node_gone(name, str(exc))
            return
        if node_is_schedulable(node):
            self._unschedulable.discard(name)
        else:
            self._unschedulable.add(name)
        row = self.inventory.index.get(name)
        same_usage = self.node_usage.unchanged(usage)
        if row is not None and self._same_facts(row, facts) and same_usage:
            self._dra_reconcile(name)
            return
        if row is not None and same_usage:
            try:
                self.inventory.update_node(facts)  # same GPUs: change in place, allocations stay
                self._dra_reconcile(name)
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
                self.book.forget(reservation.uid, Ended.NODE_UNUSABLE)
            self._mark_bad(name, str(exc))
            return
        if self._bad.pop(name, None) is not None:
            logger.info("node %s is usable again", name)
        self._attach(name, held)

    def _same_facts(self, row: int, facts: NodeFacts) -> bool:
        """The node's facts are unchanged, labels included (NodeFacts equality leaves them out; gangs' domains
        read them)."""
        old = self.inventory.facts[row]
        return old == facts and old is not None and old.labels == facts.labels

    def _node_gone(self, name: str, bad_reason: str | None) -> None:
        """Take a node out of the inventory (deleted, or its facts became unreadable)."""
        for reservation in self.book.on_node(name):
            self.book.forget(reservation.uid, Ended.NODE_GONE)
        if name in self.inventory.index:
            self._detach(name)
        self.node_usage.forget(name)
        if bad_reason is None:
            self.dra.forget_node(name)
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
        self.dra.detached(name)
        for uid in self._by_node.get(name, ()):
            record = self._pods[uid]
            record.placement = None
            record.how = PlacedBy.NOTHING
            self._unplaced.discard(uid)

    def _attach(self, name: str, held: Sequence[Reservation]) -> None:
        """Re-commit what a freshly added node holds: ResourceClaims' devices first (the API server's allocation),
        then the pods' own claims, then reservations, then the rest."""
        self.dra.attach(name)
        records = [self._pods[uid] for uid in self._by_node.get(name, ())]
        for record in records:
            self._take_exact(record)
        for reservation in held:
            try:
                self.inventory.commit(reservation.placement)
            except InventoryError:
                self.book.forget(reservation.uid, Ended.NODE_CHANGED)
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
            existing.life = PodLife.of(pod)  # started, terminating and labels change while it lives
            self._extended_claim_seen(existing, extended_claim_of_pod(pod))
            if existing.placement is None and self._synced:
                self._take(existing)
            return  # a bound pod never moves: its capacity stays where it is
        record = self._bound_record(pod, uid, key, node, annotation)
        record.life = PodLife.of(pod)
        record.extended_claim = extended_claim_of_pod(pod)
        if existing is not None:
            self._drop(existing)
        self._pods[uid] = record
        self._by_node.setdefault(node, set()).add(uid)
        if record.unreadable is not None:
            self._unreadable.add(uid)
        reservation = self.book.get(uid)
        if reservation is not None:
            confirmed = reservation.node == node and record.claimed == reservation.placement
            # a claim serving its GPUs holds them already: the filter's GPU slots would count them twice
            if confirmed and not self._served_by_claim(record):
                self.book.confirm(uid)
                record.placement, record.how = reservation.placement, PlacedBy.RESERVATION
                return
            self.release(self.book.forget(uid, Ended.BOUND_OTHERWISE))
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
        if uid not in self._pending and len(self._pending) >= PENDING_LIMIT:
            self._pending.popitem(last=False)
        self._pending[uid] = (key, request)
        self._pending.move_to_end(uid)

    def _pod_deleted(self, uid: str) -> None:
        for gone in self.on_pod_gone:
            gone(uid)
        self._pending.pop(uid, None)
        self.release(self.book.forget(uid, Ended.POD_DELETED))
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
            self.release(self.book.forget(reservation.uid, Ended.POD_GONE))
        for name in list(self.node_usage.usage) if first else ():
            self._hold(name)
        self._retry_unplaced(None)

    # ------------------------------------------------------------------ capacity
    def _hold(self, name: str) -> None:
        """Charge what the node's gpupack.io/devices-in-use holds beyond the pods' assignments."""
        unclaimed = {self._pods[uid].key for uid in self._by_node.get(name, ()) if self._pods[uid].claimed is None}
        self.node_usage.commit_hold(name, unclaimed)

    def _take(self, record: PodRecord) -> None:
        if not self._take_exact(record):
            self._take_fallback(record)

    def _take_exact(self, record: PodRecord) -> bool:
        """Rule 1: the pod's own valid claim (or its CPU/memory for a CPU-only pod); rule 4: its CPU/memory when
        a ResourceClaim serves its GPUs."""
        if record.node not in self.inventory.index:
            return False
        if self._served_by_claim(record):
            exact, how = (
                Placement(record.node, (), record.request.cpu_milli, record.request.memory_bytes),
                PlacedBy.CLAIM,
            )
        elif record.claimed is not None:
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
        elif record.request.kind == Kind.NONE or self._served_by_claim(record):
            self._take_exact(record)
            return
        elif (observed := self.node_usage.observed(record.node, record.key, record.request)) is not None:
            placement, how = observed, PlacedBy.DEVICES_IN_USE  # what gpupack agent saw it hold, not a guess
        else:
            request = dataclasses.replace(record.request, allowed_products=None)
            decision = self.first_fit.decide(request, ([record.node],), observe=False)
            placement, how = decision.placement, PlacedBy.FIRST_FIT
        if placement is None:
            self._mark_unplaced(record, "no free capacity fits it")
            return
        self.inventory.commit(placement)
        record.placement, record.how = placement, how
        self._unplaced.discard(record.uid)

    def _served_by_claim(self, record: PodRecord) -> bool:
        return record.unreadable is None and self.dra.serves(record.node, record.request, record.extended_claim)

    def _extended_claim_seen(self, record: PodRecord, claim: str | None) -> None:
        """A bound pod's extended-resource claim appeared (or changed): take again by rule 4 if that changes
        what it holds."""
        if claim == record.extended_claim:
            return
        was = self._served_by_claim(record)
        record.extended_claim = claim
        if record.placement is not None and was != self._served_by_claim(record):
            placement, record.placement, record.how = record.placement, None, PlacedBy.NOTHING
            self.inventory.release(placement)
            self._take(record)
            if self._synced:
                self._retry_unplaced(record.node)

    # ------------------------------------------------------------------ DRA (#30)
    def _dra_changed(self, event: DraUpserted | DraDeleted) -> None:
        """A ResourceSlice, ResourceClaim or DeviceClass changed: read the nodes it concerns again, and let
        the pods waiting on a node where a claim gave capacity back try again."""
        rebuild, freed = self.dra.apply(event)
        for name in sorted(rebuild):
            node = self.dra.nodes.get(name)
            if node is not None:
                self._node_upserted(node)
        for name in sorted(freed):
            if self._synced and name in self.inventory.index:
                self.node_usage.hold_excluded(name)
            self._retry_unplaced(name)

    def _dra_reconcile(self, name: str) -> None:
        if self.dra.reconcile(name):
            self._retry_unplaced(name)

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
        if self._synced:  # what was freed on a GPU out of service is held again, before anyone takes it
            self.node_usage.hold_excluded(placement.node)
        self._retry_unplaced(placement.node)

    def release(self, reservation: Reservation | None) -> None:
        """Give back a forgotten reservation's capacity (no-op for None or a vanished node)."""
        if reservation is not None and reservation.node in self.inventory.index:
            self._give_back(reservation.placement)

    def expire(self) -> None:
        """Forget every reservation past its TTL and give back its capacity."""
        for reservation in self.book.expire_due():
            logger.info("reservation of %s on %s expired", reservation.key, reservation.node)
            self.release(reservation)


def _at_most_free(amount: int | None, free: int) -> int:
    """An unreadable pod's charge of one resource: its amount, or all that is free when it is unknown
    (None or negative), never more than is free (its node admitted it, so the rest is others')."""
    return free if amount is None or amount < 0 else min(amount, free)


