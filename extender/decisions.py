"""Decisions: where a pod goes (filter, prioritize, explain), from the pod ledger's picture.

Filter decides in filter (docs/contracts.md#extender-http-api): it chooses one node, commits the chosen
placement at once and records it as a reservation (extender.reservations), so the next filter sees it;
kube-scheduler's retry of the same pod gets its reservation back. `decideInFilter: false` and prioritize
only look.

Before the source's first `Synced` nothing is decided (the HTTP layer answers an `Error`), because
a partial picture could hand out a GPU that a not-yet-listed pod holds.

The request of each pod seen here is remembered (`SeenRequests`, bounded in count and bytes)
for a bind that finds its reservation expired. A pod that keeps finding no node is told so with an
event (extender.pod_events). The lock is the one shared with the ledger and the binder.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

import numpy as np

from gpupack.extender.gangs import Gangs, MemberAnswer
from gpupack.extender.inline import leave_the_loop_if_heavy
from gpupack.extender.nominations import Nominations
from gpupack.extender.pod_events import PodEvents, PodRef, no_node_note
from gpupack.extender.pod_ledger import PodLedger
from gpupack.extender.pod_records import identity
from gpupack.extender.reservations import Ended, ReservationBook
from gpupack.extender.settings import Settings
from gpupack.kube.pod_request import request_from_pod
from gpupack.kube.pods import pod_key, pod_uid
from gpupack.scoring.decider import Decider
from gpupack.scoring.engine import Decision, reason_texts
from gpupack.scoring.facts import Placement
from gpupack.scoring.names import NameArray, RowReasons
from gpupack.scoring.request import PodRequest, RequestError

decision_log = logging.getLogger("gpupack.decisions")

UNKNOWN_NODE = "node unknown to gpupack"
UNSCHEDULABLE_NODE = "node is cordoned or not Ready"
NOT_CHOSEN = "gpupack chose another node"
SEEN_LIMIT = 100_000  # pods whose request is remembered between filter and bind
SEEN_BYTES_LIMIT = 64 << 20  # ... and their size: a request can name many GPU products (#13 item 3)
Answer = TypeVar("Answer")
Verdicts = tuple[str | None, Mapping[str, str], dict[str, str]]  # chosen node, FailedNodes, FailedAndUnresolvable
AnswerBuilder = Callable[[str | None, Mapping[str, str], dict[str, str]], Answer]


class Outcome(StrEnum):
    """What a filter call came to: the `outcome` label of gpupack_decisions."""

    PLACED = "placed"  # a node chosen and reserved
    REUSED = "reused"  # the pod's reservation handed back (kube-scheduler retried)
    UNSCHEDULABLE = "unschedulable"  # no candidate fits
    FEASIBLE = "feasible"  # decideInFilter: false, some candidates fit
    BAD_REQUEST = "bad-request"  # the pod's request cannot be placed anywhere
    NOMINATED = "nominated"  # a preemptor given the placement held for it since its victims went (#28)
    GROUP = "group"  # a group member given its placement in its group's plan (#29)


def verdicts(chosen: str | None, failed: Mapping[str, str], unresolvable: dict[str, str]) -> Verdicts:
    """decide_for_filter's default answer: (chosen node or None, FailedNodes, FailedAndUnresolvableNodes)."""
    return chosen, failed, unresolvable


@dataclass
class Evaluation:
    """Where a pod would go, without reserving anything (for `explain` and decideInFilter: false)."""

    request: PodRequest | None
    decision: Decision | None
    unresolvable: dict[str, str]
    error: str = ""


def request_bytes(uid: str, key: str, request: PodRequest) -> int:
    """About what one remembered request holds: its strings and a fixed overhead per object."""
    products = request.allowed_products or ()
    return 512 + len(uid) + len(key) + sum(64 + len(product) for product in products)


class SeenRequests:
    """The request of each pod filtered or prioritized, by identity, for its bind: at most SEEN_LIMIT
    of them and SEEN_BYTES_LIMIT bytes (`request_bytes`), the oldest dropped first."""

    def __init__(self) -> None:
        self._requests: OrderedDict[str, tuple[str, PodRequest]] = OrderedDict()
        self.bytes = 0  # request_bytes() summed over the entries

    def __contains__(self, ident: str) -> bool:
        return ident in self._requests

    def get(self, ident: str) -> tuple[str, PodRequest] | None:
        """(key, request) of a remembered pod."""
        return self._requests.get(ident)

    def remember(self, ident: str, key: str, request: PodRequest) -> None:
        """Keep the pod's request as the newest, making room by dropping the oldest."""
        self.forget(ident)
        size = request_bytes(ident, key, request)
        requests = self._requests
        while requests and (len(requests) >= SEEN_LIMIT or self.bytes + size > SEEN_BYTES_LIMIT):
            self.forget(next(iter(requests)))  # the oldest first
        requests[ident] = (key, request)
        self.bytes += size

    def forget(self, ident: str) -> None:
        """Drop the pod's request, if remembered."""
        seen = self._requests.pop(ident, None)
        if seen is not None:
            self.bytes -= request_bytes(ident, *seen)

    def entries(self) -> dict[str, tuple[str, PodRequest]]:
        """A copy of every (key, request) by identity, the oldest first."""
        return dict(self._requests)


class ServiceDecisions:
    """The service's filter, prioritize and explain answers: the one `Decider` (scoring.decider) over the
    ledger's picture, with reservations, events and counts; filter reserves what it chooses."""

    def __init__(
        self,
        lock: threading.RLock,
        settings: Settings,
        ledger: PodLedger,
        decider: Decider,
        book: ReservationBook,
        events: PodEvents,
        nominations: Nominations | None = None,
        gangs: Gangs | None = None,
    ) -> None:
        self.lock = lock
        self.settings = settings
        self.ledger = ledger
        self.inventory = ledger.inventory
        self.decider = decider
        self.book = book
        self.events = events
        self.nominations = nominations  # holds for nominated preemptors (extender.nominations)
        self.gangs = gangs  # groups placed whole (extender.gangs)
        self.seen = SeenRequests()
        self.counts: Counter[tuple[Outcome, str]] = Counter()  # decisions by (outcome, reason)
        self._reason_texts = reason_texts(NOT_CHOSEN)

    def _request(self, pod: Mapping[str, Any]) -> tuple[str, str, PodRequest]:
        """(identity, key, request) of a pod sent by kube-scheduler; the mix learns each pod once."""
        key = pod_key(pod)
        uid = identity(pod_uid(pod), key)
        request = request_from_pod(pod)
        leave_the_loop_if_heavy(request)
        if uid not in self.seen:
            self.decider.observe(request)
        self.seen.remember(uid, key, request)
        return uid, key, request

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
        unresolvable = {name: self.ledger.bad.get(name, UNKNOWN_NODE) for name in unknown}
        for name in self.ledger.cordoned:  # few, so walked instead of the candidates
            row = inventory.index.get(name)
            if row is not None and mask[row]:
                mask[row] = False
                unresolvable[name] = UNSCHEDULABLE_NODE
        return mask, unresolvable

    def decide_for_filter(
        self,
        pod: Mapping[str, Any],
        candidates: Sequence[str] | NameArray,
        answer: AnswerBuilder[Answer],
    ) -> Answer:
        """Choose one node among `candidates` and reserve its placement (decide in filter).

        `answer(chosen node or None, FailedNodes, FailedAndUnresolvableNodes)` builds what is
        returned (by default that tuple). It runs under the lock before the placement is committed,
        so an answer that cannot be built reserves nothing (#13). A pod that already holds a
        reservation on a candidate gets it back (kube-scheduler retries).
        """
        started = time.perf_counter()
        with self.lock:
            self.ledger.expire()
            try:
                uid, key, request = self._request(pod)
            except RequestError as exc:
                self.counts[Outcome.BAD_REQUEST, "invalid pod request"] += 1
                reason = str(exc)
                self.events.failed(PodRef.of(pod), lambda: f"the pod's request cannot be placed: {reason}")
                return answer(None, {}, dict.fromkeys(_names(candidates), reason))
            known, unresolvable = self._split(candidates)
            settled = self._settled(uid, known, unresolvable, answer)
            if settled is not None:
                return settled
            member = self.gangs.read(pod, key) if self.gangs is not None else None
            if member is not None:
                group = self.gangs.answer(member, uid, request, known)  # type: ignore[union-attr]  # member: gangs set
                if group is not None:
                    return self._group_member(pod, (uid, key, request), group, known, unresolvable, answer, started)
            if self.nominations is not None:
                self.nominations.refresh()
                held = self.nominations.ready(uid, known)
                if held is not None:
                    return self._hand_over(uid, key, request, held, known, unresolvable, answer, started)
            return self._decide(pod, (uid, key, request), known, unresolvable, answer, started)

    def _settled(
        self, uid: str, known: np.ndarray, unresolvable: dict[str, str], answer: AnswerBuilder[Answer]
    ) -> Answer | None:
        """The answer for a pod already bound (no candidate) or already holding a reservation on a candidate
        (kube-scheduler retries: the same node), else None. A reservation on a node no longer a candidate
        is released."""
        bound = self.ledger.bound(uid)
        if bound is not None:
            reason = f"pod is already bound to {bound.node}"
            rows = np.flatnonzero(known).tolist()
            bound_reasons = {name: reason for row in rows if (name := self.inventory.names[row]) is not None}
            return answer(None, {}, {**unresolvable, **bound_reasons})
        reservation = self.book.get(uid)
        if reservation is None:
            return None
        row = self.inventory.index.get(reservation.node)
        if row is not None and known[row]:
            self.counts[Outcome.REUSED, ""] += 1
            return answer(reservation.node, self._failed_nodes(known, row, None), unresolvable)
        self.ledger.release(self.book.forget(uid, Ended.NOT_A_CANDIDATE))
        return None

    def _decide(
        self,
        pod: Mapping[str, Any],
        pod_request: tuple[str, str, PodRequest],
        known: np.ndarray,
        unresolvable: dict[str, str],
        answer: AnswerBuilder[Answer],
        started: float,
    ) -> Answer:
        """The engine's choice among the `known` candidates, reserved before the answer is returned."""
        uid, key, request = pod_request
        decision = self.decider.decide(request, (known,), observe=False)
        unresolvable.update(decision.unresolvable())  # what the nodes lack: no preemption helps (#18)
        placement = decision.placement
        if placement is None:
            failed = self._failed_nodes(known, -1, decision)
            self.counts[Outcome.UNSCHEDULABLE, _main_reason(failed, unresolvable)] += 1
            self.events.failed(PodRef.of(pod), lambda: no_node_note(failed, unresolvable))
            self._log(key, None, None, started, decision.rows.size)
            return answer(None, failed, unresolvable)
        chosen = self.inventory.index[placement.node]
        built = answer(placement.node, self._failed_nodes(known, chosen, decision), unresolvable)
        self.inventory.commit(placement)
        self.book.assume(uid, key, placement, request)
        if self.nominations is not None:
            self.nominations.placed_elsewhere(uid)
        self.counts[Outcome.PLACED, ""] += 1
        self._log(key, placement, decision.score_of(chosen), started, decision.rows.size)
        return built

    def _hand_over(
        self,
        uid: str,
        key: str,
        request: PodRequest,
        held: Placement,
        known: np.ndarray,
        unresolvable: dict[str, str],
        answer: AnswerBuilder[Answer],
        started: float,
    ) -> Answer:
        """A nominee's filter: the placement held for it since its victims went becomes its reservation."""
        assert self.nominations is not None
        row = self.inventory.index[held.node]
        built = answer(held.node, self._failed_nodes(known, row, None), unresolvable)  # nothing changed yet
        placement = self.nominations.hand_over(uid)
        if placement is None:  # the inventory refused it (cannot happen while the pieces were held)
            return answer(None, self._failed_nodes(known, -1, None), unresolvable)
        self.book.assume(uid, key, placement, request)
        self.counts[Outcome.NOMINATED, ""] += 1
        self._log(key, placement, None, started, int(known.sum()))
        return built

    def _group_member(
        self,
        pod: Mapping[str, Any],
        pod_request: tuple[str, str, PodRequest],
        group: MemberAnswer,
        known: np.ndarray,
        unresolvable: dict[str, str],
        answer: AnswerBuilder[Answer],
        started: float,
    ) -> Answer:
        """A group member's filter (extender.gangs): its planned placement reserved, or its group's reason on
        every candidate (unresolvable: evicting pods for one member does not place the group)."""
        uid, key, request = pod_request
        placement = group.placement
        if placement is None:
            reason = group.reason
            names = [name for row in np.flatnonzero(known).tolist() if (name := self.inventory.names[row]) is not None]
            self.counts[Outcome.UNSCHEDULABLE, f"group {group.outcome}"] += 1
            self.events.failed(PodRef.of(pod), lambda: reason)
            return answer(None, {}, {**unresolvable, **dict.fromkeys(names, reason)})
        row = self.inventory.index[placement.node]
        built = answer(placement.node, self._failed_nodes(known, row, None), unresolvable)  # nothing changed yet
        group.take()
        self.book.assume(uid, key, placement, request)
        if self.nominations is not None:
            self.nominations.placed_elsewhere(uid)
        self.counts[Outcome.GROUP, ""] += 1
        self._log(key, placement, None, started, int(known.sum()))
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
        """decideInFilter: false — every feasible candidate passes, nothing is reserved. A nominee whose
        placement is held whole gets its hold given back first, to compete for it now (nothing reserves)."""
        with self.lock:
            self.ledger.expire()
            if self.nominations is not None:
                self.nominations.refresh()
                self.nominations.let_go(identity(pod_uid(pod), pod_key(pod)))
            evaluation = self._evaluate(pod, candidates)
            decision = evaluation.decision
            if decision is None:
                self.counts[Outcome.BAD_REQUEST, "invalid pod request"] += 1
                self.events.failed(PodRef.of(pod), lambda: f"the pod's request cannot be placed: {evaluation.error}")
                return [], {}, evaluation.unresolvable
            passed = list(decision.feasible_scores())
            self.counts[Outcome.FEASIBLE if passed else Outcome.UNSCHEDULABLE, ""] += 1
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
            self.ledger.expire()
            uid = identity(pod_uid(pod), pod_key(pod))
            if self.ledger.bound(uid) is not None:
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
                candidates = [*self.inventory.index, *self.ledger.bad]
            return self._evaluate(pod, candidates)

    def _evaluate(self, pod: Mapping[str, Any], candidates: Sequence[str] | NameArray) -> Evaluation:
        try:
            _, _, request = self._request(pod)
        except RequestError as exc:
            return Evaluation(None, None, dict.fromkeys(_names(candidates), str(exc)), str(exc))
        known, unresolvable = self._split(candidates)
        decision = self.decider.decide(request, (known,), observe=False)
        return Evaluation(request, decision, {**unresolvable, **decision.unresolvable()})

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
