"""`gpupack defrag`: the move plan of a cluster (file or live), proven by simulation; `--execute` carries it out (#31).

Prints the moves (text, or `--json`), each with its goal, the pods it would evict, where the simulation
placed each again and what the move gains; then the targets that got no move and why. A dry run unless
`--execute` (a live cluster only): then the planned pods are evicted through the Eviction API
(`defrag.execute`) and the outcome of each eviction is printed too.

Exit codes: 0 printed (and, with `--execute`, every eviction done or its pod gone already); 1 an eviction was
refused, so the run stopped; 2 unusable input (config, cluster file, kubeconfig, arguments).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Collection
from typing import Any

import orjson
from kubernetes.client import ApiClient

from gpupack.defrag.evictions import OfficialEvictor
from gpupack.defrag.execute import Carried, carry_out
from gpupack.defrag.movable import pending, residents
from gpupack.extender.settings import SettingsError
from gpupack.kube.pods import pod_key
from gpupack.kube.sources import OfficialKubeApi, SourceError, load_kube_config
from gpupack.report.build import drain_policy
from gpupack.report.snapshot import ClusterSnapshot, read_cluster_file, read_live_cluster, report_settings
from gpupack.scoring.defrag import DefragPlan, Goal, plan_defrag


def run(args: argparse.Namespace) -> int:
    """Run `gpupack defrag`."""
    try:
        snapshot, plan = _plan(args)
        carried = _execute(args, snapshot, plan) if args.execute else None
    except (SettingsError, SourceError, ValueError) as exc:
        print(f"gpupack defrag: {exc}", file=sys.stderr)
        return 2
    if args.json:
        out: dict[str, Any] = {"dry_run": carried is None, **plan.to_json()}
        if carried is not None:
            out["carried_out"] = carried.to_json()
        sys.stdout.write(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(render(plan, carried))
    return 1 if carried is not None and carried.stopped else 0


def _plan(args: argparse.Namespace) -> tuple[ClusterSnapshot, DefragPlan]:
    check_arguments(args)
    settings = report_settings(args.config)
    if args.cluster_file:
        snapshot = read_cluster_file(args.cluster_file, settings)
    else:
        snapshot = read_live_cluster(args.kubeconfig, settings)
    return snapshot, plan_snapshot(args, snapshot, args.max_evictions)


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse arguments that contradict each other (ValueError)."""
    if args.max_evictions < 0:
        raise ValueError("--max-evictions must be 0 or more")
    if args.execute and args.cluster_file:
        raise ValueError("--execute evicts pods of a live cluster, not of a cluster file")


def plan_snapshot(
    args: argparse.Namespace, snapshot: ClusterSnapshot, max_evictions: int, not_for: Collection[str] = ()
) -> DefragPlan:
    """The plan for the snapshot by the arguments' goals and namespace; no move for the pending pods `not_for`."""
    goals = [Goal(g) for g in args.goal] if args.goal else list(Goal)
    return plan_defrag(
        snapshot.state.inventory,
        residents(snapshot, args.namespace),
        [p for p in pending(snapshot, args.namespace) if p.key not in not_for],
        snapshot.schedulable_nodes(),
        drain_policy(snapshot.state.settings),
        goals,
        max_evictions,
    )


def _execute(args: argparse.Namespace, snapshot: ClusterSnapshot, plan: DefragPlan) -> Carried:
    """Carry the plan out on the live cluster the snapshot was read from."""
    return carry_plan(load_kube_config(args.kubeconfig), snapshot, plan)


def carry_plan(
    api_client: ApiClient, snapshot: ClusterSnapshot, plan: DefragPlan, may_move: Callable[[int], bool] | None = None
) -> Carried:
    """Carry the plan out through `api_client` on the cluster the snapshot was read from (`defrag.execute`)."""
    uids = {pod_key(pod): str((pod.get("metadata") or {}).get("uid") or "") for pod in snapshot.pods.values()}
    evictor, events = OfficialEvictor(api_client), OfficialKubeApi(api_client)
    if may_move is None:
        return carry_out(plan, uids, evictor, events)
    return carry_out(plan, uids, evictor, events, may_move=may_move)


def render(plan: DefragPlan, carried: Carried | None = None) -> str:
    """The plan as text: one block per move, the targets without one, then what was carried out."""
    mode = "dry run" if carried is None else "executed"
    lines = [f"gpupack defrag ({mode}): {len(plan.moves)} moves, {plan.evictions} evictions"]
    lines += [""] if plan.moves else []
    for number, move in enumerate(plan.moves, 1):
        lines.append(
            f"{number}. {move.goal.value} {move.target}: {move.gain} ({move.gpu_seconds:.0f} GPU-seconds lost)"
        )
        if move.placement is not None:
            lines.append(f"   the pod goes to {move.placement.node} {_slots(move.placement.to_assignment())}")
        for eviction in move.evictions:
            to = eviction.to
            lines.append(f"   evict {eviction.pod} on {eviction.node} -> {to.node} {_slots(to.to_assignment())}")
    if plan.skipped:
        lines += ["", "no move:"]
        lines += [f"   {target}: {why}" for target, why in sorted(plan.skipped.items())]
    if carried is not None:
        lines += ["", "carried out:"]
        lines += [f"   {outcome.value} {pod}" for pod, outcome in carried.outcomes]
        lines += [f"   {target}: gone before its move, nothing evicted for it" for target in carried.targets_gone]
        lines += [f"   {carried.stopped}"] if carried.stopped else []
    return "\n".join(lines) + "\n"


def _slots(assignment: dict[str, object]) -> str:
    return orjson.dumps(assignment["gpus"]).decode()


__all__ = ["carry_plan", "check_arguments", "plan_snapshot", "render", "run"]
