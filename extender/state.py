"""The live cluster picture the extender answers from, and the one object the rest of the code uses.

`ClusterState` is a façade over these parts, each in a module of its own, sharing one lock
(`ClusterState.lock`, a `threading.RLock`) that serialises every decision and every event application:

- the pod ledger (extender.pod_ledger): nodes and bound pods from source events, and the capacity
  they hold in the `Inventory` — the accounting rules, restarts and forged annotations included;
- the decisions (extender.decisions.ServiceDecisions): filter, which chooses and reserves at once,
  prioritize and explain, all through the one decider (scoring.decider.Decider);
- the binder (extender.binder): the Binding that carries the assignment, written with the lock
  released;
- gangs (#29): groups placed whole (extender.gangs, over the roster of extender.gang_roster), followed
  around each source event and answered by filter;
- preemption (#28): the preempt verb's plans (extender.preemption, over extender.occupants and the
  PodDisruptionBudgets of extender.budgets), and the holds of nominated preemptors
  (extender.nominations), applied around each source event and handed over by filter.

Reservations (extender.reservations) are what filter hands to bind; Events on pods
(extender.pod_events) are written by a thread of their own and never hold the lock.
The read-outs below (`snapshot`, `bound_pods`, `remembered_requests`, ...) are what /metrics,
`explain` and the tests read; each is a copy taken under the lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from gpupack.extender.binder import Binder, BindFailure
from gpupack.extender.budgets import DisruptionBudgets
from gpupack.extender.decisions import (
    Answer,
    AnswerBuilder,
    Evaluation,
    Outcome,
    ServiceDecisions,
    Verdicts,
    verdicts,
)
from gpupack.extender.dra_allocator import DraAllocator
from gpupack.extender.gangs import Gangs
from gpupack.extender.nominations import Nominations
from gpupack.extender.pod_events import PodEvents
from gpupack.extender.pod_ledger import PodLedger
from gpupack.extender.pod_records import BoundPod
from gpupack.extender.preemption import Check, Preemptions
from gpupack.extender.reservations import Clock, ReservationBook
from gpupack.extender.settings import Settings
from gpupack.kube.node_usage import Exclusion
from gpupack.kube.sources.events import Event
from gpupack.kube.sources.kube_api import ClusterWriter
from gpupack.scoring.decider import Decider
from gpupack.scoring.facts import Placement
from gpupack.scoring.inventory import Inventory
from gpupack.scoring.names import NameArray
from gpupack.scoring.policies import baseline
from gpupack.scoring.preemption import VictimPlan
from gpupack.scoring.request import PodRequest
from gpupack.scoring.usage import UsageTotals

logger = logging.getLogger(__name__)


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
    preempt_calls: dict[str, int] = field(default_factory=dict)  # preempt calls by outcome
    preempt_nodes: dict[str, int] = field(default_factory=dict)  # proposed nodes by outcome
    holds: int = 0  # nominees holding some of their planned placement
    holds_ended: dict[str, int] = field(default_factory=dict)  # nominees' holds ended, by how
    group_plans: dict[str, int] = field(default_factory=dict)  # group members' filters, by outcome (#29)
    group_holds: int = 0  # groups holding planned placements no member claimed yet
    group_holds_ended: dict[str, int] = field(default_factory=dict)  # groups' holds ended, by how
    dra_steps: dict[str, int] = field(default_factory=dict)  # DRA allocator's attempts, by step (#30)
    dra_waiting: int = 0  # gated pods the DRA allocator has not finished with
    events: dict[str, int] = field(default_factory=dict)  # events on pods written, by reason
    event_failures: dict[str, int] = field(default_factory=dict)  # ... not written, by why
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RememberedRequests:
    """The requests kept between filter and bind (extender.decisions.SeenRequests), as a copy."""

    entries: dict[str, tuple[str, PodRequest]]  # identity -> (key, request), the oldest first
    bytes: int  # request_bytes() summed over the entries, bounded by SEEN_BYTES_LIMIT


class ClusterState:
    """Nodes, bound pods and reservations, and the decisions made from them."""

    def __init__(self, settings: Settings, clock: Clock = time.monotonic) -> None:
        self.settings = settings
        self.lock = threading.RLock()
        self.inventory = Inventory()
        self.usage = UsageTotals(self.inventory)
        self.decider = Decider(self.inventory, settings.policy_spec())  # `random` draws unseeded (contracts.md#cli)
        self.book = ReservationBook(settings.reservation_ttl_seconds, clock)
        first_fit = Decider(self.inventory, baseline("first-fit"))
        self.ledger = PodLedger(self.lock, self.inventory, self.book, first_fit, settings.price_table())
        self.node_usage = self.ledger.node_usage  # gpupack.io/devices-in-use, from gpupack agent
        self.events = PodEvents(lambda: self.binder.writer, clock)  # Events on pods, written through the writer
        self.nominations = Nominations(self.inventory, clock)  # holds for nominated preemptors (#28)
        self.gangs = Gangs(self.decider, self.book, self.ledger.release, settings.gangs, clock)  # (#29)
        self.service_decisions = ServiceDecisions(
            self.lock, settings, self.ledger, self.decider, self.book, self.events, self.nominations, self.gangs
        )
        self.binder = Binder(self.lock, self.ledger, self.service_decisions, self.book, self.events)
        self.binder.on_bind_failed.append(self.gangs.bind_failed)
        self.budgets = DisruptionBudgets()  # PodDisruptionBudgets, for preemption's victims (#28)
        self.preemptions = Preemptions(self.lock, self.ledger, self.decider, self.budgets.breaks)  # (#28)
        self.preemptions.on_plans.append(self.nominations.remember)
        self.preemptions.held_for = self.nominations.held_for
        self.preemptions.is_group_member = lambda pod: self.gangs.read(pod, "") is not None
        self.ledger.on_pod_gone += [self.service_decisions.seen.forget, self.events.forget]
        self.dra_allocator = DraAllocator(self.lock, self.ledger, self.decider, self.events, self.apply)  # (#30)
        self._warm = False

    # ================================================================== readiness
    @property
    def ready(self) -> bool:
        """The source has synced and the kernels are compiled."""
        return self.ledger.synced and self._warm

    @property
    def synced(self) -> bool:
        """The source has delivered a complete list at least once."""
        return self.ledger.synced

    @property
    def warm(self) -> bool:
        """The kernels have run once (numba compiled them)."""
        return self._warm

    def mark_warm(self) -> None:
        """Every kernel has been compiled (extender.warm_up.warm_up does it, through the verbs)."""
        self._warm = True

    # ================================================================== the parts' work
    @property
    def writer(self) -> ClusterWriter | None:
        """Where binds and events on pods are written (the source); None: nothing can be bound."""
        return self.binder.writer

    @writer.setter
    def writer(self, writer: ClusterWriter | None) -> None:
        self.binder.writer = writer

    def apply(self, event: Event) -> None:
        """Apply one source event (the sources' `on_event` callback), around it the nominees' holds."""
        with self.lock:
            self._around_event(self.nominations.before, event)
            self._around_event(self.gangs.before, event)
            self.ledger.apply(event)
            self._around_event(self.budgets.apply, event)
            self._around_event(self.gangs.after, event)
            self._around_event(self.nominations.after, event)
            self._around_event(self.dra_allocator.observe, event)

    @staticmethod
    def _around_event(step: Callable[[Event], None], event: Event) -> None:
        """A step besides the ledger's (holds, budgets); one that fails is logged and the stream goes on: a
        failed hold step leaves fewer holds, never more; a failed budget step leaves the budget as it was."""
        try:
            step(event)
        except Exception:
            logger.exception("could not follow %s (%s)", type(event).__name__, getattr(step, "__qualname__", step))

    @overload
    def decide_for_filter(self, pod: Mapping[str, Any], candidates: Sequence[str] | NameArray) -> Verdicts: ...

    @overload
    def decide_for_filter(
        self, pod: Mapping[str, Any], candidates: Sequence[str] | NameArray, answer: AnswerBuilder[Answer]
    ) -> Answer: ...

    def decide_for_filter(
        self,
        pod: Mapping[str, Any],
        candidates: Sequence[str] | NameArray,
        answer: AnswerBuilder[Any] = verdicts,
    ) -> Any:
        """Choose one node among `candidates` and reserve its placement (`ServiceDecisions.decide_for_filter`);
        `answer` builds what is returned, by default (chosen node or None, FailedNodes,
        FailedAndUnresolvableNodes)."""
        return self.service_decisions.decide_for_filter(pod, candidates, answer)

    def feasible_for_filter(
        self, pod: Mapping[str, Any], candidates: Sequence[str] | NameArray
    ) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """decideInFilter: false — every feasible candidate passes, nothing is reserved."""
        return self.service_decisions.feasible_for_filter(pod, candidates)

    def scores_for_prioritize(self, pod: Mapping[str, Any], candidates: Sequence[str]) -> list[tuple[str, int]]:
        """Every candidate with a score 0..10 (`ServiceDecisions.scores_for_prioritize`)."""
        return self.service_decisions.scores_for_prioritize(pod, candidates)

    def evaluate(self, pod: Mapping[str, Any], candidates: Sequence[str] | None = None) -> Evaluation:
        """Where the pod would go among `candidates` (default: every node), reserving nothing."""
        return self.service_decisions.evaluate(pod, candidates)

    def plan_preemption(
        self, pod: Mapping[str, Any], candidates: Sequence[str], check: Check | None = None
    ) -> dict[str, VictimPlan]:
        """Per proposed node, the victims gpupack would evict for `pod` (`Preemptions.plan`)."""
        if check is None:
            return self.preemptions.plan(pod, candidates)
        return self.preemptions.plan(pod, candidates, check)

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        """Create the Binding that carries the assignment annotation (`Binder.bind`); BindError with a reason."""
        self.binder.bind(namespace, name, uid, node)

    # ================================================================== read-outs
    @property
    def decisions(self) -> Counter[tuple[Outcome, str]]:
        """Filter decisions by (outcome, reason)."""
        return self.service_decisions.counts

    @property
    def bind_failures(self) -> Counter[BindFailure]:
        """Refused binds by why."""
        return self.binder.failures

    def snapshot(self) -> Snapshot:
        """Current numbers for /metrics."""
        events_written, event_failures = self.events.counts()
        with self.lock:
            self.ledger.expire()
            pods, unplaced, unreadable = self.ledger.counts()
            return Snapshot(
                nodes=len(self.inventory.index),
                bad_nodes=len(self.ledger.bad),
                pods=pods,
                unplaced_pods=unplaced,
                unreadable_pods=unreadable,
                gpus_total=self.inventory.gpus_total(),
                gpus_allocated=self.usage.gpus_allocated(),
                free_mig_slices=self.usage.free_mig_slices(),
                reservations={state.value: n for state, n in self.book.counts().items()},
                reservations_ended={str(how): n for how, n in self.book.ended.items()},
                decisions={(str(outcome), reason): n for (outcome, reason), n in self.decisions.items()},
                bind_failures={str(why): n for why, n in self.bind_failures.items()},
                synced=self.ledger.synced,
                warm=self._warm,
                preempt_calls={str(k): n for k, n in self.preemptions.calls.items()},
                preempt_nodes={str(k): n for k, n in self.preemptions.nodes.items()},
                holds=len(self.nominations.held()),
                holds_ended={str(k): n for k, n in self.nominations.ended.items()},
                group_plans={str(k): n for k, n in self.gangs.outcomes.items()},
                group_holds=len(self.gangs.holds),
                group_holds_ended={str(k): n for k, n in self.gangs.ended.items()},
                dra_steps={str(k): n for k, n in self.dra_allocator.steps.items()},
                dra_waiting=self.dra_allocator.waiting(),
                events=events_written,
                event_failures=event_failures,
            )

    def placements(self) -> dict[str, Placement]:
        """Every held placement by pod identity: bound pods and live reservations."""
        with self.lock:
            held = self.ledger.placements()
            held.update({r.uid: r.placement for r in self.book.live()})
            return held

    def bound_pods(self) -> dict[str, BoundPod]:
        """Every bound pod the ledger accounts for, by identity (copies)."""
        with self.lock:
            return {pod.uid: pod for pod in self.ledger.bound_pods()}

    def bad_nodes(self) -> dict[str, str]:
        """Nodes kept out of the inventory, with why."""
        with self.lock:
            return dict(self.ledger.bad)

    def excluded_gpus(self) -> dict[str, tuple[Exclusion, ...]]:
        """Each node's GPUs out of service (unhealthy, cordoned, blocked whole), by node."""
        with self.lock:
            return {node: usage.excluded for node, usage in self.node_usage.usage.items() if usage.excluded}

    def cordon_entries_invalid(self) -> int:
        """Entries of `gpupack.io/cordoned-gpus` on all nodes that name no GPU by index (ignored)."""
        with self.lock:
            return sum(len(usage.cordon_invalid) for usage in self.node_usage.usage.values())

    def unplaced(self) -> list[str]:
        """Keys of bound pods that hold nothing yet."""
        with self.lock:
            return self.ledger.unplaced()

    def remembered_requests(self) -> RememberedRequests:
        """The requests kept for binds (bounded in count and bytes), as a copy."""
        with self.lock:
            return RememberedRequests(self.service_decisions.seen.entries(), self.service_decisions.seen.bytes)
