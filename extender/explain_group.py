"""`gpupack explain` on a group member (#29): the group, its members, and its plan or why it has none.

Read from explain's own `ClusterState`, so nothing planned here is held anywhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpupack.extender.gangs import GroupHold
from gpupack.extender.pod_records import identity
from gpupack.extender.state import ClusterState
from gpupack.kube.pods import pod_key, pod_uid
from gpupack.scoring.facts import Placement
from gpupack.scoring.gang import Domain
from gpupack.scoring.request import PodRequest


def group_section(state: ClusterState, pod: dict[str, Any], request: PodRequest | None) -> dict[str, Any] | None:
    """The `group` section of the explanation (None: the pod is no group member)."""
    key = pod_key(pod)
    ident = identity(pod_uid(pod), key)
    gangs = state.gangs
    with state.lock:
        member = gangs.read(pod, key)
        if member is None:
            return None
        count = gangs.roster.count(member.group, besides=ident)
        section: dict[str, Any] = {
            "group": member.group.key,
            "rule": member.group.rule.value,
            "size": gangs.roster.size(member),
            "exist": count.exist,
            "bound": count.bound,
            "widest": member.widest.text,
            "plan": None,
            "reason": None,
        }
        hold = gangs.holds.get(member.group)
        if hold is not None:
            section["plan"] = held_plan(state, hold)
        elif request is None:
            section["reason"] = "the pod's request cannot be read"
        else:
            answer = gangs.answer(member, ident, request, state.inventory.node_active.copy())
            if answer is None:
                section["reason"] = "the group is placed; this member is placed as a single pod"
            elif answer.plan is not None and answer.plan.domain is not None:
                section["plan"] = plan_entry(answer.plan.domain, ((None, p) for p in answer.plan.placements))
            else:
                section["reason"] = answer.reason
    return section


def held_plan(state: ClusterState, hold: GroupHold) -> dict[str, Any]:
    """A held plan: the claimed placements with their members' keys, then the unclaimed ones."""
    keys = {ident: reservation.key for ident in hold.claimed if (reservation := state.book.get(ident)) is not None}
    claimed = [(keys.get(ident, ident), placement) for ident, placement in hold.claimed.items()]
    return plan_entry(hold.domain, [*claimed, *((None, p) for p in hold.unclaimed)])


def plan_entry(domain: Domain, placements: Iterable[tuple[str | None, Placement]]) -> dict[str, Any]:
    """The plan's domain and each member's node and GPUs, with the member that claimed it (None: unclaimed)."""
    return {
        "domain": domain.describe(),
        "members": [{"pod": who, **placement.to_assignment()} for who, placement in placements],
    }


def group_text(section: dict[str, Any] | None) -> list[str]:
    """The lines of the group section ([] for a pod of no group)."""
    if section is None:
        return []
    size = section["size"] if section["size"] is not None else "?"
    where = "the cluster" if section["widest"] == "cluster" else f"one {section['widest']}"
    lines = [
        f"group {section['group']} ({section['rule']}): {section['exist']} of {size} members exist, "
        f"{section['bound']} bound; it may spread over {where}"
    ]
    plan = section["plan"]
    if plan is None:
        lines.append(f"  no plan: {section['reason']}")
        return lines
    lines.append(f"  plan in {plan['domain']}:")
    for entry in plan["members"]:
        gpus = ", ".join(str(gpu["index"]) for gpu in entry["gpus"]) or "-"
        lines.append(f"    {entry['node']}: gpus {gpus}  ({entry['pod'] or 'unclaimed'})")
    return lines
