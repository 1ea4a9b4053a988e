"""Gang placement in the service (#29, docs/gangs.md): a group's members placed all at once, or none.

When every member of a group exists, the first member filtered plans all members not yet bound or
reserved (scoring.gang.plan_gang, over the filter's candidates); the planned placements are committed at
once as the group's **hold**, and each member's filter claims one, which becomes its reservation
(extender.reservations) as any filter decision. Nothing is held for a group that is not complete or does
not fit, so two groups never hold parts of the same capacity: the first planned gets all, the other waits.

A hold's unclaimed placements are given back `gangs.holdSeconds` after the plan, when a member's bind
fails (with the other members' reservations that are not binding yet), or when a pod the source shows
bound needs their capacity (pods bound always win: before the ledger applies an event that can commit
capacity on a node, the holds there are given back; after it they are taken again where still free).

All methods expect the state's lock to be held.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from typing import Any

import numpy as np

from gpupack.extender.gang_roster import Roster
from gpupack.extender.reservations import Ended, Reservation, ReservationBook, ReservationState
from gpupack.extender.settings import Gangs as GangSettings
from gpupack.kube.pod_groups import GroupId, Membership
from gpupack.kube.sources.events import Event, NodeDeleted, NodeUpserted, PodUpserted, Synced
from gpupack.scoring.decider import Decider
from gpupack.scoring.facts import Placement
from gpupack.scoring.gang import Domain, GangPlan, Level, describe_request, level_labels, node_labels_of, plan_gang
from gpupack.scoring.gang import topology_domains as domains_of
from gpupack.scoring.inventory import InventoryError
from gpupack.scoring.request import PodRequest

logger = logging.getLogger(__name__)


class PlanOutcome(StrEnum):
    """What a member's filter came to for its group: the `outcome` label of gpupack_group_plans."""

    PLANNED = "planned"  # the group was planned and held whole
    CLAIMED = "claimed"  # the member took a placement of its group's hold
    WAITING = "waiting"  # not every member exists yet
    NO_FIT = "no fit"  # the group does not fit whole
    MISMATCH = "request differs"  # the member asks for other resources than its group was planned for


class HoldEnded(StrEnum):
    """How a group's hold ended: the `how` label of gpupack_group_holds_ended."""

    CLAIMED = "claimed"  # every planned placement went to a member
    TAKEN = "taken by bound pods"  # the last unclaimed placements went to pods the source showed bound
    EXPIRED = "expired"  # gangs.holdSeconds passed with placements unclaimed
    BIND_FAILED = "member bind failed"


@dataclass
class GroupHold:
    """A planned group: its request and domain, the placements no member claimed yet (committed in the
    inventory in the group's name) and the ones handed to members."""

    group: GroupId
    request: PodRequest
    domain: Domain
    widest: Level
    unclaimed: list[Placement]
    deadline: float
    claimed: dict[str, Placement] = field(default_factory=dict)  # member identity -> placement
    parked: list[Placement] = field(default_factory=list)  # given back around an event, taken again after it
    lost: int = 0  # unclaimed placements a bound pod took


@dataclass
class MemberAnswer:
    """What a member's filter gets: a placement to reserve (and `take`, which commits it in the member's
    name) or the reason it gets none."""

    placement: Placement | None
    reason: str = ""
    outcome: PlanOutcome | None = None  # why there is no placement
    take: Callable[[], None] = lambda: None
    plan: GangPlan | None = None  # the group's new plan, when this answer made one


class Gangs:
    """The roster, the groups' holds, and each member's filter answer (see the module docstring)."""

    def __init__(
        self,
        decider: Decider,
        book: ReservationBook,
        release: Callable[[Reservation | None], None],
        settings: GangSettings,
        clock: Callable[[], float],
    ) -> None:
        """`release` gives a forgotten reservation's capacity back (the ledger's)."""
        self.decider = decider
        self.release = release
        self.inventory = decider.inventory
        self.book = book
        self.settings = settings
        self.clock = clock
        self.roster = Roster()
        self.holds: dict[GroupId, GroupHold] = {}
        self.outcomes: Counter[PlanOutcome] = Counter()
        self.ended: Counter[HoldEnded] = Counter()

    # ------------------------------------------------------------------ events (around the ledger's apply)
    def before(self, event: Event) -> None:
        """Give back the holds on the node whose capacity the ledger may commit for `event`."""
        if not self.holds:
            return
        if isinstance(event, PodUpserted) and (event.pod.get("spec") or {}).get("nodeName"):
            self._park(str(event.pod["spec"]["nodeName"]))
        elif isinstance(event, NodeUpserted | NodeDeleted):
            self._park(event.name)
        elif isinstance(event, Synced):
            self._park(None)

    def after(self, event: Event) -> None:
        """Follow the roster; take back what was parked where it is still free; end what expired."""
        self.roster.apply(event)
        for hold in self.holds.values():
            self._unpark(hold)
        self.refresh()

    def refresh(self) -> None:
        """End the holds past their time, and those every member has claimed."""
        now = self.clock()
        self.roster.drop_noted(now)
        for hold in list(self.holds.values()):
            if not hold.unclaimed:
                self._end(hold, HoldEnded.TAKEN if hold.lost else HoldEnded.CLAIMED)
            elif hold.deadline <= now:
                self._end(hold, HoldEnded.EXPIRED)

    def _park(self, node: str | None) -> None:
        for hold in self.holds.values():
            keep = []
            for placement in hold.unclaimed:
                if node is None or placement.node == node:
                    self.inventory.release(placement)
                    hold.parked.append(placement)
                else:
                    keep.append(placement)
            hold.unclaimed = keep

    def _unpark(self, hold: GroupHold) -> None:
        while hold.parked:
            placement = hold.parked.pop()
            try:
                self.inventory.commit(placement)
            except InventoryError:
                logger.info(
                    "group %s: a planned placement on %s was taken by a bound pod", hold.group.key, placement.node
                )
                hold.lost += 1
                continue
            hold.unclaimed.append(placement)

    # ------------------------------------------------------------------ a member's filter
    def read(self, pod: Mapping[str, Any], key: str) -> Membership | None:
        """The pod's membership (None: place it as a single pod)."""
        return self.roster.read(pod, key)

    def answer(self, member: Membership, ident: str, request: PodRequest, known: np.ndarray) -> MemberAnswer | None:
        """The member's placement or why it gets none; None: decide it as a single pod (an extra member once
        its group is placed). Changes nothing until the answer's `take` runs."""
        self.refresh()
        group = member.group
        self.roster.note(ident, group, self.clock())
        hold = self.holds.get(group)
        if hold is not None:
            return self._from_hold(hold, ident, request, known)
        size = self.roster.size(member)
        if size is None:
            return self._no(PlanOutcome.WAITING, f"group {group.key} has no {group.rule.value} PodGroup and no size")
        count = self.roster.count(group, besides=ident)
        if count.exist < size:
            return self._no(
                PlanOutcome.WAITING, f"group {group.key} waits for its members: {count.exist} of {size} exist"
            )
        wanted = size - count.bound - self._reserved(group, ident)
        if wanted <= 0:
            return None
        plan = self.plan(request, wanted, member.widest, known)
        if not plan.fits:
            why = no_fit_reason(group, wanted, request, widest_text(member.widest), plan.largest_fit)
            return self._no(PlanOutcome.NO_FIT, why)
        first = plan.placements[0]
        return MemberAnswer(first, take=partial(self._hold, member, request, plan, ident), plan=plan)

    def plan(self, request: PodRequest, count: int, widest: Level, known: np.ndarray) -> GangPlan:
        """Where `count` members of `request` would go among the rows set in `known`; nothing changes."""
        labels = node_labels_of(self.inventory, known)
        domains = domains_of(labels, level_labels(self.settings.rack_label), widest)
        return plan_gang(self.decider, request, count, domains)

    def _reserved(self, group: GroupId, besides: str) -> int:
        members = self.roster.members(group)
        return sum(1 for ident in members if ident != besides and self.book.get(ident) is not None)

    def _hold(self, member: Membership, request: PodRequest, plan: GangPlan, ident: str) -> None:
        for placement in plan.placements:
            self.inventory.commit(placement)
        assert plan.domain is not None
        deadline = self.clock() + self.settings.hold_seconds
        hold = GroupHold(member.group, request, plan.domain, member.widest, list(plan.placements[1:]), deadline)
        hold.claimed[ident] = plan.placements[0]
        self.holds[member.group] = hold
        self.outcomes[PlanOutcome.PLANNED] += 1
        logger.info(
            "group %s planned whole in %s: %d members", member.group.key, plan.domain.describe(), len(plan.placements)
        )

    def _from_hold(self, hold: GroupHold, ident: str, request: PodRequest, known: np.ndarray) -> MemberAnswer:
        if request != hold.request:
            why = (
                f"group {hold.group.key} was planned for members of {describe_request(hold.request)}; "
                f"this member asks for {describe_request(request)}"
            )
            return self._no(PlanOutcome.MISMATCH, why)
        for placement in hold.unclaimed:
            row = self.inventory.index.get(placement.node)
            if row is not None and known[row]:
                return MemberAnswer(placement, take=partial(self._claim, hold, ident, placement))
        inside = np.zeros_like(known)
        inside[[row for node in hold.domain.nodes if (row := self.inventory.index.get(node)) is not None]] = True
        own = self.decider.look(request, known & inside).placement
        if own is None:
            return self._no(PlanOutcome.NO_FIT, no_fit_reason(hold.group, 1, request, hold.domain.describe(), 0))
        return MemberAnswer(own, take=partial(self._claim_new, hold, ident, own))

    def _claim(self, hold: GroupHold, ident: str, placement: Placement) -> None:
        hold.unclaimed.remove(placement)  # committed already: the member's reservation now owns it
        self._claimed(hold, ident, placement)

    def _claim_new(self, hold: GroupHold, ident: str, placement: Placement) -> None:
        self.inventory.commit(placement)
        self._claimed(hold, ident, placement)

    def _claimed(self, hold: GroupHold, ident: str, placement: Placement) -> None:
        hold.claimed[ident] = placement
        self.outcomes[PlanOutcome.CLAIMED] += 1
        if not hold.unclaimed:
            self._end(hold, HoldEnded.CLAIMED)

    def _no(self, outcome: PlanOutcome, reason: str) -> MemberAnswer:
        self.outcomes[outcome] += 1
        return MemberAnswer(None, reason, outcome)

    # ------------------------------------------------------------------ ends
    def bind_failed(self, ident: str) -> None:
        """A member's bind failed: its group's unclaimed placements are given back, and so are the reservations
        of its other members that are not binding yet (nothing is held for a job that cannot start)."""
        group = self.roster.group_of(ident)
        if group is None:
            return
        for other in self.roster.members(group):
            reservation = self.book.get(other)
            if other != ident and reservation is not None and reservation.state == ReservationState.ASSUMED:
                self.release(self.book.forget(other, Ended.GROUP_RELEASED))
        hold = self.holds.get(group)
        if hold is not None:
            self._end(hold, HoldEnded.BIND_FAILED)

    def _end(self, hold: GroupHold, how: HoldEnded) -> None:
        for placement in hold.unclaimed:
            self.inventory.release(placement)
        hold.unclaimed = []
        self.holds.pop(hold.group, None)
        self.ended[how] += 1
        if how != HoldEnded.CLAIMED:
            logger.info("group %s: hold ended (%s)", hold.group.key, how)


def no_fit_reason(group: GroupId, count: int, request: PodRequest, where: str, largest_fit: int) -> str:
    """'group ns/train-7 needs 8 × 8 GPUs in one NVLink domain; largest fit: 6' (`count`: the members not
    yet bound or reserved)."""
    return f"group {group.key} needs {count} × {describe_request(request)} in {where}; largest fit: {largest_fit}"


def widest_text(widest: Level) -> str:
    """Where a group may be spread, as reasons say it: 'one NVLink domain', 'the cluster'."""
    return "the cluster" if widest == Level.CLUSTER else f"one {widest.text}"
