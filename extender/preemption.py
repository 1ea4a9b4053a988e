"""The preempt verb's decisions (#28): on each node kube-scheduler proposes, the victims gpupack would evict.

kube-scheduler's DefaultPreemption counts resources to pick victims; for a MIG instance, an NVLinked
set or a share that counting is wrong (evicting scattered slices frees no legal placement). So for
each proposed node gpupack plans on its own picture (scoring.preemption.plan_victims, gpupack's own
placement rules): the cheapest set among **all** pods of that node with a lower priority than the
preemptor — not only the ones kube-scheduler named — whose eviction lets the preemptor be placed.
A node where no set works, where the preemptor fits without evicting anyone, or that gpupack does not
know (unknown, unusable, cordoned or not Ready) is left out of the answer; kube-scheduler then
preempts nothing there.

Pods already terminating are nobody's victims (they are leaving anyway): their capacity is counted as
free while planning, as is what is held for the preemptor itself (extender.nominations). Planning
commits nothing: it runs under the state's lock and every tentative release is undone before the
lock is let go. Each call's plans go to extender.nominations, which holds the freed capacity for the
preemptor once kube-scheduler nominates it.

A preemptor whose request cannot be read, or a call before the source has synced, gets an empty
answer (no node: nothing is evicted); the reason is logged once and counted.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from enum import StrEnum
from typing import Any

from gpupack.extender.occupants import Budgets, leaving_on, no_budgets, occupants_on
from gpupack.extender.pod_ledger import PodLedger
from gpupack.extender.pod_records import identity
from gpupack.kube.pod_request import request_from_pod
from gpupack.kube.pods import pod_key, pod_priority, pod_uid
from gpupack.scoring.decider import Decider
from gpupack.scoring.facts import Placement
from gpupack.scoring.inventory import Inventory
from gpupack.scoring.preemption import VictimPlan, plan_victims
from gpupack.scoring.request import PodRequest, RequestError

logger = logging.getLogger(__name__)

LOGGED_REASONS_LIMIT = 1000  # distinct unreadable-request reasons logged (each once)


class PreemptCall(StrEnum):
    """What a preempt call came to: the `outcome` label of gpupack_preempt_calls."""

    ANSWERED = "answered"  # planned on the proposed nodes (some may have been left out)
    BAD_REQUEST = "bad-request"  # the preemptor's request cannot be read: no node
    NOT_SYNCED = "not-synced"  # before the first list: no node
    GROUP_MEMBER = "group-member"  # the preemptor is a group member (#29): no node


class PreemptNode(StrEnum):
    """What became of one proposed node: the `outcome` label of gpupack_preempt_nodes."""

    PLANNED = "planned"  # victims chosen
    NO_PLAN = "no-plan"  # evicting every lower-priority pod would not make room: left out
    NO_VICTIMS = "no-victims-needed"  # it fits without evicting anyone (now, or once terminating pods go): left out
    UNKNOWN = "unknown-node"  # unknown, unusable, cordoned or not Ready: left out


Check = Callable[[str], None]  # raises when the answer is no longer wanted (verbs.Deadline.check)


def _no_check(_: str) -> None:
    return None


class Preemptions:
    """Plans of the preempt verb over the ledger's picture, with counts; shares the state's lock."""

    def __init__(
        self, lock: threading.RLock, ledger: PodLedger, decider: Decider, budgets: Budgets = no_budgets
    ) -> None:
        self.lock = lock
        self.budgets = budgets  # evicting this pod now would break a PodDisruptionBudget
        self.ledger = ledger
        self.inventory = ledger.inventory
        self.decider = decider
        self.calls: Counter[PreemptCall] = Counter()
        self.nodes: Counter[PreemptNode] = Counter()
        # told every call's plans: (uid, key, request, plans by node)
        self.on_plans: list[Callable[[str, str, PodRequest, dict[str, VictimPlan]], None]] = []
        self._logged: set[str] = set()
        # what is held for a nominated preemptor (extender.nominations): free for its own next plan
        self.held_for: Callable[[str], Sequence[Placement]] = lambda uid: ()
        # a group member (extender.gangs) is no preemptor: victims evicted for one member do not place the group
        self.is_group_member: Callable[[Mapping[str, Any]], bool] = lambda pod: False

    def plan(
        self, pod: Mapping[str, Any], candidates: Sequence[str], check: Check = _no_check
    ) -> dict[str, VictimPlan]:
        """The plan on each of `candidates` where gpupack would preempt for `pod` (nodes left out have none)."""
        with self.lock:
            if not self.ledger.synced:
                self.calls[PreemptCall.NOT_SYNCED] += 1
                return {}
            key = pod_key(pod)
            if self.is_group_member(pod):
                self.calls[PreemptCall.GROUP_MEMBER] += 1
                return {}
            try:
                request = request_from_pod(pod)
            except RequestError as exc:
                self._bad_request(key, str(exc))
                return {}
            self.ledger.expire()
            uid = identity(pod_uid(pod), key)
            priority = pod_priority(pod)
            plans: dict[str, VictimPlan] = {}
            for node in dict.fromkeys(candidates):
                check("planning")
                if node not in self.inventory.index or node in self.ledger.cordoned:
                    self.nodes[PreemptNode.UNKNOWN] += 1
                    continue
                occupants = occupants_on(self.ledger, node, besides=uid, budgets=self.budgets)
                own = [piece for piece in self.held_for(uid) if piece.node == node]
                with released(self.inventory, [*leaving_on(self.ledger, node), *own]):
                    plan = plan_victims(self.decider, request, node, priority, occupants)
                if plan is None:
                    self.nodes[PreemptNode.NO_PLAN] += 1
                elif not plan.victims:
                    self.nodes[PreemptNode.NO_VICTIMS] += 1
                else:
                    self.nodes[PreemptNode.PLANNED] += 1
                    plans[node] = plan
            self.calls[PreemptCall.ANSWERED] += 1
            for remember in self.on_plans:
                remember(uid, key, request, plans)
            return plans

    def _bad_request(self, key: str, reason: str) -> None:
        self.calls[PreemptCall.BAD_REQUEST] += 1
        if reason not in self._logged and len(self._logged) < LOGGED_REASONS_LIMIT:
            self._logged.add(reason)
            logger.warning("preempt for %s: its request cannot be read (%s); no node is preempted", key, reason)


@contextmanager
def released(inventory: Inventory, placements: Sequence[Placement]) -> Iterator[None]:
    """`placements` given back to `inventory` for the block, and taken again after it (also on an error)."""
    done: list[Placement] = []
    try:
        for placement in placements:
            inventory.release(placement)
            done.append(placement)
        yield
    finally:
        for placement in reversed(done):
            inventory.commit(placement)
