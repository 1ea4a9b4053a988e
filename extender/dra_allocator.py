"""gpupack as DRA's device chooser (#30 item 2): pods held by the gate `gpupack.io/dra-allocation` get their
ResourceClaims allocated by gpupack, then the gate is removed and kube-scheduler only honours the allocation.

One worker thread takes gated pods in arrival order. For each:
1. The pod's claims are read fresh from the API server (a claim from a template exists once the
   resourceclaim controller made it and named it in the pod's status; until then the pod waits).
2. Claims gpupack does not read (kube/dra/requests.py) and pods that fit no DRA node now are *ungated
   without an allocation*, with the reason as an Event: kube-scheduler's own allocator then tries, and a pod
   that fits nowhere shows as Unschedulable, where autoscalers see it (a gated pod they ignore).
3. Otherwise, under the state's lock, `dra_plan.plan_claims` picks node and devices and their hold is
   committed in the inventory, so nothing else takes them while they are written.
4. Each claim gets the finalizer and its `status.allocation`, each write conditional on the resourceVersion
   read in step 1. A refused write (someone else changed or allocated the claim) drops the hold and plans
   again from a fresh read; other failures retry with a backoff, then ungate as in step 2.
5. The written claims go into the DRA inventory (their devices are held from then on, however the watch
   delivers them), the hold is dropped, the gate removed and an `AllocatedClaims` Event written.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any

from gpupack.extender.dra_plan import ClaimPlan, NoPlan, plan_claims
from gpupack.extender.pod_events import PodEvents, PodRef
from gpupack.extender.pod_ledger import PodLedger
from gpupack.kube.dra.allocation import allocated, allocation_node, with_finalizer
from gpupack.kube.dra.requests import NotOurs, RequestAsk, claim_asks
from gpupack.kube.keys import GATE_DRA_ALLOCATION
from gpupack.kube.pods import pod_key
from gpupack.kube.sources.dra_writes import Conflict, DraWriter
from gpupack.kube.sources.events import DraDeleted, DraUpserted, Event, PodDeleted, PodUpserted
from gpupack.scoring.decider import Decider
from gpupack.scoring.inventory import InventoryError

logger = logging.getLogger(__name__)

RETRY_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0)  # after a failed write; then the pod is ungated unallocated
WAIT_SECONDS = 5.0  # a pod waiting for its claims looks again this often, besides on their events
NOT_READY_SECONDS = 0.5  # before every node, pod and DRA object has been listed once, nothing is chosen


class Step(StrEnum):
    """What one attempt for a pod came to (the label of gpupack_dra_allocations)."""

    ALLOCATED = "allocated"  # gpupack wrote the allocations and removed the gate
    ALREADY = "already-allocated"  # every claim was allocated already: the gate removed
    LEFT = "left-to-kube-scheduler"  # ungated without an allocation: the reason is in an Event
    WAITING = "waiting-for-claims"  # a claim does not exist yet
    RACE = "lost-race"  # a write was refused as stale: planned again
    FAILED = "write-failed"  # the API server failed a write: retried later


class DraAllocator:
    """The gated pods, and the worker that allocates their claims."""

    def __init__(
        self,
        lock: threading.RLock,
        ledger: PodLedger,
        decider: Decider,
        events: PodEvents,
        apply: Callable[[Event], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`apply` is the state's event entry (the written claims go through it like watched ones)."""
        self._lock = lock
        self._ledger = ledger
        self._decider = decider
        self._events = events
        self._apply = apply
        self.ready: Callable[[], bool] = lambda: ledger.synced  # the service adds: every DRA kind listed
        self.writer: DraWriter | None = None
        self.steps: Counter[Step] = Counter()
        self._clock = clock
        self._cond = threading.Condition()
        self._pods: dict[str, dict[str, Any]] = {}  # gated, unbound pods by key, their latest body
        self._due: OrderedDict[str, float] = OrderedDict()  # pod key -> when to try (arrival order)
        self._failures: Counter[str] = Counter()  # failed attempts in a row, by pod key
        self._given_up: set[str] = set()  # pods whose writes kept failing: ungated unallocated next
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # ------------------------------------------------------------------ what the source shows
    def observe(self, event: Event) -> None:
        """Follow one source event: gated pods come and go; a claim that appears may be one a pod waits for."""
        with self._cond:
            due_now: list[str] = []
            if isinstance(event, PodUpserted):
                due_now = self._pod(event.pod)
            elif isinstance(event, PodDeleted):
                self._forget(event.key)
            elif isinstance(event, (DraUpserted, DraDeleted)) and event.kind == "ResourceClaim":
                due_now = self._waiting_on(event.key)
            if due_now:
                now = self._clock()
                for key in due_now:
                    self._due[key] = min(self._due.get(key, now), now)
                # only then: every pod event passes here, and a wake per event cost the worker a thread
                # switch per bind under a burst (#32); a pod gone or bound needs none (its entry is dropped)
                self._cond.notify()

    def _pod(self, pod: dict[str, Any]) -> list[str]:
        """Track a gated, unbound pod (the keys to look at now: it, new or changed), or forget any other."""
        key = pod_key(pod)
        gates = (pod.get("spec") or {}).get("schedulingGates") or []
        if (pod.get("spec") or {}).get("nodeName") or not any(g.get("name") == GATE_DRA_ALLOCATION for g in gates):
            self._forget(key)
            return []
        self._pods[key] = pod
        return [key]  # new, or changed (its claims named): look now

    def _waiting_on(self, claim: str) -> list[str]:
        """The gated pods that use the claim `namespace/name`, or whose template claims are not all made yet."""
        namespace = claim.partition("/")[0]
        waiting = []
        for key, pod in self._pods.items():
            if key.startswith(f"{namespace}/"):
                names = claim_names(pod)
                if names is None or claim in names:
                    waiting.append(key)
        return waiting

    def _forget(self, key: str) -> None:
        self._pods.pop(key, None)
        self._due.pop(key, None)
        self._failures.pop(key, None)
        self._given_up.discard(key)

    # ------------------------------------------------------------------ the worker
    def start(self) -> None:
        """Start the worker thread (once a writer is set)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gpupack-dra-allocator", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the worker thread."""
        self._stop.set()
        with self._cond:
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            pod = self._next()
            if pod is None:
                continue
            try:
                self.attempt(pod)
            except Exception:
                logger.exception("DRA: allocating for pod %s failed", pod_key(pod))
                self.steps[Step.FAILED] += 1
                self._again(pod_key(pod), Step.FAILED)

    def _next(self) -> dict[str, Any] | None:
        """The next pod due, waiting until one is (None: woken with nothing due, or not ready yet)."""
        with self._cond:
            if not self.ready():
                self._cond.wait(timeout=NOT_READY_SECONDS)
                return None
            now = self._clock()
            due = next((key for key, at in self._due.items() if at <= now), None)
            if due is None:
                wait = min((at - now for at in self._due.values()), default=WAIT_SECONDS)
                self._cond.wait(timeout=max(0.01, min(wait, WAIT_SECONDS)))
                return None
            del self._due[due]
            return self._pods.get(due)

    # ------------------------------------------------------------------ one pod
    def attempt(self, pod: dict[str, Any]) -> Step:
        """One attempt to allocate the gated pod's claims; what it came to (counted)."""
        step = self._attempt(pod)
        self.steps[step] += 1
        key = pod_key(pod)
        if step in (Step.WAITING, Step.RACE, Step.FAILED):
            self._again(key, step)
        return step

    def _attempt(self, pod: dict[str, Any]) -> Step:
        writer = self.writer
        if writer is None:
            return Step.FAILED
        if pod_key(pod) in self._given_up:
            return self._leave(
                pod, f"writing its allocation failed {len(RETRY_SECONDS) + 1} times (gpupack's log says why)"
            )
        names = claim_names(pod)
        if names is None:
            return Step.WAITING
        claims = {name: writer.get_claim(*name.split("/", 1)) for name in names}
        if any(claim is None for claim in claims.values()):
            return Step.WAITING
        free = {name: claim for name, claim in claims.items() if claim is not None and allocation_node(claim) is None}
        nodes = {allocation_node(c) for c in claims.values() if c is not None} - {None}
        if len(nodes) > 1:
            return self._leave(
                pod, f"its claims are allocated on different nodes: {', '.join(sorted(map(str, nodes)))}"
            )
        if not free:
            return self._ungate(pod, Step.ALREADY, "every claim of the pod was allocated already")
        asks = self._asks(free)
        if isinstance(asks, str):
            return self._leave(pod, asks)
        with self._lock:
            plan = plan_claims(self._ledger, self._decider, pod, asks, next(iter(nodes), None))
            if isinstance(plan, NoPlan):
                return self._leave(pod, plan.reason)
            self._ledger.inventory.commit(plan.hold)
        return self._write(pod, plan, free)

    def _asks(self, free: Mapping[str, dict[str, Any]]) -> dict[str, tuple[RequestAsk, ...]] | str:
        classes = self._ledger.dra.class_specs
        try:
            return {name: claim_asks(claim, classes) for name, claim in free.items()}
        except NotOurs as exc:
            return f"kube-scheduler allocates it: {exc}"

    def _write(self, pod: dict[str, Any], plan: ClaimPlan, free: Mapping[str, dict[str, Any]]) -> Step:
        """Write each claim's allocation, then hand the written claims to the inventory and drop the hold."""
        writer = self.writer
        assert writer is not None
        written: list[dict[str, Any]] = []
        classes = self._ledger.dra.class_specs
        try:
            for name, chosen in plan.devices.items():
                claim = free[name]
                protected = with_finalizer(claim)
                if protected is not None:
                    claim = writer.replace_claim(protected)
                written.append(writer.replace_claim_status(allocated(claim, chosen, plan.node, classes)))
        except Conflict as exc:
            logger.info("DRA: pod %s: %s; planning again", pod_key(pod), exc)
            return self._settle(plan, written, Step.RACE)
        except Exception:
            logger.exception("DRA: pod %s: writing an allocation failed", pod_key(pod))
            return self._settle(plan, written, Step.FAILED)
        self._settle(plan, written, Step.ALLOCATED)
        note = f"gpupack allocated {', '.join(sorted(plan.devices))} on {plan.node}: " + "; ".join(
            f"{c.request}={c.device}" for chosen in plan.devices.values() for c in chosen
        )
        return self._ungate(pod, Step.ALLOCATED, note)

    def _settle(self, plan: ClaimPlan, written: list[dict[str, Any]], step: Step) -> Step:
        """The written claims into the DRA inventory (their devices held from now on), the hold given back."""
        with self._lock:  # one step for everyone else: the devices go from the hold to their claims
            try:
                self._ledger.inventory.release(plan.hold)
            except InventoryError:
                logger.exception("DRA: inventory out of step releasing the hold on %s", plan.node)
            for claim in written:
                self._apply(DraUpserted({**claim, "kind": "ResourceClaim"}))
        return step

    def _leave(self, pod: dict[str, Any], reason: str) -> Step:
        """Ungate the pod without an allocation: kube-scheduler's allocator has it from here."""
        logger.info("DRA: pod %s left to kube-scheduler: %s", pod_key(pod), reason)
        return self._ungate(pod, Step.LEFT, f"gpupack left the pod's claims to kube-scheduler: {reason}")

    def _ungate(self, pod: dict[str, Any], step: Step, note: str) -> Step:
        writer = self.writer
        assert writer is not None
        try:
            writer.remove_gate(pod, GATE_DRA_ALLOCATION)
        except Conflict:
            return Step.RACE  # the pod changed: its new body is (or will be) queued
        self._events.note(PodRef.of(pod), note, warning=step == Step.LEFT)
        with self._cond:
            self._forget(pod_key(pod))
        return step

    def _again(self, key: str, step: Step) -> None:
        """Queue the pod again: at once after a lost race, later while waiting or after a failure."""
        with self._cond:
            if key not in self._pods:
                return
            if step == Step.FAILED:
                self._retry(key)
                return
            self._due[key] = self._clock() + (0.0 if step == Step.RACE else WAIT_SECONDS)
            self._cond.notify()

    def _retry(self, key: str) -> None:
        """Try again after a backoff; past the last one, once more to ungate it unallocated."""
        failures = self._failures[key] = self._failures[key] + 1
        if failures > len(RETRY_SECONDS):
            self._given_up.add(key)
            self._due[key] = self._clock()
            return
        self._due[key] = self._clock() + RETRY_SECONDS[failures - 1]

    # ------------------------------------------------------------------ read-outs
    def waiting(self) -> int:
        """Gated pods gpupack has not finished with."""
        with self._cond:
            return len(self._pods)

    def due(self) -> list[str]:
        """The gated pods (by key) due for an attempt now, in arrival order."""
        with self._cond:
            now = self._clock()
            return [key for key, at in self._due.items() if at <= now]


def claim_names(pod: Mapping[str, Any]) -> list[str] | None:
    """`namespace/name` of each claim the pod uses; None while a template's claim has not been made yet."""
    namespace = (pod.get("metadata") or {}).get("namespace") or "default"
    statuses = {
        s.get("name"): s.get("resourceClaimName") for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    names: list[str] = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        if entry.get("resourceClaimName"):
            names.append(f"{namespace}/{entry['resourceClaimName']}")
        elif entry.get("name") not in statuses:
            return None
        elif statuses[entry.get("name")]:  # null: the pod needs no claim for this entry
            names.append(f"{namespace}/{statuses[entry.get('name')]}")
    return names


__all__ = ["DraAllocator", "Step", "claim_names"]
