"""Where a gated pod's ResourceClaims go: node and exact devices, chosen by gpupack's engine (#30 item 2).

The claims' requests become one PodRequest (whole GPUs, or MIG instances by profile) with the pod's CPU and
memory, decided among the DRA nodes the pod may use, exactly as a device-plugin pod is: the MIG placement
that keeps the largest profiles placeable, the NVLinked GPU set, the cheaper node by the policy's cost
weight. `firstAvailable` alternatives are each decided and the best score wins (list order breaks ties),
so the choice is by what the placement leaves behind, not by list position. Each slot of the placement is
then the one device the node's slices publish for it (`DraGpus.slots`). Runs under the state's lock.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from gpupack.extender.pod_ledger import PodLedger
from gpupack.kube.dra.allocation import ChosenDevice
from gpupack.kube.dra.requests import DeviceAsk, RequestAsk
from gpupack.kube.node_rules import why_not
from gpupack.kube.pod_request import request_from_pod
from gpupack.scoring.decider import Decider
from gpupack.scoring.facts import Placement
from gpupack.scoring.request import Kind, PodRequest, RequestError

MAX_COMBINATIONS = 16  # firstAvailable alternatives tried per pod (their product over the pod's requests)


@dataclass(frozen=True)
class ClaimPlan:
    """The devices chosen for each claim (by `namespace/name`) and the placement holding them meanwhile."""

    node: str
    devices: Mapping[str, tuple[ChosenDevice, ...]]
    hold: Placement  # the devices only: no pod slot, no CPU (the pod is charged when it binds)


@dataclass(frozen=True)
class NoPlan:
    """Why nothing was planned; `fits_nowhere`: the request is fine, the cluster has no room for it now."""

    reason: str
    fits_nowhere: bool = False


def plan_claims(
    ledger: PodLedger,
    decider: Decider,
    pod: Mapping[str, Any],
    asks: Mapping[str, Sequence[RequestAsk]],
    node: str | None,
) -> ClaimPlan | NoPlan:
    """Node and devices for the unallocated claims `asks` (claim key -> its requests); `node`: where the pod's
    other claims are allocated already (None: anywhere)."""
    try:
        base = request_from_pod(pod)
    except RequestError as exc:
        return NoPlan(f"the pod's request cannot be read: {exc}")
    if base.kind != Kind.NONE:
        return NoPlan("the pod asks for GPUs in its limits as well as through claims")
    mask, excluded = _candidates(ledger, pod, node)
    if not mask.any():
        return NoPlan(f"no DRA GPU node the pod may use ({_first(excluded) or 'none publishes GPUs'})", True)
    best: tuple[float, ClaimPlan] | None = None
    last_reason = "no combination of the requests' alternatives is one gpupack places"
    for combination in _combinations(asks):
        request = _request(base, [ask for _, ask in combination])
        if request is None:
            continue
        decision = decider.decide(request, (mask,), observe=False)
        placement = decision.placement
        if placement is None:
            last_reason = _first({**decision.reasons(), **decision.unresolvable()}) or "no node has room"
            continue
        score = decision.score_of(ledger.inventory.index[placement.node]) or 0.0
        if best is None or score > best[0]:
            plan = _devices(ledger, placement, combination)
            if isinstance(plan, NoPlan):  # this alternative only: the next may be published
                last_reason = plan.reason
                continue
            best = (score, plan)
    return best[1] if best is not None else NoPlan(f"no DRA node has room: {last_reason}", True)


def _candidates(ledger: PodLedger, pod: Mapping[str, Any], node: str | None) -> tuple[np.ndarray, dict[str, str]]:
    """The DRA nodes the pod may use, as a mask over inventory rows, and why others were left out."""
    inventory = ledger.inventory
    mask = np.zeros(inventory.size, dtype=np.bool_)
    excluded: dict[str, str] = {}
    for name in sorted(ledger.dra.dra_nodes()):
        row = inventory.index.get(name)
        why = "not in the inventory" if row is None else _why_not_here(ledger, pod, name, node)
        if why is not None:
            excluded[name] = why
        else:
            mask[row] = True
    return mask, excluded


def _why_not_here(ledger: PodLedger, pod: Mapping[str, Any], name: str, node: str | None) -> str | None:
    """Why the pod may not use the DRA node `name` (None: it may); `node`: where its other claims are."""
    if node is not None and name != node:
        return "not where the pod's other claims are"
    if name in ledger.bad:
        return ledger.bad[name]
    if name in ledger.cordoned:
        return "cordoned"
    return why_not(pod, ledger.dra.nodes.get(name) or {})


def _combinations(asks: Mapping[str, Sequence[RequestAsk]]) -> list[tuple[tuple[str, DeviceAsk], ...]]:
    """Every choice of one alternative per request (claim key, ask), in the claims' order; at most MAX_COMBINATIONS."""
    per_request = [
        [(claim, ask) for ask in request.alternatives] for claim, requests in asks.items() for request in requests
    ]
    return list(itertools.islice(itertools.product(*per_request), MAX_COMBINATIONS))


def _request(base: PodRequest, asks: Sequence[DeviceAsk]) -> PodRequest | None:
    """One PodRequest for all the asks: None when they mix whole GPUs and MIG, or ask for different products."""
    kinds = {ask.kind for ask in asks}
    products = {ask.product.replace(" ", "-") for ask in asks if ask.product}
    if len(kinds) != 1 or len(products) > 1:
        return None
    allowed = frozenset(products) if products else None
    try:
        if kinds == {Kind.WHOLE}:
            return replace(base, kind=Kind.WHOLE, gpus=sum(ask.count for ask in asks), allowed_products=allowed)
        counts: dict[str, int] = {}
        for ask in asks:
            counts[ask.profile] = counts.get(ask.profile, 0) + ask.count
        return replace(base, kind=Kind.MIG, mig=tuple(sorted(counts.items())), allowed_products=allowed)
    except RequestError:
        return None


def _devices(
    ledger: PodLedger, placement: Placement, combination: Sequence[tuple[str, DeviceAsk]]
) -> ClaimPlan | NoPlan:
    """The device the node publishes for each slot of the placement, handed to the asks in order."""
    gpus = ledger.dra.gpus(placement.node)
    if gpus is None:
        return NoPlan(f"node {placement.node} is no longer a DRA node")
    by_slot = {slot: key for key, slot in gpus.slots.items()}
    slots = list(placement.slots)
    devices: dict[str, list[ChosenDevice]] = {}
    for claim, ask in combination:
        for _ in range(ask.count):
            slot = next((s for s in slots if s.mig == ask.profile), None)
            key = by_slot.get(slot) if slot is not None else None
            if slot is None or key is None:
                return NoPlan(f"node {placement.node} publishes no device for {slot or ask.request}")
            slots.remove(slot)
            devices.setdefault(claim, []).append(ChosenDevice(ask.request, ask.device_class, key[1], key[2]))
    hold = Placement(placement.node, placement.slots, pod_slots=0)
    return ClaimPlan(placement.node, {claim: tuple(chosen) for claim, chosen in devices.items()}, hold)


def _first(reasons: Mapping[str, str]) -> str:
    return next((f"{name}: {why}" for name, why in sorted(reasons.items())), "")


__all__ = ["MAX_COMBINATIONS", "ClaimPlan", "NoPlan", "plan_claims"]
