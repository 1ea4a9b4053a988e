"""Who belongs to which group, from the source's pods and PodGroup objects (#29, docs/gangs.md).

The roster follows every pod event: a pod whose labels or annotations make it a member (kube.pod_groups)
is listed under its group, as pending or bound, until it is deleted or turns terminal. PodGroup objects
of both APIs give the groups' sizes (`spec.minMember`). Nothing here holds capacity.

A member a filter call shows is **noted** at once, before the watch shows it: kube-scheduler does not
retry a pod the extender turned down when another pending pod is created, so the member filtered last
must see every member filtered before it, however far behind the watch is. A noted member the watch does
not confirm within `NOTED_SECONDS` (deleted before the watch saw it) is dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupack.extender.pod_records import identity
from gpupack.kube.pod_groups import GroupId, Membership, MembershipError, Rule, membership, min_member
from gpupack.kube.sources.events import Event, GroupDeleted, GroupUpserted, PodDeleted, PodUpserted, Synced

logger = logging.getLogger(__name__)

LOGGED_LIMIT = 1000  # distinct unreadable group annotations logged (each once)
NOTED_SECONDS = 60.0  # a member shown by a filter call counts this long without the watch confirming it
NOTED_LIMIT = 100_000  # members noted and not yet confirmed (the oldest dropped first)


@dataclass(frozen=True)
class Count:
    """How many members of a group exist (pending or bound) and how many are bound."""

    exist: int
    bound: int


class Roster:
    """The members of every group by identity, with whether each is bound, and the PodGroups' sizes."""

    def __init__(self) -> None:
        self._members: dict[GroupId, dict[str, bool]] = {}  # group -> member identity -> bound
        self._group_of: dict[str, GroupId] = {}
        self._sizes: dict[tuple[str, str], int] = {}  # (API group, namespace/name) -> minMember
        self._noted: dict[str, float] = {}  # member identity -> when a filter showed it, until the watch does
        self._logged: set[str] = set()

    # ------------------------------------------------------------------ events
    def apply(self, event: Event) -> None:
        """Follow one source event (pods and PodGroups; others are ignored)."""
        if isinstance(event, PodUpserted):
            self._pod(event.uid, event.key, event.pod)
        elif isinstance(event, PodDeleted):
            self._leave(identity(event.uid, event.key))
        elif isinstance(event, GroupUpserted):
            self._sizes[event.api, event.key] = min_member(event.group)
        elif isinstance(event, GroupDeleted):
            self._sizes.pop((event.api, event.key), None)
        elif isinstance(event, Synced):
            pass  # a relist arrives as Deleted and Upserted events: nothing to diff here

    def _pod(self, uid: str, key: str, pod: Mapping[str, Any]) -> None:
        ident = identity(uid, key)
        member = self.read(pod, key)
        if member is None:
            self._leave(ident)
            return
        if self._group_of.get(ident) not in (None, member.group):
            self._leave(ident)
        self._noted.pop(ident, None)
        self._group_of[ident] = member.group
        self._members.setdefault(member.group, {})[ident] = bool((pod.get("spec") or {}).get("nodeName"))

    def note(self, ident: str, group: GroupId, now: float) -> None:
        """A filter call shows the pending member `ident` (see the module docstring); a known member stays as it is."""
        if ident in self._group_of:
            return
        while len(self._noted) >= NOTED_LIMIT:
            self._leave(next(iter(self._noted)))
        self._group_of[ident] = group
        self._members.setdefault(group, {})[ident] = False
        self._noted[ident] = now

    def drop_noted(self, now: float) -> None:
        """Drop the members noted more than NOTED_SECONDS before `now` that the watch never showed."""
        while self._noted:
            ident, when = next(iter(self._noted.items()))
            if when > now - NOTED_SECONDS:
                break
            self._leave(ident)

    def _leave(self, ident: str) -> None:
        self._noted.pop(ident, None)
        group = self._group_of.pop(ident, None)
        if group is None:
            return
        members = self._members[group]
        members.pop(ident, None)
        if not members:
            del self._members[group]

    def read(self, pod: Mapping[str, Any], key: str) -> Membership | None:
        """The pod's membership; None when it is no member or its group annotations cannot be read (logged once)."""
        try:
            return membership(pod)
        except MembershipError as exc:
            if str(exc) not in self._logged and len(self._logged) < LOGGED_LIMIT:
                self._logged.add(str(exc))
                logger.warning("pod %s: %s; placed as a single pod", key, exc)
            return None

    # ------------------------------------------------------------------ read-outs
    def size(self, member: Membership) -> int | None:
        """The group's size: its PodGroup's minMember, else the pod's own `gpupack.io/group-size` (None: unknown)."""
        if member.group.rule == Rule.GPUPACK:
            return member.size
        return self._sizes.get((member.group.rule.value, member.group.key), member.size)

    def count(self, group: GroupId, besides: str = "") -> Count:
        """Members of `group` that exist and that are bound; `besides` (the pod asking) counts as existing."""
        members = self._members.get(group, {})
        exist = len(members) + (1 if besides and besides not in members else 0)
        return Count(exist, sum(members.values()))

    def members(self, group: GroupId) -> dict[str, bool]:
        """The group's members by identity, with whether each is bound (a copy)."""
        return dict(self._members.get(group, {}))

    def group_of(self, ident: str) -> GroupId | None:
        """The group of a known member."""
        return self._group_of.get(ident)
