"""The report of one cluster snapshot as a JSON-ready dict (docs/contracts.md#report-json).

Keys of the original design: `total_hourly_cost`, `unallocated_hourly_cost`, `by_namespace` ($/h,
split allocation), `pools`, `drain_plan`. Beyond them: `by_label` ($/h per value of each `--by` label),
`window` (GPU-hours and cost over `--hours`, per namespace and label value), `pods`, `kept` (nodes
tried for draining and why they stay), `unpriced_nodes` and `unusable_nodes`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpupack.extender.settings import Settings
from gpupack.kube.pod_request import request_from_pod
from gpupack.kube.pods import is_daemon_pod, pod_key
from gpupack.kube.sources import JsonObject
from gpupack.report.drain import DEFAULT_LIMIT, plan_drains
from gpupack.report.snapshot import ClusterSnapshot
from gpupack.scoring.cost import Bill, placement_gpus, split_costs
from gpupack.scoring.defrag import Resident
from gpupack.scoring.policies import PolicySpec, gpupack
from gpupack.scoring.pools import PoolTotals
from gpupack.scoring.request import PodRequest, RequestError

NO_LABEL = "(none)"


def build_report(
    snapshot: ClusterSnapshot,
    settings: Settings,
    by_labels: Sequence[str] = (),
    hours: float = 1.0,
    drain_limit: int = DEFAULT_LIMIT,
) -> dict[str, Any]:
    """Pools, split cost by namespace and label, and the drain plan of a snapshot."""
    state = snapshot.state
    with state.lock:
        inventory = state.inventory
        pods = held_capacity(snapshot)
        gpus = {pod.key: placement_gpus(inventory, pod.placement) for pod in pods}
        shares: dict[str, dict[str, float]] = {}
        for pod in pods:
            shares.setdefault(pod.placement.node, {})[pod.key] = gpus[pod.key]
        prices = sorted((facts.name, facts.hourly_cost) for facts in inventory.facts if facts is not None)
        hourly = split_costs(prices, shares)
        window = split_costs(prices, shares, hours)
        pools = PoolTotals(inventory).pools()
        plan = plan_drains(inventory, pods, snapshot.schedulable_nodes(), drain_policy(settings), drain_limit)
        unusable = state.bad_nodes()
    objects = {pod_key(obj): obj for obj in snapshot.pods.values()}
    namespace = {pod.key: pod.key.split("/", 1)[0] for pod in pods}
    labels = {name: {pod.key: _label(objects.get(pod.key), name) for pod in pods} for name in by_labels}
    gpu_hours = {key: held * hours for key, held in gpus.items()}
    return {
        "total_hourly_cost": _dollars(hourly.total_cents),
        "unallocated_hourly_cost": _dollars(hourly.unallocated_cents),
        "by_namespace": _grouped(hourly, namespace),
        "by_label": {name: _grouped(hourly, groups) for name, groups in labels.items()},
        "window": {
            "hours": hours,
            "total_cost": _dollars(window.total_cents),
            "unallocated_cost": _dollars(window.unallocated_cents),
            "by_namespace": _usage(window, namespace, gpu_hours),
            "by_label": {name: _usage(window, groups, gpu_hours) for name, groups in labels.items()},
        },
        "pools": [
            {"product": key.product, "capacity_type": key.capacity_type, **_pool_json(figures)}
            for key, figures in pools.items()
        ],
        "drain_plan": [drain.to_json() for drain in plan.drains],
        "drain_saves_hourly": plan.saves_hourly,
        "kept": plan.kept,
        "pods": [
            {"pod": p.key, "node": p.placement.node, "gpus": round(gpus[p.key], 4),
             "hourly_cost": _dollars(hourly.pod_cents[p.key])}
            for p in sorted(pods, key=lambda p: p.key)
        ],
        "unpriced_nodes": hourly.unpriced_nodes,
        "unusable_nodes": unusable,
    }


def held_capacity(snapshot: ClusterSnapshot) -> list[Resident]:
    """Every pod that holds capacity now, with its request (None: unreadable) and whether it is a DaemonSet's;
    the drain plan may move any of them (report.drain)."""
    placements = snapshot.state.placements()
    pods: list[Resident] = []
    for ident, obj in snapshot.pods.items():
        placement = placements.get(ident)
        if placement is None:
            continue  # pending, or bound but holding nothing yet
        try:
            request: PodRequest | None = request_from_pod(obj)
        except RequestError:
            request = None
        pods.append(Resident(pod_key(obj), placement, request, daemon=is_daemon_pod(obj)))
    return pods


def drain_policy(settings: Settings) -> PolicySpec:
    """The policy drains are planned with: the configured one, with spot forbidden to non-interruptible pods."""
    if settings.policy.name != "gpupack":
        return settings.policy_spec()
    return gpupack(settings.gpupack_args().model_copy(update={"forbid_spot_for_non_interruptible": True}))


def _label(pod: JsonObject | None, name: str) -> str:
    labels = ((pod or {}).get("metadata") or {}).get("labels") or {}
    value = labels.get(name) if isinstance(labels, Mapping) else None
    return value if isinstance(value, str) and value else NO_LABEL


def _dollars(cents: int) -> float:
    return round(cents / 100, 2)


def _grouped(bill: Bill, group_of: Mapping[str, str]) -> dict[str, float]:
    return {group: _dollars(cents) for group, cents in bill.by_group(group_of).items()}


def _usage(bill: Bill, group_of: Mapping[str, str], gpu_hours: Mapping[str, float]) -> dict[str, dict[str, float]]:
    hours: dict[str, float] = {}
    for pod, group in group_of.items():
        hours[group] = hours.get(group, 0.0) + gpu_hours[pod]
    return {
        group: {"gpu_hours": round(hours.get(group, 0.0), 4), "cost": _dollars(cents)}
        for group, cents in bill.by_group(group_of).items()
    }


def _pool_json(figures: Mapping[str, float]) -> dict[str, float | int]:
    return {
        "nodes": int(figures["nodes"]),
        "gpus": int(figures["gpus"]),
        "gpus_allocated": round(figures["gpus_allocated"], 4),
        "allocated_pct": round(100 * figures["gpus_allocated"] / figures["gpus"], 2) if figures["gpus"] else 0.0,
        "idle_gpus": round(figures["idle_gpus"], 4),
        "idle_hourly_cost": round(figures["idle_hourly_cost"], 2),
        "free_mig_slices": int(figures["free_mig_slices"]),
        "stranded_mig_slices": int(figures["stranded_mig_slices"]),
        "hourly_cost": round(figures["hourly_cost"], 2),
        "empty_nodes": int(figures["empty_nodes"]),
        "empty_hourly_cost": round(figures["empty_hourly_cost"], 2),
    }
