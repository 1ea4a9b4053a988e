"""`gpupack explain`: why a pod would go where, reserving nothing.

Two sources (`extender.explain_source`): a live cluster (`--kubeconfig`, else kubectl's kubeconfig,
else in-cluster; the pod as NAMESPACE/NAME) or a cluster file and a one-pod file (`--cluster-file F
--pod P`). Either fills a `ClusterState` as `gpupack serve` does, and the pod is decided against every
node. Per node: verdict (chosen / feasible / infeasible / unresolvable), the reason, the policy score
and its parts, and the node's GPUs out of service (unhealthy or cordoned: nothing new goes on them; an
infeasible node's reason names them); then the winner, the runner-up and the part that made the difference.
A pod that fits nowhere is also explained as the preempt verb would answer for it (#28): on each node,
the pods gpupack would evict (the cheapest set by `scoring.preemption`'s rule) and the placement that
frees, cheapest node first, or why no set works there. A group member (#29) gets its group: members, and
the group's plan or why it has none (extender.explain_group). A pod with ResourceClaims (#30) gets its claims:
each one's allocation, and gpupack's plan for the others or why kube-scheduler allocates them
(extender.explain_claims); its node table is then the claims' node, where kube-scheduler must put it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import orjson

from gpupack.extender.decisions import Evaluation
from gpupack.extender.explain_claims import JsonObject, claims_node, claims_section, claims_text
from gpupack.extender.explain_group import group_section, group_text
from gpupack.extender.explain_source import Loaded, load_from_cluster, load_from_files
from gpupack.extender.settings import SettingsError, load_settings
from gpupack.extender.state import ClusterState
from gpupack.kube.node_usage import Exclusion
from gpupack.kube.pods import pod_key, pod_priority
from gpupack.kube.sources import SourceError
from gpupack.scoring.explain_parts import score_parts
from gpupack.scoring.preemption import Occupant, VictimPlan, plan_cost

NO_PLAN = "evicting every pod of lower priority here would not make room"


@dataclass(frozen=True)
class NodeVerdict:
    """One node's line of the explanation."""

    node: str
    verdict: str
    score: float | None
    reason: str
    parts: dict[str, float] = field(default_factory=dict)  # the terms of the gpupack score
    excluded_gpus: list[dict[str, Any]] = field(default_factory=list)  # {"index", "reason"}: out of service


def run(args: argparse.Namespace) -> int:
    """Print the explanation; 0 on success (placed or not), 2 on unusable input."""
    try:
        loaded = load(args)
    except (SettingsError, SourceError, ValueError) as exc:
        print(f"gpupack explain: {exc}", file=sys.stderr)
        return 2
    report = explain(loaded.state, loaded.pod, loaded.claims)
    report["source"] = loaded.source
    if args.json:
        sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(render_text(report))
    return 0


def load(args: argparse.Namespace) -> Loaded:
    """The cluster and the pod the arguments name (file mode with --cluster-file, else a live cluster)."""
    settings = load_settings(getattr(args, "config", None))
    positional = getattr(args, "pod_ref", None)
    if args.pod and positional and args.pod != positional:
        raise ValueError(f"two pods named: {positional!r} and --pod {args.pod!r}")
    pod = args.pod or positional
    if not pod:
        raise ValueError("name the pod: NAMESPACE/NAME (live cluster), or --cluster-file F --pod FILE")
    if args.cluster_file:
        return load_from_files(settings, args.cluster_file, pod)
    return load_from_cluster(settings, args.kubeconfig, pod, getattr(args, "namespace", None))


def explain(state: ClusterState, pod: dict[str, Any], claims: dict[str, JsonObject] | None = None) -> dict[str, Any]:
    """The explanation as a JSON-ready dict: pod, where it is bound (if it is), chosen node and
    placement, the winner's margin over the runner-up, per-node verdicts; `claims`: the cluster's
    ResourceClaims by `namespace/name`, for a pod that uses some."""
    claimed = claims_section(state, pod, claims or {})
    node = claims_node(claimed)
    evaluation = state.evaluate(pod, [node] if node else None)
    placement = evaluation.decision.placement if evaluation.decision else None
    parts = parts_of(state, evaluation)
    excluded = state.excluded_gpus()
    verdicts = [
        with_exclusions(NodeVerdict(**{**asdict(v), "parts": parts.get(v.node, {})}), excluded.get(v.node, ()))
        for v in node_verdicts(evaluation)
    ]
    fits_nowhere = evaluation.decision is not None and placement is None
    preempting = preemption(state, pod, [v.node for v in verdicts]) if fits_nowhere else None
    return {
        "pod": pod_key(pod),
        "bound_to": (pod.get("spec") or {}).get("nodeName") or None,
        "error": evaluation.error or None,
        "chosen": placement.node if placement else None,
        "placement": placement.to_assignment() if placement else None,
        "runner_up": runner_up(verdicts),
        "nodes": [asdict(verdict) for verdict in verdicts],
        "preemption": preempting,
        "group": group_section(state, pod, evaluation.request),
        "claims": claimed,
    }


def preemption(state: ClusterState, pod: dict[str, Any], nodes: list[str]) -> dict[str, Any]:
    """What the preempt verb would answer for `pod` on every node: its victims there, cheapest node first.
    Explain's state is its own: the plans it remembers for nominations go nowhere."""
    plans = state.preemptions.plan(pod, nodes)
    ranked = sorted(plans.values(), key=lambda plan: (plan_cost(plan.victims), plan.node))
    return {
        "priority": pod_priority(pod),
        "nodes": [plan_entry(plan) for plan in ranked],
        "no_plan": {node: NO_PLAN for node in nodes if node not in plans},
    }


def plan_entry(plan: VictimPlan) -> dict[str, Any]:
    """One node's plan: the victims with what made them cheap, and where the pod would go."""
    return {
        "node": plan.node,
        "victims": [victim_entry(victim) for victim in plan.victims],
        "placement": plan.placement.to_assignment(),
    }


def victim_entry(victim: Occupant) -> dict[str, Any]:
    """A victim as the rule weighs it (PDB first, then priority, interruptible first, then GPU-time)."""
    return {
        "pod": victim.key,
        "priority": victim.priority,
        "interruptible": victim.interruptible,
        "breaks_budget": victim.breaks_budget,
        "gpu_seconds": round(victim.gpu_seconds, 1),
    }


def parts_of(state: ClusterState, evaluation: Evaluation) -> dict[str, dict[str, float]]:
    """The terms of each feasible node's score, by the engine's own kernel (`scoring.explain_parts`)."""
    if evaluation.request is None or evaluation.decision is None:
        return {}
    with state.lock:
        candidates = np.zeros(state.inventory.size, dtype=np.bool_)
        candidates[evaluation.decision.rows] = True
        return score_parts(state.inventory, state.decider.policy, evaluation.request, candidates)


def node_verdicts(evaluation: Evaluation) -> list[NodeVerdict]:
    """Chosen first, then feasible nodes by score, then infeasible and unresolvable ones by name."""
    verdicts: list[NodeVerdict] = []
    decision = evaluation.decision
    if decision is not None:
        chosen = decision.node
        for node, score in sorted(decision.feasible_scores().items(), key=lambda kv: (kv[0] != chosen, -kv[1])):
            verdicts.append(NodeVerdict(node, "chosen" if node == chosen else "feasible", score, ""))
        for node, reason in sorted(decision.reasons().items()):
            verdicts.append(NodeVerdict(node, "infeasible", None, reason))
    for node, reason in sorted(evaluation.unresolvable.items()):
        verdicts.append(NodeVerdict(node, "unresolvable", None, reason))
    return verdicts


def with_exclusions(verdict: NodeVerdict, exclusions: Sequence[Exclusion]) -> NodeVerdict:
    """The verdict with the node's GPUs out of service; an infeasible or unresolvable node's reason names them."""
    if not exclusions:
        return verdict
    listed = [{"index": e.index, "reason": e.reason} for e in exclusions]
    reason = verdict.reason
    if reason:
        named = "; ".join(f"GPU {e.index} {e.reason}" for e in exclusions)
        reason = f"{reason} (out of service, nothing new goes there: {named})"
    return replace(verdict, reason=reason, excluded_gpus=listed)


def runner_up(verdicts: list[NodeVerdict]) -> dict[str, Any] | None:
    """The best feasible node after the chosen one: its margin, each part's difference (winner minus
    runner-up, largest first) and the part that made the difference (the largest in the winner's
    favour). None unless a node was chosen and another was feasible."""
    if len(verdicts) < 2 or verdicts[0].verdict != "chosen" or verdicts[1].verdict != "feasible":
        return None
    winner, second = verdicts[0], verdicts[1]
    assert winner.score is not None and second.score is not None
    names = list(dict.fromkeys([*winner.parts, *second.parts]))
    differences = {name: winner.parts.get(name, 0.0) - second.parts.get(name, 0.0) for name in names}
    differences = dict(sorted(differences.items(), key=lambda kv: -kv[1]))
    margin = winner.score - second.score
    deciding = next((name for name, diff in differences.items() if diff > 0.0), None) if margin > 0.0 else None
    return {"node": second.node, "margin": margin, "deciding_part": deciding, "differences": differences}


def render_text(report: dict[str, Any]) -> str:
    """The explanation as a table for a terminal."""
    lines = [f"pod {report['pod']}" + (f"  (bound to {report['bound_to']}; explained as if placed now)"
                                        if report["bound_to"] else "")]  # fmt: skip
    if report["error"]:
        lines.append(f"request error: {report['error']}")
    if report["chosen"] and report.get("claims") and not report["placement"]["gpus"]:
        lines.append(f"chosen: {report['chosen']}  (its GPUs come through its claims, below)")
    elif report["chosen"]:
        gpus = orjson.dumps(report["placement"]["gpus"]).decode()
        lines.append(f"chosen: {report['chosen']}  gpus: {gpus}")
    else:
        lines.append("chosen: none (" + ("no node fits)" if report["nodes"] else "the cluster holds no nodes)"))
    lines.append(why_text(report))
    width = max([len("NODE"), *(len(n["node"]) for n in report["nodes"])])
    lines.append(f"{'NODE':<{width}}  {'VERDICT':<12}  {'SCORE':>9}  REASON / SCORE PARTS")
    for n in report["nodes"]:
        score = "-" if n["score"] is None else f"{n['score']:.4f}"
        why = n["reason"] or "  ".join(f"{name} {value:+.3f}" for name, value in n["parts"].items())
        lines.append(f"{n['node']:<{width}}  {n['verdict']:<12}  {score:>9}  {why}".rstrip())
    lines += preemption_text(report.get("preemption"))
    lines += group_text(report.get("group"))
    lines += claims_text(report.get("claims"))
    return "\n".join(line for line in lines if line) + "\n"


def preemption_text(preempting: dict[str, Any] | None) -> list[str]:
    """The lines of what preemption would evict, cheapest node first ([] when the pod fits somewhere)."""
    if preempting is None:
        return []
    lines = [f"if it preempts (priority {preempting['priority']}), cheapest node first:"]
    for plan in preempting["nodes"]:
        gpus = orjson.dumps(plan["placement"]["gpus"]).decode()
        lines.append(f"  {plan['node']}: evict {len(plan['victims'])}, then gpus: {gpus}")
        lines += [f"    {victim_text(victim)}" for victim in plan["victims"]]
    lines += [f"  {node}: {why}" for node, why in preempting["no_plan"].items()]
    return lines


def victim_text(victim: dict[str, Any]) -> str:
    """One victim and what made it cheap."""
    traits = [f"priority {victim['priority']}", f"{victim['gpu_seconds']:.0f} GPU-seconds"]
    if victim["interruptible"]:
        traits.insert(1, "interruptible")
    if victim["breaks_budget"]:
        traits.insert(0, "breaks a PodDisruptionBudget")
    return f"{victim['pod']} ({', '.join(traits)})"


def why_text(report: dict[str, Any]) -> str:
    """One line: why the chosen node beat the runner-up ("" when nothing was chosen)."""
    if not report["chosen"]:
        return ""
    second = report["runner_up"]
    if second is None:
        return f"why: {report['chosen']} is the only feasible node"
    if second["margin"] <= 0.0:
        return f"why: {report['chosen']} ties with {second['node']} on score; the tie order decided"
    shown = [(name, diff) for name, diff in second["differences"].items() if abs(diff) >= 5e-4]
    detail = " (" + ", ".join(f"{name} {diff:+.3f}" for name, diff in shown) + ")" if shown else ""
    decided = f"; {second['deciding_part']} made the difference" if second["deciding_part"] else ""
    return f"why: {report['chosen']} beat {second['node']} by {second['margin']:.4f}{detail}{decided}"
