"""Holds for nominated preemptors (#28 item 2): the victims' capacity goes to the pod they were evicted for.

After `/preempt`, kube-scheduler evicts the victims on the node it picked and writes that node into the
preemptor's `status.nominatedNodeName`; the pod is filtered again once the victims are gone. Without a
hold, any other pod's filter in between could take what the victims freed, and the evictions would
have been for nothing. So:

- every preempt call keeps the preemptor's plans (uid -> node -> VictimPlan) for `PLAN_TTL_SECONDS`;
- once the source shows the pending preemptor nominated to a node it has a plan for, the pieces of
  the planned placement (each GPU slot, and its CPU, memory and pod slot) are **held** as they come
  free: committed in the inventory in its name, so no other filter, prioritize or plan sees them free;
- the nominee's filter, once every piece is held and the node is a candidate, is given the planned
  placement: the pieces become its reservation (extender.reservations), as a filter decision does
  (with `decideInFilter: false`, which reserves nothing, the hold is given back just before the
  nominee's filter decides, so that it competes for the freed capacity at once);
- the hold ends when the pod binds, is deleted, is nominated elsewhere (or no longer), is placed
  elsewhere by filter, or the TTL passes; its pieces are given back.

Nothing is held that is not free: a piece is held only when the inventory accepts it, so victims that
never go leave nothing held twice. While a piece is not free yet, the free rest of its GPUs is held as a
*fence* (a MIG GPU's free slices, a shared GPU's free share): gpupack may see a victim's replacement
before the victim's deletion, and the replacement must not start in the space the nominee is waiting for.
Fences are given back before each new try to hold, and when the hold ends.

Pods the source shows bound always win over holds: before the
ledger applies an event that can commit capacity on a node, that node's pieces are given back, and
after it they are held again where still free.

A pending pod annotated `gpupack.io/defrag-hold` (an [assignment](docs/contracts.md#assignment) written by
`gpupack defrag --execute` before it evicts the pods it moves for that pod, #31) is held the same way: the
annotation is its one plan and its nomination, taken up once per value (an expired hold does not come back).

All methods expect the state's lock to be held (extender.state applies events and filters under it).
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from gpupack.extender.pod_records import identity
from gpupack.kube.keys import ANNOTATION_DEFRAG_HOLD
from gpupack.kube.pod_request import AssignmentError, assignment_from_pod, request_from_pod
from gpupack.kube.sources.events import Event, NodeDeleted, NodeUpserted, PodDeleted, PodUpserted, Synced
from gpupack.scoring.facts import Placement
from gpupack.scoring.inventory import Inventory, InventoryError
from gpupack.scoring.preemption import VictimPlan
from gpupack.scoring.request import PodRequest, RequestError

logger = logging.getLogger(__name__)

PLAN_TTL_SECONDS = 300.0  # victims get 30 s of grace by default; kube-scheduler retries within 10 s after
PLANS_LIMIT = 10_000  # preemptors whose plans are kept (the oldest dropped first)


class HoldEnded(StrEnum):
    """How a nominee's hold ended: the `how` label of gpupack_nomination_holds_ended."""

    HANDED = "handed to the nominee"  # its filter got the planned placement (now a reservation)
    BOUND = "bound"  # the source showed it bound
    DELETED = "pod deleted"
    ELSEWHERE = "nominated elsewhere"  # another node, or no node any more
    PLACED_ELSEWHERE = "placed elsewhere"  # its filter chose another node
    EXPIRED = "expired"  # the plans' TTL passed


@dataclass
class Nominee:
    """One preemptor's plans, the node it is nominated to, and the pieces held for it there."""

    uid: str
    key: str
    request: PodRequest
    plans: dict[str, VictimPlan]
    deadline: float
    node: str = ""  # nominated node with a plan ("" none)
    held: list[Placement] = field(default_factory=list)  # pieces committed in its name
    # the free rest of each GPU whose planned piece is not free yet: no other pod starts there meanwhile
    fences: list[Placement] = field(default_factory=list)

    @property
    def placement(self) -> Placement | None:
        """The planned placement on the nominated node."""
        plan = self.plans.get(self.node)
        return plan.placement if plan is not None else None


def pieces(placement: Placement) -> list[Placement]:
    """The placement cut into what comes free separately: each GPU slot, then CPU, memory and pod slot."""
    node = placement.node
    cut = [Placement(node, (slot,), 0, 0, 0) for slot in placement.slots]
    return [*cut, Placement(node, (), placement.cpu_milli, placement.memory_bytes, placement.pod_slots)]


class Nominations:
    """The plans of preemptors and the holds of the nominated ones (see the module docstring)."""

    def __init__(self, inventory: Inventory, clock: Callable[[], float]) -> None:
        self.inventory = inventory
        self.clock = clock
        self._nominees: OrderedDict[str, Nominee] = OrderedDict()  # by deadline: each call moves one to the end
        self._nominated: dict[str, Nominee] = {}  # those nominated to a node they have a plan for
        self._holds_taken: dict[str, str] = {}  # pending pod -> the defrag hold annotation last read
        self.bad_holds = 0  # defrag hold annotations that could not be read (logged once each)
        self.ended: Counter[HoldEnded] = Counter()

    # ------------------------------------------------------------------ read-outs
    def held(self) -> dict[str, list[Placement]]:
        """The pieces and fences held, by nominee identity (copies of the lists)."""
        return {uid: [*n.held, *n.fences] for uid, n in self._nominated.items() if n.held or n.fences}

    def held_for(self, uid: str) -> list[Placement]:
        """The pieces held for one nominee (a copy)."""
        nominee = self._nominees.get(uid)
        return list(nominee.held) if nominee is not None else []

    def nominee(self, uid: str) -> Nominee | None:
        """The plans kept for a preemptor."""
        return self._nominees.get(uid)

    # ------------------------------------------------------------------ plans (preempt verb)
    def remember(self, uid: str, key: str, request: PodRequest, plans: Mapping[str, VictimPlan]) -> None:
        """Keep the plans of one preempt call (replacing older ones); a hold on a node still planned stays."""
        nominee = self._nominees.pop(uid, None)
        if nominee is None and not plans:
            return  # nothing planned, nothing to hold
        deadline = self.clock() + PLAN_TTL_SECONDS
        if nominee is None:
            nominee = Nominee(uid, key, request, dict(plans), deadline)
        else:
            if nominee.node and (nominee.node not in plans or plans[nominee.node].placement != nominee.placement):
                self._nominate(nominee, "")
                self.ended[HoldEnded.ELSEWHERE] += 1
            nominee.request, nominee.plans, nominee.deadline = request, dict(plans), deadline
        self._nominees[uid] = nominee
        while len(self._nominees) > PLANS_LIMIT:
            self._end(next(iter(self._nominees.values())), HoldEnded.EXPIRED)

    # ------------------------------------------------------------------ events (around the ledger's apply)
    def before(self, event: Event) -> None:
        """Give back what the ledger may need for `event`; end holds of pods bound or deleted."""
        if not self._nominees:
            return
        if isinstance(event, PodUpserted):
            node = (event.pod.get("spec") or {}).get("nodeName")
            if not node:
                return  # a pending pod changes no capacity
            nominee = self._nominees.get(identity(event.uid, event.key))
            if nominee is not None:
                self._end(nominee, HoldEnded.BOUND)
            self._release_on(str(node))
        elif isinstance(event, PodDeleted):
            nominee = self._nominees.get(identity(event.uid, event.key))
            if nominee is not None:
                self._end(nominee, HoldEnded.DELETED)
        elif isinstance(event, NodeUpserted | NodeDeleted):
            self._release_on(event.name)
        elif isinstance(event, Synced):
            for nominee in self._nominated.values():
                self._release(nominee)

    def after(self, event: Event) -> None:
        """Follow the nominations (and defrag holds) the source shows, end what expired, hold what came free."""
        if isinstance(event, PodUpserted) and not (event.pod.get("spec") or {}).get("nodeName"):
            uid = identity(event.uid, event.key)
            hold = self._defrag_hold(uid, event.key, event.pod)
            nominee = self._nominees.get(uid)
            if nominee is not None:
                self._follow(nominee, hold.node if hold is not None else _nominated_node(event.pod))
        elif isinstance(event, PodDeleted):
            self._holds_taken.pop(identity(event.uid, event.key), None)
        if self._nominees:
            self.refresh()

    def _defrag_hold(self, uid: str, key: str, pod: Mapping[str, Any]) -> Placement | None:
        """The placement of the pending pod's `gpupack.io/defrag-hold` (docs/defrag.md), remembered as its plan
        the first time this value is seen (so a hold that expired is not taken up again); None without one."""
        text = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_DEFRAG_HOLD)
        if not isinstance(text, str):
            return None
        first = self._holds_taken.get(uid) != text
        self._holds_taken[uid] = text
        try:
            hold = assignment_from_pod(pod, annotation=ANNOTATION_DEFRAG_HOLD)
        except (AssignmentError, RequestError) as exc:
            if first:
                self.bad_holds += 1
                logger.warning("%s: ignored: %s", key, exc)
            return None
        if hold is not None and first:
            self.remember(uid, key, request_from_pod(pod), {hold.node: VictimPlan(hold.node, (), hold)})
        return hold

    def _follow(self, nominee: Nominee, node: str) -> None:
        """The source shows the nominee nominated to `node` ("": none)."""
        target = node if node in nominee.plans else ""
        if target == nominee.node:
            return
        if nominee.node:
            self.ended[HoldEnded.ELSEWHERE] += 1
            logger.info("hold for %s on %s ended: nominated to %r", nominee.key, nominee.node, node)
        self._nominate(nominee, target)

    def _nominate(self, nominee: Nominee, node: str) -> None:
        """Move the nominee's hold to `node` ("": none), giving back what it held."""
        self._release(nominee)
        nominee.node = node
        if node:
            self._nominated[nominee.uid] = nominee
        else:
            self._nominated.pop(nominee.uid, None)

    def refresh(self) -> None:
        """End the nominees past their TTL; hold every planned piece that is free now."""
        if not self._nominees:
            return
        now = self.clock()
        while self._nominees and next(iter(self._nominees.values())).deadline <= now:
            self._end(next(iter(self._nominees.values())), HoldEnded.EXPIRED)
        for nominee in self._nominated.values():
            self._hold(nominee)

    # ------------------------------------------------------------------ the nominee's filter
    def ready(self, uid: str, candidates: np.ndarray) -> Placement | None:
        """The planned placement when every piece of it is held for `uid` and its node is among
        `candidates` (a mask over inventory rows); nothing changes."""
        nominee = self._nominees.get(uid)
        placement = nominee.placement if nominee is not None else None
        if nominee is None or placement is None or len(nominee.held) != len(pieces(placement)):
            return None
        row = self.inventory.index.get(nominee.node)
        return placement if row is not None and candidates[row] else None

    def hand_over(self, uid: str) -> Placement | None:
        """The pieces held for `uid` become its whole planned placement, committed (the caller records it as
        a reservation); None, with the pieces held again, if the inventory does not take it."""
        nominee = self._nominees[uid]
        placement = nominee.placement
        assert placement is not None
        self._release(nominee)
        try:
            self.inventory.commit(placement)
        except InventoryError as exc:
            logger.warning("hold for %s on %s could not be handed over: %s", nominee.key, nominee.node, exc)
            self._hold(nominee)
            return None
        self._end(nominee, HoldEnded.HANDED)
        return placement

    def let_go(self, uid: str) -> None:
        """decideInFilter: false: a nominee held whole gets its hold given back (its filter reserves nothing,
        so the placement cannot be handed over; freed now, it is there for the nominee's own decision)."""
        nominee = self._nominated.get(uid)
        placement = nominee.placement if nominee is not None else None
        if nominee is not None and placement is not None and len(nominee.held) == len(pieces(placement)):
            self._end(nominee, HoldEnded.HANDED)

    def placed_elsewhere(self, uid: str) -> None:
        """Filter reserved another placement for `uid`: its hold is not needed."""
        nominee = self._nominees.get(uid)
        if nominee is not None and nominee.node:
            self._end(nominee, HoldEnded.PLACED_ELSEWHERE)

    # ------------------------------------------------------------------ capacity
    def _hold(self, nominee: Nominee) -> None:
        """Hold every planned piece that is free now; fence the GPUs of those that are not yet."""
        placement = nominee.placement
        if placement is None or placement.node not in self.inventory.index:
            return
        wanted = pieces(placement)
        if len(nominee.held) == len(wanted):
            return
        self._give_back(nominee.fences, nominee.key)
        have = list(nominee.held)
        waiting: list[Placement] = []
        for piece in wanted:
            if piece in have:
                have.remove(piece)
                continue
            try:
                self.inventory.commit(piece)
            except InventoryError:
                waiting.append(piece)  # not free (yet): a victim still holds it
                continue
            nominee.held.append(piece)
        for piece in waiting:
            self._fence(nominee, piece)

    def _fence(self, nominee: Nominee, piece: Placement) -> None:
        """Hold what is free on the GPUs of a piece that is not: a MIG instance or a share must not be given
        the free part of a GPU whose victim is still leaving (gpupack may see a victim's replacement
        before the victim's deletion)."""
        gpus = {slot.index for slot in piece.slots}
        rest = tuple(slot for slot in self.inventory.free_slots(piece.node) if slot.index in gpus)
        if not rest:
            return
        fence = Placement(piece.node, rest, 0, 0, 0)
        try:
            self.inventory.commit(fence)
        except InventoryError:
            return
        nominee.fences.append(fence)

    def _release(self, nominee: Nominee) -> None:
        self._give_back(nominee.fences, nominee.key)
        self._give_back(nominee.held, nominee.key)

    def _give_back(self, placements: list[Placement], key: str) -> None:
        while placements:
            piece = placements.pop()
            try:
                self.inventory.release(piece)
            except InventoryError:
                logger.exception("inventory out of step while giving back a hold of %s", key)

    def _release_on(self, node: str) -> None:
        for nominee in self._nominated.values():
            if (nominee.held or nominee.fences) and nominee.node == node:
                self._release(nominee)

    def _end(self, nominee: Nominee, how: HoldEnded) -> None:
        self._release(nominee)
        self._nominees.pop(nominee.uid, None)
        self._nominated.pop(nominee.uid, None)
        if nominee.node:
            self.ended[how] += 1
            logger.info("hold for %s on %s ended: %s", nominee.key, nominee.node, how)


def _nominated_node(pod: Mapping[str, Any]) -> str:
    node = (pod.get("status") or {}).get("nominatedNodeName")
    return node if isinstance(node, str) else ""
