"""The life of a filter decision, as kube-scheduler's own cache names it (STYLE.md).

    ASSUMED ──start_bind──► BINDING ──confirm──► CONFIRMED
       │                      │
       └── forget / expire ───┴──► FORGOTTEN

- ASSUMED: filter chose a node and placement; the capacity is held and a TTL runs.
- BINDING: bind is writing the annotation and the Binding; no TTL while the writes are in flight.
  Once the Binding exists (`finish_bind`) the pod *is* bound, so there is no TTL either: releasing
  the hold before the informer shows the pod would let the next filter hand out capacity the pod
  uses (kube-scheduler stopped expiring bound assumed pods for this reason, kubernetes#106361).
  The hold ends when the informer confirms it, the pod or node goes, or — for a pod deleted
  while the watch was down and never seen again — at the first relist more than a TTL after the
  Binding was made (`orphans`: such a list must have shown the pod, had it still existed).
- CONFIRMED: the informer saw the pod bound with this placement; the pod itself now holds the
  capacity and the reservation leaves the book.
- FORGOTTEN: bind failed, the pod was deleted, its node vanished or the TTL expired; the caller
  gives the capacity back.

This module only tracks states and deadlines; `ClusterState` commits and releases the capacity.
Every transition returns the reservation it changed (None when there was nothing to change), so
the caller knows exactly what to release. Not thread-safe on its own: `ClusterState` holds its lock.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from gpupack.scoring.facts import Placement
from gpupack.scoring.request import PodRequest

Clock = Callable[[], float]


class Ended(StrEnum):
    """How a reservation ended: the `how` label of gpupack_reservations_ended."""

    CONFIRMED = "confirmed"  # the informer saw the pod bound with it
    EXPIRED = "expired"  # its TTL passed before bind started
    BIND_FAILED = "bind failed"
    POD_DELETED = "pod deleted"
    POD_GONE = "pod gone"  # bound, yet missing from a relist more than a TTL later
    BOUND_OTHERWISE = "bound otherwise"  # seen bound on another node or with another placement
    NODE_GONE = "node gone"  # deleted, or its facts became unreadable
    NODE_CHANGED = "node changed"  # its GPUs changed under it, or bind named another node
    NODE_UNUSABLE = "node unusable"  # its new facts do not fit the inventory
    NOT_A_CANDIDATE = "not a candidate"  # filter asked again without its node
    GROUP_RELEASED = "group released"  # another member of its group failed to bind (#29)


class ReservationState(StrEnum):
    """Where a reservation is in its life."""

    ASSUMED = "assumed"
    BINDING = "binding"
    CONFIRMED = "confirmed"
    FORGOTTEN = "forgotten"


@dataclass
class Reservation:
    """Capacity held for one pod between filter and the informer seeing it bound."""

    uid: str
    key: str  # namespace/name
    placement: Placement
    request: PodRequest
    state: ReservationState
    deadline: float | None  # None once bind has started
    bound_at: float | None = None  # when the Binding was created

    @property
    def node(self) -> str:
        """The node the capacity is held on."""
        return self.placement.node


class ReservationBook:
    """Live reservations by pod uid, and the only place their states change."""

    def __init__(self, ttl_seconds: float, clock: Clock) -> None:
        self.ttl = ttl_seconds
        self.clock = clock
        self._live: dict[str, Reservation] = {}
        # (deadline, tie, reservation) of every ASSUMED reservation, soonest first; entries of
        # reservations that since moved on are skipped when they come up, so expiry costs what expires
        self._deadlines: list[tuple[float, int, Reservation]] = []
        self._tie = itertools.count()
        self.ended: Counter[Ended] = Counter()  # how reservations ended

    def get(self, uid: str) -> Reservation | None:
        """The live reservation of a pod, if any."""
        return self._live.get(uid)

    def live(self) -> list[Reservation]:
        """Every ASSUMED or BINDING reservation."""
        return list(self._live.values())

    def on_node(self, node: str) -> list[Reservation]:
        """Live reservations holding capacity on `node`."""
        return [r for r in self._live.values() if r.node == node]

    def counts(self) -> dict[ReservationState, int]:
        """Live reservations by state."""
        counts = dict.fromkeys((ReservationState.ASSUMED, ReservationState.BINDING), 0)
        for reservation in self._live.values():
            counts[reservation.state] += 1
        return counts

    # ------------------------------------------------------------------ transitions
    def assume(self, uid: str, key: str, placement: Placement, request: PodRequest) -> Reservation:
        """Record a filter decision whose capacity the caller has just committed."""
        if uid in self._live:
            raise ValueError(f"pod {key} already holds a reservation")
        deadline = self.clock() + self.ttl
        reservation = Reservation(uid, key, placement, request, ReservationState.ASSUMED, deadline)
        self._live[uid] = reservation
        heapq.heappush(self._deadlines, (deadline, next(self._tie), reservation))
        return reservation

    def start_bind(self, uid: str) -> Reservation | None:
        """ASSUMED -> BINDING (the TTL stops while the writes are in flight)."""
        reservation = self._live.get(uid)
        if reservation is None or reservation.state != ReservationState.ASSUMED:
            return None
        reservation.state = ReservationState.BINDING
        reservation.deadline = None
        return reservation

    def finish_bind(self, uid: str) -> Reservation | None:
        """The Binding exists: hold (no TTL) until the informer confirms; remember when."""
        reservation = self._live.get(uid)
        if reservation is None or reservation.state != ReservationState.BINDING:
            return None
        reservation.bound_at = self.clock()
        return reservation

    def bind_unsure(self, uid: str) -> Reservation | None:
        """BINDING -> ASSUMED with a new TTL: the Binding's answer was lost, so it may exist. The capacity
        stays held until the informer confirms the pod bound, sees it deleted or bound otherwise, the pod
        is filtered again, or the TTL passes without any of these."""
        reservation = self._live.get(uid)
        if reservation is None or reservation.state != ReservationState.BINDING:
            return None
        reservation.state = ReservationState.ASSUMED
        reservation.deadline = self.clock() + self.ttl
        heapq.heappush(self._deadlines, (reservation.deadline, next(self._tie), reservation))
        return reservation

    def orphans(self) -> list[Reservation]:
        """Finished binds older than the TTL still unconfirmed: right after a relist, their pods are gone."""
        cutoff = self.clock() - self.ttl
        return [r for r in self._live.values() if r.bound_at is not None and r.bound_at <= cutoff]

    def confirm(self, uid: str) -> Reservation | None:
        """ASSUMED/BINDING -> CONFIRMED: the pod is bound; it leaves the book (its capacity stays held)."""
        reservation = self._live.pop(uid, None)
        if reservation is None:
            return None
        reservation.state = ReservationState.CONFIRMED
        reservation.deadline = None
        self.ended[Ended.CONFIRMED] += 1
        return reservation

    def forget(self, uid: str, why: Ended) -> Reservation | None:
        """-> FORGOTTEN (bind failed, pod deleted, node gone, ...): the caller releases the capacity."""
        reservation = self._live.pop(uid, None)
        if reservation is None:
            return None
        reservation.state = ReservationState.FORGOTTEN
        reservation.deadline = None
        self.ended[why] += 1
        return reservation

    def expire_due(self, now: float | None = None) -> list[Reservation]:
        """Forget every reservation whose deadline has passed; returns them for release."""
        now = self.clock() if now is None else now
        expired: list[Reservation] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, _, reservation = heapq.heappop(self._deadlines)
            if self._live.get(reservation.uid) is reservation and reservation.deadline == deadline:
                expired.append(reservation)
                self.forget(reservation.uid, Ended.EXPIRED)
        return expired
