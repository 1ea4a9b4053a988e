"""`gpupack explain --cluster-file F --pod P [--json]`: why a pod would go where, reserving nothing.

The cluster file is loaded into a `ClusterState` exactly as `serve --cluster-file` does (bound pods
consume capacity by the same rules); the pod is then decided against every node. Per node: verdict
(chosen / feasible / infeasible / unresolvable), the reason, and the policy score of feasible nodes.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from gpupack.extender.pod_request import pod_key
from gpupack.extender.settings import SettingsError, load_settings
from gpupack.extender.sources import ClusterFileSource, SourceError, load_cluster_objects
from gpupack.extender.state import ClusterState, Evaluation
from gpupack.scoring.reference import reference_decide


@dataclass(frozen=True)
class NodeVerdict:
    """One node's line of the explanation."""

    node: str
    verdict: str
    score: float | None
    reason: str
    parts: dict[str, float] = field(default_factory=dict)  # the terms of the gpupack score


def run(args: argparse.Namespace) -> int:
    """Print the explanation; 0 on success (placed or not), 2 on unusable input."""
    try:
        settings = load_settings(getattr(args, "config", None))
        pod = load_pod(args.pod)
        state = ClusterState(settings)
        ClusterFileSource(args.cluster_file, state.apply).start()
    except (SettingsError, SourceError, ValueError) as exc:
        print(f"gpupack explain: {exc}", file=sys.stderr)
        return 2
    report = explain(state, pod)
    if args.json:
        sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(render_text(report))
    return 0


def load_pod(path: str) -> dict[str, Any]:
    """The one Pod in a YAML/JSON file; ValueError otherwise."""
    pods = load_cluster_objects(path).pods
    if len(pods) != 1:
        raise ValueError(f"{path}: expected exactly one Pod, found {len(pods)}")
    return pods[0]


def explain(state: ClusterState, pod: dict[str, Any]) -> dict[str, Any]:
    """The explanation as a JSON-ready dict: pod, chosen node, placement, per-node verdicts."""
    evaluation = state.evaluate(pod)
    placement = evaluation.decision.placement if evaluation.decision else None
    parts = score_parts(state, evaluation)
    verdicts = [replace(v, parts=parts.get(v.node, {})) for v in node_verdicts(evaluation)]
    return {
        "pod": pod_key(pod),
        "error": evaluation.error or None,
        "chosen": placement.node if placement else None,
        "placement": placement.to_assignment() if placement else None,
        "nodes": [verdict.__dict__ for verdict in verdicts],
    }


def score_parts(state: ClusterState, evaluation: Evaluation) -> dict[str, dict[str, float]]:
    """The terms of each feasible node's gpupack score, from the plain-Python reference of the kernel."""
    parts: dict[str, dict[str, float]] = {}
    if evaluation.request is None or evaluation.decision is None:
        return parts
    with state.lock:
        reference_decide(
            state.inventory,
            state.engine.policy,
            evaluation.request,
            candidates=list(evaluation.decision.feasible_scores()),
            parts=parts,
        )
    return parts


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


def render_text(report: dict[str, Any]) -> str:
    """The explanation as a table for a terminal."""
    lines = [f"pod {report['pod']}"]
    if report["error"]:
        lines.append(f"request error: {report['error']}")
    if report["chosen"]:
        gpus = orjson.dumps(report["placement"]["gpus"]).decode()
        lines.append(f"chosen: {report['chosen']}  gpus: {gpus}")
    else:
        lines.append("chosen: none (no node fits)")
    width = max([len("NODE"), *(len(n["node"]) for n in report["nodes"])])
    lines.append(f"{'NODE':<{width}}  {'VERDICT':<12}  {'SCORE':>9}  REASON / SCORE PARTS")
    for n in report["nodes"]:
        score = "-" if n["score"] is None else f"{n['score']:.4f}"
        why = n["reason"] or "  ".join(f"{name} {value:+.3f}" for name, value in n["parts"].items())
        lines.append(f"{n['node']:<{width}}  {n['verdict']:<12}  {score:>9}  {why}".rstrip())
    return "\n".join(lines) + "\n"
