"""`gpupack defrag`: the move plan of a cluster (file or live), proven by simulation; dry run only (#31).

Prints the moves (text, or `--json`), each with its goal, the pods it would evict, where the simulation
placed each again and what the move gains; then the targets that got no move and why. Nothing is
evicted: carrying the plan out is not built yet (docs/defrag.md).

Exit codes: 0 printed; 2 unusable input (config, cluster file, kubeconfig, arguments).
"""

from __future__ import annotations

import argparse
import sys

import orjson

from gpupack.defrag.movable import pending, residents
from gpupack.defrag.plan import DefragPlan, Goal, plan_defrag
from gpupack.extender.settings import SettingsError
from gpupack.kube.sources import SourceError
from gpupack.report.build import drain_policy
from gpupack.report.snapshot import read_cluster_file, read_live_cluster, report_settings


def run(args: argparse.Namespace) -> int:
    """Run `gpupack defrag`."""
    try:
        if args.max_evictions < 0:
            raise ValueError("--max-evictions must be 0 or more")
        goals = [Goal(g) for g in args.goal] if args.goal else list(Goal)
        settings = report_settings(args.config)
        if args.cluster_file:
            snapshot = read_cluster_file(args.cluster_file, settings)
        else:
            snapshot = read_live_cluster(args.kubeconfig, settings)
        plan = plan_defrag(
            snapshot.state.inventory,
            residents(snapshot),
            pending(snapshot),
            snapshot.schedulable_nodes(),
            drain_policy(settings),
            goals,
            args.max_evictions,
        )
    except (SettingsError, SourceError, ValueError) as exc:
        print(f"gpupack defrag: {exc}", file=sys.stderr)
        return 2
    if args.json:
        sys.stdout.write(orjson.dumps({"dry_run": True, **plan.to_json()}, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(render(plan))
    return 0


def render(plan: DefragPlan) -> str:
    """The plan as text: one block per move, then the targets without one."""
    lines = [f"gpupack defrag (dry run): {len(plan.moves)} moves, {plan.evictions} evictions"]
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
    return "\n".join(lines) + "\n"


def _slots(assignment: dict[str, object]) -> str:
    return orjson.dumps(assignment["gpus"]).decode()


__all__ = ["render", "run"]
