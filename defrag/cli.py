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
from typing import Any

import orjson

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
    if args.max_evictions < 0:
        raise ValueError("--max-evictions must be 0 or more")
    if args.execute and args.cluster_file:
        raise ValueError("--execute evicts pods of a live cluster, not of a cluster file")
    goals = [Goal(g) for g in args.goal] if args.goal else list(Goal)
    settings = report_settings(args.config)
    if args.cluster_file:
        snapshot = read_cluster_file(args.cluster_file, settings)
    else:
        snapshot = read_live_cluster(args.kubeconfig, settings)
    plan = plan_defrag(
        snapshot.state.inventory,
        residents(snapshot, args.namespace),
        pending(snapshot, args.namespace),
        snapshot.schedulable_nodes(),
        drain_policy(settings),
        goals,
        args.max_evictions,
    )
    return snapshot, plan


def _execute(args: argparse.Namespace, snapshot: ClusterSnapshot, plan: DefragPlan) -> Carried:
    """Carry the plan out on the live cluster the snapshot was read from."""
    api_client = load_kube_config(args.kubeconfig)
    uids = {pod_key(pod): str((pod.get("metadata") or {}).get("uid") or "") for pod in snapshot.pods.values()}
    return carry_out(plan, uids, OfficialEvictor(api_client), OfficialKubeApi(api_client))


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


__all__ = ["render", "run"]
